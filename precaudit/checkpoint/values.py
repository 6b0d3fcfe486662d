"""Exact counts of a scale tensor's NaN, inf, zero, subnormal and negative entries, read in bounded chunks.

Bytes are read with readinto at the offsets the header proved are in the file, not memory-mapped: a file that a
stranger's process truncates while it is mapped kills the reader with SIGBUS, where a short read here is one
InputError. A chunk is first settled by its least and greatest code: in every format here the positive normal
finite values are one run of codes in which the value grows with the code, so a chunk inside that run (the usual
one) has no entry of any kind, and its extreme codes are its min and max. Any other 8- or 16-bit chunk is counted
by a histogram of its codes (every code decoded once: exact for E8M0 and the FNUZ formats too); a float16, 32 or
64 one by its values.

E8M0 has no zero, inf or subnormal of its own: code 0xFF is NaN, and code 0 is 2^-127, a float32 subnormal that
consumers building the scale by a shift decode as 0. It is counted as subnormal.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import IO, cast

import numpy as np

from ..errors import InputError
from .header import TensorInfo

__all__ = ["COUNTED", "Counts", "count_all", "count_values", "read_small", "unravel"]

CHUNK = 1 << 20  # bytes per histogram pass: larger chunks run slower (numpy's bincount widens to intp)
SMALL = 64 << 10  # a tensor up to this size is counted with others of its decode, in one numpy pass
_FLOATS = {"F16": np.float16, "F32": np.float32, "F64": np.float64}
COUNTED = ("F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F16", "BF16", "F32", "F64")


@dataclass
class Counts:
    """One scale tensor's entries by kind; first gives the flat index of the first entry of each kind found."""

    count: int = 0
    nan: int = 0
    inf: int = 0
    zero: int = 0
    subnormal: int = 0
    negative: int = 0
    min: float | None = None  # the smallest positive finite entry
    max: float | None = None  # the largest finite entry
    first: dict[str, int] = field(default_factory=dict)

    KINDS = ("nan", "inf", "zero", "subnormal", "negative")

    def add(self, other: Counts, offset: int) -> None:
        self.count += other.count
        for kind in self.KINDS:
            setattr(self, kind, getattr(self, kind) + getattr(other, kind))
            if kind in other.first and kind not in self.first:
                self.first[kind] = offset + other.first[kind]
        self.min = _pick(min, self.min, other.min)
        self.max = _pick(max, self.max, other.max)


def _pick(f: Callable[[float, float], float], a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else f(a, b)


@cache
def _code_table(decode: str) -> np.ndarray:
    """Every code of an 8- or 16-bit format decoded to float64 (E8M0 by its definition, 2^(code-127))."""
    import ml_dtypes

    if decode == "F8_E8M0":
        codes = np.arange(256, dtype=np.float64)
        values = np.exp2(codes - 127)
        values[255] = np.nan
        return values
    numpy_type = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
                  "F8_E4M3FNUZ": ml_dtypes.float8_e4m3fnuz, "F8_E5M2FNUZ": ml_dtypes.float8_e5m2fnuz,
                  "F16": np.float16, "BF16": ml_dtypes.bfloat16}[decode]
    width = np.dtype(numpy_type).itemsize
    raw = np.arange(1 << (8 * width), dtype=np.uint8 if width == 1 else "<u2")
    with np.errstate(invalid="ignore"):  # the NaN codes
        return raw.view(numpy_type).astype(np.float64)


@cache
def _smallest_normal(decode: str) -> float:
    import ml_dtypes

    if decode in ("F8_E8M0", "F32"):
        return float(np.finfo(np.float32).tiny)
    table = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2,
             "F8_E4M3FNUZ": ml_dtypes.float8_e4m3fnuz, "F8_E5M2FNUZ": ml_dtypes.float8_e5m2fnuz,
             "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64}
    return float(ml_dtypes.finfo(table[decode]).smallest_normal)


def _kind_masks(values: np.ndarray, decode: str) -> dict[str, np.ndarray]:
    finite = np.isfinite(values)
    magnitude = np.abs(values)
    return {"nan": np.isnan(values), "inf": np.isinf(values), "zero": values == 0,
            "subnormal": finite & (magnitude > 0) & (magnitude < _smallest_normal(decode)),
            "negative": finite & (values < 0), "finite": finite}


@cache
def _table_masks(decode: str) -> dict[str, np.ndarray]:
    return _kind_masks(_code_table(decode), decode)


def _summary(values: np.ndarray, masks: dict[str, np.ndarray], weights: np.ndarray | None) -> Counts:
    """Counts of values, each counted weights[i] times (a histogram of codes) or once."""
    present = masks["finite"] if weights is None else masks["finite"] & (weights > 0)
    positive = present & (values > 0)

    def total(mask: np.ndarray) -> int:
        return int(weights[mask].sum()) if weights is not None else int(np.count_nonzero(mask))

    counts = Counts(count=int(weights.sum()) if weights is not None else int(values.size),
                    min=float(values[positive].min()) if positive.any() else None,
                    max=float(values[present].max()) if present.any() else None)
    for kind in Counts.KINDS:
        setattr(counts, kind, total(masks[kind]))
    return counts


_BITS = {"F16": "<u2", "BF16": "<u2", "F32": "<u4", "F64": "<u8"}  # the rest: one byte


@cache
def _clean_codes(decode: str) -> tuple[int, int] | None:
    """The codes of the positive normal finite values, lowest and highest, where they are one run in which the value
    grows with the code (every IEEE-like format, E8M0 from code 1): a chunk whose codes all lie in it has no NaN,
    inf, zero, subnormal or negative entry, and its least and greatest codes are its min and max."""
    if decode == "F32":
        return 0x00800000, 0x7F7FFFFF
    if decode == "F64":
        return 0x0010000000000000, 0x7FEFFFFFFFFFFFFF
    values = _code_table(decode)
    clean = np.isfinite(values) & (values >= _smallest_normal(decode))
    run = np.flatnonzero(clean)
    lo, hi = int(run[0]), int(run[-1])
    if not clean[lo:hi + 1].all() or not (np.diff(values[lo:hi + 1]) > 0).all():
        return None
    return lo, hi


def _value(decode: str, code: int) -> float:
    return float(_values(decode, np.array([code], dtype=_BITS.get(decode, np.uint8)))[0])


def _chunk_counts(raw: memoryview, decode: str, wanted: set[str]) -> Counts:
    """Counts of one chunk; first indexes only for the kinds in wanted (those not found in earlier chunks). A chunk
    of clean codes only (the usual one) is settled by its least and greatest code."""
    bits = np.frombuffer(raw, dtype=_BITS.get(decode, np.uint8))
    clean = _clean_codes(decode)
    if bits.size and clean is not None:
        low, high = int(bits.min()), int(bits.max())
        if clean[0] <= low and high <= clean[1]:
            return Counts(count=int(bits.size), min=_value(decode, low), max=_value(decode, high))
    if decode in _FLOATS:
        with np.errstate(invalid="ignore"):  # a NaN's payload
            values = bits.view(np.dtype(_FLOATS[decode]).newbyteorder("<")).astype(np.float64)
        masks = _kind_masks(values, decode)
        counts = _summary(values, masks, None)
        counts.first = {k: int(np.argmax(masks[k])) for k in wanted if getattr(counts, k)}
        return counts
    table = _code_table(decode)
    masks = _table_masks(decode)
    counts = _summary(table, masks, _histogram(bits, table.size))
    counts.first = {k: int(np.argmax(masks[k][bits])) for k in wanted if getattr(counts, k)}
    return counts


def _histogram(codes: np.ndarray, size: int) -> np.ndarray:
    """How many times each code occurs. A byte histogram counts byte pairs as 16-bit codes and folds them: half
    the elements for bincount to widen (measured 2x faster on 1 MiB chunks)."""
    if size == 256 and codes.size >= 2:
        even = codes[: codes.size // 2 * 2].view("<u2")
        pairs = np.bincount(even, minlength=65536).reshape(256, 256)  # [high byte, low byte]
        histogram = pairs.sum(axis=0) + pairs.sum(axis=1)
        if codes.size % 2:
            histogram[codes[-1]] += 1
        return histogram
    return np.bincount(codes, minlength=size)


def _width(decode: str) -> int:
    return np.dtype(_BITS.get(decode, np.uint8)).itemsize


def _count_buffer(view: memoryview, decode: str, total: Counts, offset: int) -> None:
    """Add the counts of the entries in view (the first at flat index offset) to total, chunk by chunk."""
    width = _width(decode)
    for at in range(0, len(view), CHUNK):
        wanted = {k for k in Counts.KINDS if k not in total.first}
        total.add(_chunk_counts(view[at:at + CHUNK], decode, wanted), offset + at // width)


def _read(fh: IO[bytes], start: int, view: memoryview, tensor: TensorInfo) -> None:
    fh.seek(start)
    if cast(io.BufferedIOBase, fh).readinto(view) != len(view):
        raise InputError(tensor.file, f"the file ended inside tensor {tensor.name!r}: it changed while it was read")


def count_values(fh: IO[bytes], tensor: TensorInfo, decode: str, buffer: bytearray) -> Counts:
    """The tensor's entries read as decode, counted through buffer (len(buffer) bytes at a time)."""
    step = len(buffer) // _width(decode) * _width(decode)
    total = Counts()
    for done in range(0, tensor.nbytes, step):
        view = memoryview(buffer)[:min(step, tensor.nbytes - done)]
        _read(fh, tensor.start + done, view, tensor)
        _count_buffer(view, decode, total, done // _width(decode))
    return total


def count_all(fh: IO[bytes], items: list[tuple[TensorInfo, str]], buffer: bytearray) -> list[Counts]:
    """Counts of each (tensor, decode), the items in file order. Tensors that lie back to back are read in one read;
    small ones (a checkpoint's many thousands of scalar scales) are gathered by decode and counted together."""
    results: list[Counts] = [Counts()] * len(items)
    pending: dict[str, tuple[bytearray, list[int]]] = {}

    def flush(decode: str) -> None:
        data, indexes = pending.pop(decode)
        for k, counts in zip(indexes, _count_run(memoryview(data), decode, [items[k][0] for k in indexes])):
            results[k] = counts

    i = 0
    while i < len(items):
        first = items[i][0]
        if first.nbytes > len(buffer):
            results[i] = count_values(fh, first, items[i][1], buffer)
            i += 1
            continue
        j = i + 1
        while j < len(items) and items[j][0].start == items[j - 1][0].stop and \
                items[j][0].stop - first.start <= len(buffer):
            j += 1
        view = memoryview(buffer)[:items[j - 1][0].stop - first.start]
        _read(fh, first.start, view, first)
        for k in range(i, j):
            tensor, decode = items[k]
            raw = view[tensor.start - first.start:tensor.stop - first.start]
            if tensor.nbytes > SMALL:
                results[k] = Counts()
                _count_buffer(raw, decode, results[k], 0)
                continue
            data, indexes = pending.setdefault(decode, (bytearray(), []))
            data += raw
            indexes.append(k)
            if len(data) >= len(buffer):
                flush(decode)
        i = j
    for decode in list(pending):
        flush(decode)
    return results


def _count_run(raw: memoryview, decode: str, tensors: list[TensorInfo]) -> list[Counts]:
    """Counts of back-to-back tensors of one decode: each settled by its least and greatest code where those show
    it clean (one reduceat over all of them), counted entry by entry otherwise."""
    width = _width(decode)
    bits = np.frombuffer(raw, dtype=_BITS.get(decode, np.uint8))
    sizes = np.array([t.nbytes // width for t in tensors], dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    clean = _clean_codes(decode)
    nonempty = sizes > 0
    fast = np.zeros(len(tensors), dtype=bool)
    lows = highs = np.zeros(len(tensors), dtype=bits.dtype)
    if clean is not None and nonempty.any():
        lows, highs = np.zeros_like(lows), np.zeros_like(highs)
        lows[nonempty] = np.minimum.reduceat(bits, starts[nonempty])
        highs[nonempty] = np.maximum.reduceat(bits, starts[nonempty])
        fast = nonempty & (lows >= clean[0]) & (highs <= clean[1])
    low_values, high_values = _values(decode, lows).tolist(), _values(decode, highs).tolist()
    results = []
    for k in range(len(tensors)):
        if fast[k]:
            results.append(Counts(count=int(sizes[k]), min=low_values[k], max=high_values[k]))
            continue
        counts = Counts()
        _count_buffer(raw[int(starts[k]) * width:int(starts[k] + sizes[k]) * width], decode, counts, 0)
        results.append(counts)
    return results


def _values(decode: str, codes: np.ndarray) -> np.ndarray:
    if decode in _FLOATS:
        with np.errstate(invalid="ignore"):
            return codes.view(np.dtype(_FLOATS[decode]).newbyteorder("<")).astype(np.float64)
    return _code_table(decode)[codes]


def read_small(fh: IO[bytes], tensor: TensorInfo, limit: int = 64) -> list[int] | None:
    """A small integer tensor's values (compressed-tensors' weight_shape), if it is one."""
    types = {"I64": "<i8", "I32": "<i4", "U64": "<u8", "U32": "<u4", "I16": "<i2", "U16": "<u2"}
    if tensor.dtype not in types or tensor.numel > limit:
        return None
    fh.seek(tensor.start)
    data = fh.read(tensor.nbytes)
    if len(data) != tensor.nbytes:
        raise InputError(tensor.file, f"the file ended inside tensor {tensor.name!r}: it changed while it was read")
    return [int(v) for v in np.frombuffer(data, dtype=types[tensor.dtype])]


def unravel(index: int, shape: tuple[int, ...]) -> list[int]:
    """A flat index as a position in shape ([] for a scalar)."""
    return [int(i) for i in np.unravel_index(index, shape)] if shape and math.prod(shape) else []  # type: ignore[arg-type]
