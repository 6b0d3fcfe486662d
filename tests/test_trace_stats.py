"""ValueStats.measure: its shortcuts (bounds that rule counts out, large values taken a chunk at a time, scratch
buffers) give exactly the counts of a plain element-by-element computation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from precaudit.dtypes import FORMATS
from precaudit.trace import stats as stats_module
from precaudit.trace.meter import _local_floor
from precaudit.trace.stats import InputStats, ValueStats


def plain_counts(ref: np.ndarray, emu: np.ndarray, fmt, noise_floor: float, floor=None) -> tuple:
    """The counts by their definitions, every element looked at (floor: a per-element noise floor, or None)."""
    finite = np.isfinite(ref)
    a = np.where(finite, np.abs(ref), 0)
    tiny = (a > 0) & (a < fmt.smallest_normal)
    floor = np.full(ref.shape, noise_floor) if floor is None else floor
    noise = tiny & (a <= floor) if noise_floor > 0 else np.zeros(ref.shape, bool)
    underflow = tiny & (a > floor) & (a <= fmt.smallest_subnormal / 2)
    both = np.isfinite(emu) & finite
    error = np.abs(np.where(both, emu, 0) - np.where(both, ref, 0))
    return (ref.size, int((~finite).sum()), float(a.max()) if a.size else 0.0,
            int((a >= fmt.overflow_threshold).sum()), int((a != 0).sum()), int(underflow.sum()),
            int(tiny.sum() - underflow.sum() - noise.sum()), float(a[a > 0].min()) if (a > 0).any() else math.inf,
            int((~np.isfinite(emu)).sum()), float(error.max()) if error.size else 0.0, int(np.isnan(ref).sum()))


def _arrays():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((40, 25)).astype(np.float32)
    emu = (x * (1 + 1e-3 * rng.standard_normal(x.shape))).astype(np.float32)
    cases = {"normal": (x, emu), "empty": (x[:0], emu[:0]), "0-d": (x[0, 0].reshape(()), emu[0, 0].reshape(())),
             "all zeros": (np.zeros_like(x), np.zeros_like(x)), "negative zeros": (-np.zeros_like(x), emu),
             "positive": (np.abs(x) + 1, np.abs(emu) + 1)}
    tiny = x.copy()
    tiny.flat[:8] = [0.0, -0.0, 1e-45, -1e-40, 2e-8, 2.9802322e-08, 5.96e-8, 1e-6]  # zeros, float32 subnormals,
    cases["tiny values"] = (tiny, emu)  # ...under half fp16's smallest subnormal, at it, among fp16's subnormals
    zeros = np.abs(x) + 1
    zeros.flat[::7] = 0
    cases["zeros, nothing else small"] = (zeros, emu)
    big = x * 1e4
    big.flat[3] = 65519.0  # rounds to 65504 in fp16
    big.flat[4] = -65520.0  # rounds to -inf
    cases["overflow"] = (big, big)
    for name, value in (("inf", np.inf), ("-inf", -np.inf), ("NaN", np.nan)):
        bad = x.copy()
        bad.flat[5] = value
        cases[f"reference {name}"] = (bad, emu)
        bad_emu = emu.copy()
        bad_emu.flat[6] = value
        cases[f"emulated {name}"] = (x, bad_emu)
    cases["float64 reference"] = (tiny.astype(np.float64), emu)
    return cases


CASES = _arrays()


def same(a: tuple, b: tuple) -> bool:
    """Equal number for number, and in sign too (-0.0 is not 0.0 in a report)."""
    return repr([float(v) for v in a]) == repr([float(v) for v in b])


@pytest.fixture(params=["whole", 100, 333])
def chunk(request, monkeypatch):
    """Values measured whole (the test's arrays are below two chunks) or chunk by chunk: chunks that divide the
    test's sizes (1,000 and 300 elements) and one that leaves a short last chunk."""
    if request.param != "whole":
        monkeypatch.setattr(stats_module, "_CHUNK", request.param)
    return request.param


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
@pytest.mark.parametrize("noise_floor", [0.0, 1e-9, 1e-3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_measure_gives_the_plain_counts(case, noise_floor, fmt, chunk):
    ref, emu = CASES[case]
    stats = ValueStats(FORMATS[fmt])
    expected = plain_counts(ref, emu, FORMATS[fmt], noise_floor)
    assert same(stats.measure(ref, emu, noise_floor), expected)
    assert same(stats.measure(ref, emu, noise_floor), expected)  # the scratch buffers again, reused


@pytest.mark.parametrize("case", ["tiny values", "normal", "0-d", "reference NaN", "zeros, nothing else small"])
def test_measure_with_a_local_floor_gives_the_plain_counts(case, chunk):
    """An elementwise Add's noise floor, element by element from its inputs (one of them broadcast)."""
    ref, emu = CASES[case]
    lhs = (ref * 3).astype(np.float32)
    rhs = np.float32(2e-3) if ref.ndim == 0 else np.full(ref.shape[-1:], 2e-3, np.float32)

    class Step:
        class node:
            op_type = "Add"

    floor = _local_floor(Step, [lhs, rhs])
    fmt = FORMATS["fp16"]
    per_element = 1e-5 * np.maximum(np.abs(lhs), np.abs(np.broadcast_to(rhs, ref.shape)))
    expected = plain_counts(ref, emu, fmt, 1e-9, per_element)
    assert same(ValueStats(fmt).measure(ref, emu, 1e-9, floor), expected)


def plain_input_stats(samples: list) -> list:
    """InputStats' fields by their definitions, every element looked at, over samples of (ref, emu, emu_out)."""
    fields = [0, -math.inf, math.inf, math.inf, 0, 0, 0, 0, 0]
    for ref, emu, out in samples:
        fields[0] += ref.size
        finite = ref[np.isfinite(ref)]
        if finite.size:
            fields[1:4] = max(fields[1], float(finite.max())), min(fields[2], float(finite.min())), \
                min(fields[3], float(np.abs(finite).min()))
        fields[4:] = (fields[4] + int((emu == 0).sum()), fields[5] + int((emu < 0).sum()),
                      fields[6] + int((ref == 0).sum()), fields[7] + int((ref < 0).sum()),
                      fields[8] + int((~np.isfinite(out)).sum()))
    return fields


def _input_cases():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 50)).astype(np.float32)
    cases = {"mixed": x, "positive": np.abs(x) + 0.5, "negative": -np.abs(x) - 0.5, "empty": x[:0],
             "0-d": np.float32(-2.5).reshape(()), "all zeros": np.zeros_like(x), "negative zeros": -np.zeros_like(x)}
    zeros = np.abs(x)
    zeros.flat[::9] = 0
    cases["positive with zeros"] = zeros
    cases["negative with -0.0"] = np.where(x < 0, x, -0.0).astype(np.float32)
    for name, value in (("inf", np.inf), ("-inf", -np.inf), ("NaN", np.nan)):
        bad = x.copy()
        bad.flat[4] = value
        cases[name] = bad
    cases["only NaN"] = np.full((3,), np.nan, np.float32)
    return cases


INPUT_CASES = _input_cases()


@pytest.mark.parametrize("case", sorted(INPUT_CASES))
def test_input_stats_give_the_plain_counts(case, chunk):
    """Two samples folded in (the second the first's negation, so signs and extremes move), the emulated input
    rounded to fp16 (zeros and signs of its own) and an output with an inf where the input has a NaN or inf."""
    ref = INPUT_CASES[case]
    samples = []
    for sample in (ref, -ref):
        emu = sample.astype(np.float16).astype(np.float32)
        out = np.where(np.isfinite(sample), np.exp(np.minimum(sample, 10)), np.inf).astype(np.float32)
        samples.append((sample, emu, out))
    stats = InputStats()
    for sample in samples:
        stats.add(*sample)
    got = [stats.elements, stats.max, stats.min, stats.min_abs, stats.zero, stats.negative, stats.ref_zero,
           stats.ref_negative, stats.output_nonfinite]
    assert repr([float(v) for v in got]) == repr([float(v) for v in plain_input_stats(samples)])
