"""The checks: what each scale's counts, each unit's shapes and dtypes, and the config say is wrong.

Severities follow what a user gets: a NaN, inf or negative scale is always an error; a zero or subnormal block
scale is a warning (an all-zero block of weights has amax 0 and a zero scale legitimately), but a zero or
subnormal global, per-tensor or activation scale is an error (the whole tensor is 0, or 1/0 = inf where a loader
inverts it).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from .config import QuantConfig
from .findings import ScaleFinding, ScaleTensor
from .header import TensorInfo
from .layouts import Unit, sibling_pattern
from .values import unravel

__all__ = ["config_findings", "sibling_findings", "unit_findings", "value_findings"]

FP4_FP8 = 6 * 448  # the largest E2M1 value times the largest E4M3 value: NVFP4's global scale divides amax by it
_WHOLE = ("global", "input", "kv")  # one number for a whole tensor (or one per expert)
_ROLE_WORDS = {"block": "block scales", "scale": "weight scales", "global": "global scale entries",
               "input": "activation scale entries", "kv": "KV-cache scale entries", "smooth": "smoothing factors"}
# what a role's scale acts on, and whether that is plural (for the verb)
_EFFECT = {"block": ("the blocks they scale", True), "scale": ("the weights they scale", True),
           "global": ("the whole weight", False), "input": ("the activations it scales", True),
           "kv": ("the KV cache it scales", False), "smooth": ("the channels they scale", True)}
_FLOAT = ("F16", "BF16", "F32", "F64")
_INPUT_LEAF = {"modelopt-nvfp4": "input_scale", "modelopt-fp8": "input_scale", "compressed-tensors-fp8": "input_scale",
               "compressed-tensors-nvfp4": "input_global_scale", "int8": "input_scale"}


def _finding(rule: str, severity: str, at: ScaleTensor | TensorInfo, message: str, **values: Any) -> ScaleFinding:
    tensor = at.tensor if isinstance(at, ScaleTensor) else at
    return ScaleFinding(rule, severity, tensor.name, tensor.file, message, values)


def value_findings(st: ScaleTensor) -> Iterator[ScaleFinding]:
    """SC101-SC104 from one scale tensor's counts."""
    c = st.counts
    if c is None or not c.count:
        return
    whole = st.role in _WHOLE or (st.role == "scale" and st.tensor.numel == 1)
    what = f"{c.count:,} {_ROLE_WORDS.get(st.role, 'scale entries')} ({st.decode})"

    def first(kind: str) -> str:
        at = unravel(c.first[kind], st.tensor.shape) if kind in c.first else []
        return f", the first at {at}" if at else ""

    counts = {"count": c.count, "nan": c.nan, "inf": c.inf, "zero": c.zero, "subnormal": c.subnormal,
              "negative": c.negative}
    effect, plural = _EFFECT.get(st.role, ("what they scale", False))
    s = "" if plural else "s"
    if c.nan or c.inf:
        kinds = " and ".join(f"{n:,} {k}" for n, k in ((c.nan, "NaN"), (c.inf, "inf")) if n)
        yield _finding("SC101", "error", st, f"{kinds} of {what}{first('nan' if c.nan else 'inf')}: {effect} "
                                             f"dequantize{s} to NaN or inf", **counts)
    if c.negative:
        yield _finding("SC102", "error", st, f"{c.negative:,} negative of {what}{first('negative')}: {effect} "
                                             f"flip{s} sign", **counts)
    if c.zero:
        consequence = ("everything it scales is 0, or inf where a loader divides by it" if whole
                       else f"{effect} dequantize{s} to 0 (right only where those weights are all 0)")
        yield _finding("SC103", "error" if whole else "warning", st,
                       f"{c.zero:,} zero of {what}{first('zero')}: {consequence}", **counts)
    if c.subnormal:
        why = ("E8M0 code 0 is 2^-127: a consumer that builds the scale by a shift decodes it as 0"
               if st.decode == "F8_E8M0" else f"subnormal in {st.decode}: 0 wherever subnormals are flushed")
        yield _finding("SC104", "error" if whole else "warning", st,
                       f"{c.subnormal:,} subnormal of {what}{first('subnormal')}: {why}", **counts)


def unit_findings(unit: Unit, stats: dict[str, ScaleTensor], in_features: int | None) -> Iterator[ScaleFinding]:
    """SC201 (global scale convention), SC301 (shape), SC302 (dtype) and SC501 (missing) for one unit."""
    weight = unit.part("weight")
    for leaf in unit.missing:
        anchor = weight.tensor if weight else next(iter(unit.parts.values())).tensor
        yield _finding("SC501", "error", anchor,
                       f"{unit.layout} weight {unit.name!r} has no {leaf}: {_missing_effect(leaf)}",
                       missing=leaf, layout=unit.layout)
    for part in unit.parts.values():
        if part.role in ("global", "input") and part.tensor.name in stats:
            yield from _convention(unit, stats[part.tensor.name])
    yield from _dtype(unit)
    if weight is not None:
        yield from _shape(unit, weight.tensor, in_features)


def _missing_effect(leaf: str) -> str:
    if leaf in ("weight_scale_2", "weight_global_scale") or "per_tensor_scale" in leaf:
        return "a loader fills the global scale with 0 (1/0 = inf) or a NaN sentinel"
    return "the weight cannot be dequantized; a loader that fills the scale with 0 or NaN serves 0 or NaN"


def _convention(unit: Unit, st: ScaleTensor) -> Iterator[ScaleFinding]:
    c = st.counts
    if unit.convention is None or c is None or c.max is None or c.min is None:
        return
    leaf = st.tensor.name.rsplit(".", 1)[-1]
    severity, what = ("error", "|w|max") if st.role == "global" else ("warning", "|x|max")
    if unit.convention == "amax/(6*448)" and c.max >= 1:
        value = c.max
        implied = f"read as (6*448)/amax (compressed-tensors' convention) it gives {what} = {FP4_FP8 / value:.4g}"
        said = f"{leaf} = {value:g} >= 1: {unit.layout} stores amax/(6*448), under 1 for any {what} below 2688"
    elif unit.convention == "(6*448)/amax" and c.min <= 1:
        value = c.min
        implied = f"read as amax/(6*448) (ModelOpt's convention) it gives {what} = {value * FP4_FP8:.4g}"
        said = f"{leaf} = {value:g} <= 1: {unit.layout} stores (6*448)/amax, over 1 for any {what} below 2688"
    else:
        return
    uncalibrated = "; 1.0 is also what an export writes when nothing was calibrated" if value == 1 else ""
    yield _finding("SC201", severity, st, f"{said}; {implied}{uncalibrated}", value=value,
                   convention=unit.convention)


def _dtype(unit: Unit) -> Iterator[ScaleFinding]:
    for part in unit.parts.values():
        expected: tuple[str, ...] = ()
        if part.role == "block" and unit.family == "nvfp4":
            expected = ("F8_E4M3", "U8")
        elif part.role == "block" and unit.family in ("mxfp4", "mxfp8"):
            expected = ("F8_E8M0", "U8")
        elif part.role in ("global", "input", "kv", "scale", "smooth") or (part.role == "block" and unit.family
                                                                          in ("int4", "int8")):
            expected = _FLOAT
        if expected and part.tensor.dtype not in expected:
            yield _finding("SC302", "error", part.tensor,
                           f"{unit.layout or 'a'} {part.role} scale stored as {part.tensor.dtype}; its loaders read "
                           f"{' or '.join(expected)}", dtype=part.tensor.dtype, expected=list(expected))


def _shape(unit: Unit, weight: TensorInfo, in_features: int | None) -> Iterator[ScaleFinding]:
    scale = unit.part("block") or unit.part("scale")
    if scale is None or unit.options.get("swizzled"):
        return
    got = scale.tensor.shape
    expected, why = _expected_shape(unit, weight, scale.tensor, in_features)
    if expected is None or got == expected or _squeezed(got) == _squeezed(expected):
        return
    if unit.pack > 1 and unit.block and weight.shape and got == (*weight.shape[:-1], math.ceil(weight.shape[-1] / unit.block)):
        why += (f"; {got[-1]} columns is what the packed width {weight.shape[-1]} gives: the scale was computed "
                "from the packed data")
    yield _finding("SC301", "error", scale.tensor, f"shape {list(got)} for weight {weight.name!r} "
                                                    f"{list(weight.shape)} ({weight.dtype}): {why}",
                   shape=list(got), expected=list(expected), weight_shape=list(weight.shape))


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _expected_shape(unit: Unit, weight: TensorInfo, scale: TensorInfo, in_features: int | None) -> tuple[tuple[int, ...] | None, str]:
    """The shape the unit's layout gives its block or weight scale, and why; None where any is allowed."""
    if unit.layout == "mxfp4" and len(weight.shape) >= 2:
        return weight.shape[:-1], f"{weight.shape[-1]} bytes a block of 32 FP4 values needs one scale per block"
    if unit.family in ("nvfp4", "mxfp4", "mxfp8") and unit.block and weight.shape:
        columns = in_features or weight.shape[-1] * unit.pack
        packed = f" (FP4, two a byte: {weight.shape[-1]} x 2)" if unit.pack == 2 else ""
        return ((*weight.shape[:-1], math.ceil(columns / unit.block)),
                f"in_features = {columns}{packed}, so a block of {unit.block} needs ceil({columns}/{unit.block}) = "
                f"{math.ceil(columns / unit.block)} scale columns")
    if unit.family in ("int4", "int8") and unit.block and len(weight.shape) == 2:
        columns = in_features or weight.shape[-1] * unit.pack
        return ((weight.shape[0], math.ceil(columns / unit.block)),
                f"in_features = {columns} and group_size {unit.block}")
    if unit.family == "fp8" and len(weight.shape) >= 2:
        return _fp8_shape(unit, weight, scale)
    return None, ""


def _fp8_shape(unit: Unit, weight: TensorInfo, scale: TensorInfo) -> tuple[tuple[int, ...] | None, str]:
    rows, columns = weight.shape[-2:]
    lead = weight.shape[:-2]
    block = unit.options.get("fp8_block") or unit.options.get("block_size")
    if isinstance(block, (list, tuple)) and len(block) >= 2:
        b0, b1 = block[-2:]
        return ((*lead, math.ceil(rows / b0), math.ceil(columns / b1)),
                f"blocks of {b0}x{b1} need ceil({rows}/{b0}) x ceil({columns}/{b1}) scales")
    allowed = [(*lead, 1), (*lead, rows), (*lead, rows, 1), (*lead, math.ceil(rows / 128), math.ceil(columns / 128))]
    if scale.shape in allowed or scale.numel == 1:
        return None, ""
    return (allowed[2], f"it matches no FP8 granularity: per tensor [1], per channel [{rows}, 1], or 128x128 blocks "
                        f"[{math.ceil(rows / 128)}, {math.ceil(columns / 128)}]")


def sibling_findings(units: list[Unit]) -> Iterator[ScaleFinding]:
    """SC501 for an activation scale that most units of one pattern (experts.*.down_proj) have and some lack."""
    groups: dict[tuple[str, str], list[Unit]] = {}
    for unit in units:
        if unit.layout is not None and unit.part("weight") is not None:
            groups.setdefault((unit.layout, sibling_pattern(unit.module)), []).append(unit)
    for (layout, pattern), members in groups.items():
        having = [u for u in members if u.part("input") is not None]
        if not having or len(having) == len(members):
            continue
        leaf = next(k for k, p in having[0].parts.items() if p.role == "input")
        for unit in members:
            if unit.part("input") is None:
                weight = unit.part("weight")
                assert weight is not None
                yield _finding("SC501", "error", weight.tensor,
                               f"{layout} weight {unit.name!r} has no {leaf}, which {len(having):,} of "
                               f"{len(members):,} {pattern} have: a loader fills it with 0 (1/0 = inf) or a NaN "
                               "sentinel, and only the prompts routed there fail", missing=leaf,
                               having=len(having), of=len(members))


def config_findings(unit: Unit, config: QuantConfig) -> Iterator[ScaleFinding]:
    """SC401 (claimed twice) and SC402 (config and tensors disagree) for one quantized unit."""
    weight = unit.part("weight")
    if unit.layout is None or weight is None or not config.schemes:
        return
    ignored = config.ignored_by(unit.module)
    claimants = config.claimants(unit.module)
    if ignored is not None:
        by = f"claimed by group {claimants[0].name!r} and by" if claimants else "named by"
        yield _finding("SC401", "error", weight.tensor,
                       f"{unit.module!r} is stored as {unit.layout}, {by} the config's ignore entry {ignored!r}: "
                       "a loader builds it unquantized and its tensors do not fit", ignore=ignored)
        return
    if len(claimants) > 1:
        same = all(s.same_scheme(claimants[0]) for s in claimants)
        schemes = "; ".join(f"{s.name} ({s.family}, group_size {s.group_size})" for s in claimants)
        yield _finding("SC401", "warning" if same else "error", weight.tensor,
                       f"{unit.module!r} is claimed by {len(claimants)} quantization groups at one precedence: "
                       f"{schemes}; the scheme a loader applies depends on their order",
                       groups=[s.name for s in claimants])
    if not claimants:
        yield _finding("SC402", "error", weight.tensor, f"{unit.module!r} is stored as {unit.layout}, but no group "
                                                        "of the config claims it: a loader builds it unquantized")
    elif claimants[0].family and unit.family and claimants[0].family != unit.family:
        yield _finding("SC402", "error", weight.tensor,
                       f"the config gives {unit.module!r} {claimants[0].family} (group {claimants[0].name!r}), but "
                       f"its tensors are {unit.family} ({unit.evidence})", config=claimants[0].family,
                       stored=unit.family)
    leaf = _INPUT_LEAF.get(unit.layout)
    if claimants and claimants[0].static_input and leaf and unit.family in ("nvfp4", "fp8", "int8") \
            and unit.part("input") is None:
        yield _finding("SC501", "error", weight.tensor,
                       f"{unit.layout} weight {unit.name!r} has no {leaf}, and the config's {claimants[0].name} "
                       "quantizes its activations with a calibrated scale: a loader fills it with 0 (1/0 = inf) or "
                       "a NaN sentinel", missing=leaf)
