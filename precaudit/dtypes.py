"""Floating-point formats, computed from finfo, and the one answer to what a value or an array becomes in one.

A format is an element type plus, for the block-scaled formats, the type of one scale per `block` elements and,
for NVFP4, a float32 scale of the whole tensor on top:

    fp16, bf16, fp8-e4m3, fp8-e5m2, fp32, fp64   one element type, rounded value by value (--dtype)
    mxfp8   float8_e4m3fn elements, one float8_e8m0fnu (power of two) scale per 32       (OCP MX v1.0)
    mxfp4   float4_e2m1fn elements, one float8_e8m0fnu scale per 32                      (OCP MX v1.0)
    nvfp4   float4_e2m1fn elements, one float8_e4m3fn scale per 16, one float32 scale per tensor

`quantize` rounds an array into any of them, the scale step included, as real quantizers compute the scales
(block_scales). The element types fp4-e2m1 and fp8-e8m0 are formats of stored tensors (QDQ data and scales), not
targets of --dtype: they are in ELEMENTS, not FORMATS.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np

__all__ = [
    "ALIASES",
    "COMPUTED",
    "ELEMENTS",
    "FORMATS",
    "BlockScales",
    "Format",
    "block_scales",
    "blocks_along",
    "classify",
    "format_named",
    "format_of_onnx_type",
    "global_scale_of",
    "quantize",
    "quantize_blocks",
    "round_elements",
    "round_to_format",
]

_F32 = np.finfo(np.float32)


@dataclass(frozen=True)
class Format:
    """One float format and the numbers an audit compares against: its element type's (for a block-scaled format
    too: what one scaled element can hold), and for a block-scaled format its scale type and block size."""

    name: str  # canonical CLI name, e.g. "fp16"
    long_name: str  # what users read in messages, e.g. "float16"
    np_dtype: np.dtype
    onnx_type: int  # its ONNX TensorProto element type (numbers fixed by onnx.proto: FLOAT16 = 10, ...)
    max: float
    smallest_normal: float
    smallest_subnormal: float
    ulp_at_1: float
    exp_overflow: float  # x above which exp(x) exceeds max
    square_overflow: float  # |x| above which x*x exceeds max
    overflow_threshold: float  # |x| from which rounding gives inf (or NaN): max plus half an ulp at max
    has_inf: bool = True  # float8_e4m3fn has none: inf (and every overflow) becomes NaN
    has_nan: bool = True  # float4_e2m1fn has none either: its casts saturate
    scale: Format | None = None  # a block-scaled format: the format of each block's scale
    block: int = 0  # elements per scale along the blocked axis; 0: a format rounded value by value
    global_scale: bool = False  # a float32 scale of the whole tensor multiplies the block scales (NVFP4)
    elements: Format | None = None  # a block-scaled format's element type (its numbers are this one's)

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self.np_dtype.itemsize

    @property
    def element(self) -> Format:
        """The type each value is stored in: the format itself, or a block-scaled format's elements."""
        return self.elements if self.elements is not None else self

    @property
    def blocked(self) -> bool:
        """Values are scaled block by block before they are rounded (MXFP8, MXFP4, NVFP4)."""
        return self.block > 0

    @property
    def wide(self) -> bool:
        """Holds every float32 value as it is (float32, float64): a value held in it is not rounded."""
        return (not self.blocked and self.max >= float(_F32.max) and self.ulp_at_1 <= float(_F32.eps)
                and self.smallest_subnormal <= float(_F32.smallest_subnormal))

    @property
    def is_narrow(self) -> bool:
        """Rounds float32 values: what an audit at this format judges."""
        return not self.wide

    @property
    def held_dtype(self) -> type:
        """The numpy dtype an emulated run holds this format's values in: float64 for a format finer than float32,
        float32 for every other (which holds all their values exactly)."""
        return np.float64 if self.ulp_at_1 < float(_F32.eps) else np.float32

    @property
    def emax(self) -> int:
        """The exponent of the largest power of two the element type holds (E4M3: 8, E2M1: 2): the MX scale rule's."""
        return math.floor(math.log2(self.element.max))

    def numbers(self) -> dict[str, float | str]:
        """The format's numbers as rule-condition names (fmt_max, fmt_smallest_normal, ...)."""
        return {
            "fmt_name": self.long_name,
            "fmt_max": self.max,
            "fmt_smallest_normal": self.smallest_normal,
            "fmt_smallest_subnormal": self.smallest_subnormal,
            "fmt_ulp_at_1": self.ulp_at_1,
            "fmt_exp_overflow": self.exp_overflow,
            "fmt_square_overflow": self.square_overflow,
        }


def _make(name: str, long_name: str, dtype, onnx_type: int) -> Format:
    dt = np.dtype(dtype)
    fi = ml_dtypes.finfo(dt)  # handles numpy's own floats too
    fmax = float(fi.max)
    half_ulp_at_max = 2.0 ** (math.floor(math.log2(fmax)) - int(fi.nmant)) / 2
    with np.errstate(invalid="ignore", over="ignore"):
        has_inf = bool(np.isinf(np.array(np.inf).astype(dt)))
        has_nan = bool(np.isnan(np.array(np.nan).astype(dt)))
    return Format(
        name=name,
        long_name=long_name,
        np_dtype=dt,
        onnx_type=onnx_type,
        max=fmax,
        smallest_normal=float(fi.smallest_normal),
        smallest_subnormal=float(fi.smallest_subnormal),
        ulp_at_1=float(fi.eps),
        exp_overflow=math.log(fmax),
        square_overflow=math.sqrt(fmax),
        overflow_threshold=fmax + half_ulp_at_max,
        has_inf=has_inf,
        has_nan=has_nan,
    )


def _blocked(name: str, long_name: str, elements: Format, scale: Format, block: int, global_scale: bool = False) -> Format:
    return dataclasses.replace(elements, name=name, long_name=long_name, scale=scale, block=block,
                               global_scale=global_scale, elements=elements)


# the ONNX element types are onnx.proto's numbers, written out: importing onnx here would cost `precaudit rules` and
# every import of this module the onnx package
_PLAIN = [
    _make("fp16", "float16", np.float16, 10),
    _make("bf16", "bfloat16", ml_dtypes.bfloat16, 16),
    _make("fp8-e4m3", "float8_e4m3fn", ml_dtypes.float8_e4m3fn, 17),
    _make("fp8-e5m2", "float8_e5m2", ml_dtypes.float8_e5m2, 19),
    _make("fp32", "float32", np.float32, 1),
    _make("fp64", "float64", np.float64, 11),
]
# element types of stored tensors only: FP4 data (two per byte in a file) and E8M0 power-of-two scales
_FP4 = _make("fp4-e2m1", "float4_e2m1fn", ml_dtypes.float4_e2m1fn, 23)
_E8M0 = _make("fp8-e8m0", "float8_e8m0fnu", ml_dtypes.float8_e8m0fnu, 24)
ELEMENTS: dict[str, Format] = {f.name: f for f in (*_PLAIN, _FP4, _E8M0)}

FORMATS: dict[str, Format] = {
    **{f.name: f for f in _PLAIN},
    "mxfp8": _blocked("mxfp8", "MXFP8", ELEMENTS["fp8-e4m3"], _E8M0, 32),
    "mxfp4": _blocked("mxfp4", "MXFP4", _FP4, _E8M0, 32),
    "nvfp4": _blocked("nvfp4", "NVFP4", _FP4, ELEMENTS["fp8-e4m3"], 16, global_scale=True),
}
# The names a stored float value's dtype can have that a graph computes on (QDQ data and scales are not among them).
COMPUTED = frozenset(f.name for f in _PLAIN)

# Spellings users type for --dtype; the canonical names are the keys of FORMATS.
ALIASES: dict[str, str] = {
    "float16": "fp16", "half": "fp16", "f16": "fp16",
    "bfloat16": "bf16",
    "e4m3": "fp8-e4m3", "fp8": "fp8-e4m3", "float8_e4m3fn": "fp8-e4m3", "fp8_e4m3": "fp8-e4m3",
    "e5m2": "fp8-e5m2", "float8_e5m2": "fp8-e5m2", "fp8_e5m2": "fp8-e5m2",
    "float32": "fp32", "float": "fp32", "f32": "fp32",
    "float64": "fp64", "double": "fp64",
    "mxfp8_e4m3": "mxfp8", "mxfp4_e2m1": "mxfp4",
}


def format_named(name: str) -> Format:
    """Look a format up by canonical name or alias; KeyError names the choices."""
    key = ALIASES.get(name.lower(), name.lower())
    if key not in FORMATS:
        raise KeyError(f"unknown dtype {name!r}; choose one of {', '.join(FORMATS)}")
    return FORMATS[key]


def round_to_format(value: float, fmt: Format) -> float:
    """Round a float into the format (round to nearest even) and back to a Python float.

    Values beyond the format's range come back as inf (or nan for formats without inf, like e4m3fn). A graph
    rounds the same few constants (its eps, its scales) at every layer: each is worked out once per format. In a
    block-scaled format a value is a block of one, scaled as quantize scales it.
    """
    # a number other than 0 (0.0 and -0.0 would be one key) and NaN (no key finds it)
    key = (value, fmt.name) if isinstance(value, (float, int)) and value and not math.isnan(value) else None
    rounded = _ROUNDED.get(key) if key is not None else None
    if rounded is None:
        rounded = float(quantize(np.asarray([value], dtype=np.float64), fmt)[0])
        if key is not None and len(_ROUNDED) < _ROUNDED_MAX:
            _ROUNDED[key] = rounded
    return rounded


_ROUNDED: dict[tuple[float, str], float] = {}
_ROUNDED_MAX = 1 << 16


def classify(value: float, fmt: Format) -> str:
    """Classify a value after rounding into fmt: zero, subnormal, normal or overflow."""
    rounded = round_to_format(value, fmt)
    if not math.isfinite(rounded) or abs(rounded) > fmt.max:
        return "overflow"
    if rounded == 0.0:
        return "zero"
    if abs(rounded) < fmt.smallest_normal:
        return "subnormal"
    return "normal"


_BY_ONNX_TYPE = {f.onnx_type: f for f in ELEMENTS.values()}


def format_of_onnx_type(elem_type: int) -> Format | None:
    """The Format of an ONNX tensor element type (FLOAT4E2M1 and FLOAT8E8M0 included), or None for non-float
    types."""
    return _BY_ONNX_TYPE.get(elem_type)


# ---- arrays -------------------------------------------------------------------------------------------------------

def quantize(array: np.ndarray, fmt: Format, axis: int = -1, global_scale: float | None = None) -> np.ndarray:
    """The array as it comes back from fmt, held in fmt.held_dtype: each value rounded to nearest even.

    A plain format rounds value by value (beyond its range: inf, or NaN without inf). A block-scaled one divides
    each block of fmt.block values along axis by the scale block_scales gives it, rounds the quotients into its
    elements with saturation (a quotient beyond their max becomes ±max, as quantizers clip it), and multiplies
    back; a block whose scale is 0 comes back as 0, one whose scale is NaN as NaN. global_scale: NVFP4's scale of
    the whole tensor (None: global_scale_of(array), a scale computed from this tensor alone).
    """
    data = np.asarray(array)
    if not fmt.blocked:
        with np.errstate(over="ignore", invalid="ignore"):
            return data.astype(fmt.np_dtype).astype(fmt.held_dtype)
    if data.size == 0:
        return data.astype(np.float32)
    elements, scales, restore = _blocked_parts(data, fmt, axis, global_scale)
    step = scales.step()[..., None]
    with np.errstate(over="ignore", invalid="ignore"):
        return restore(np.where(step != 0, elements * step, np.float32(0))).astype(np.float32)


def quantize_blocks(array: np.ndarray, fmt: Format, axis: int = -1,
                    global_scale: float | None = None) -> tuple[np.ndarray, BlockScales]:
    """A block-scaled format's two stored parts, as quantize computes them: the elements (float32 numbers of the
    element type, in the array's shape) and the block scales (one per block: the array's shape with ceil(n /
    block) along axis)."""
    elements, scales, restore = _blocked_parts(np.asarray(array), fmt, axis, global_scale)
    moved = [np.moveaxis(a, -1, axis) for a in (scales.stored, scales.ideal)]
    return restore(elements).astype(np.float32), BlockScales(moved[0], moved[1], scales.global_scale)


def _blocked_parts(data: np.ndarray, fmt: Format, axis: int, global_scale: float | None):
    """(elements as [..., blocks, block], the block scales as [..., blocks], the function restoring the layout)."""
    blocks, restore = blocks_along(data, fmt.block, axis)
    scales = block_scales(np.max(np.abs(blocks), axis=-1), fmt,
                          global_scale_of(data, fmt) if global_scale is None else global_scale)
    step = scales.step()[..., None]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scaled = np.divide(blocks, step, dtype=np.float32)
    zero = step[..., 0] == 0
    if zero.any():  # a block whose scale is 0 comes back as 0, not x / 0
        scaled[zero] = 0
    return round_elements(scaled, fmt.element, saturate=True), scales, restore


def round_elements(scaled: np.ndarray, element: Format, saturate: bool = True) -> np.ndarray:
    """Values already divided by their scale, rounded into the element type (float32 back): with saturate, beyond
    its max they become ±max (QuantizeLinear's saturate=1, the MX and NVFP4 quantizers); NaN stays NaN."""
    x = np.asarray(scaled, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        if saturate:
            x = np.clip(x, -element.max, element.max)
        rounded = x.astype(element.np_dtype).astype(np.float32)
    if not element.has_nan:  # FP4 has no NaN: its cast would make one a 0
        nan = np.isnan(x)
        if nan.any():
            rounded[nan] = np.nan
    return rounded


def blocks_along(data: np.ndarray, block: int, axis: int = -1):
    """The array as [..., blocks, block] along axis (float32, float64 for wider data; the last block padded with
    zeros, which change no block's largest |x|), and the function that puts an array of that layout back in the
    array's shape."""
    array = np.asarray(data)
    wide = array.dtype == np.float64 or array.dtype.kind in "iu"
    moved = np.moveaxis(array.astype(np.float64 if wide else np.float32, copy=False), axis, -1)
    n = moved.shape[-1]
    count = -(-n // block)
    if count * block != n:
        moved = np.concatenate([moved, np.zeros((*moved.shape[:-1], count * block - n))], axis=-1)
    blocks = moved.reshape(*moved.shape[:-1], count, block)

    def restore(out: np.ndarray) -> np.ndarray:
        flat = out.reshape(*out.shape[:-2], count * block)[..., :n]
        return np.moveaxis(flat, -1, axis)
    return blocks, restore


@dataclass(frozen=True)
class BlockScales:
    """The scale each block gets, as a quantizer computes it from the block's largest |x|.

    stored: the scale as its format holds it (0, subnormal and NaN included); ideal: the number it was rounded
    from (MX: 2**(floor(log2 amax) - emax) before the exponent is clamped to E8M0's range); global_scale: NVFP4's
    float32 scale of the tensor that multiplies every block's (1.0 for MX).
    """

    stored: np.ndarray
    ideal: np.ndarray
    global_scale: float = 1.0

    def step(self) -> np.ndarray:
        """The number each block's elements are multiplied by when dequantized (float32, as kernels compute it)."""
        with np.errstate(over="ignore", invalid="ignore"):
            return (self.stored.astype(np.float32) * np.float32(self.global_scale)).astype(np.float32)


# E8M0's exponents: 2**-127 (code 0) to 2**127 (code 254); code 255 is NaN, and there is no 0
_E8M0_EXP = (-127, 127)


def block_scales(amax: np.ndarray, fmt: Format, global_scale: float = 1.0) -> BlockScales:
    """Each block's scale from its largest |x|, as real quantizers compute it.

    MX (an E8M0 scale, OCP MX v1.0): 2**(floor(log2 amax) - emax of the elements), the exponent clamped at -127
    (an all-zero block gets 2**-127, code 0), NaN where amax is inf or NaN or the exponent passes 127.
    NVFP4 (an E4M3 scale; ModelOpt, TensorRT): amax / (6 * global_scale) in float32, 1.0 for an all-zero block,
    rounded into E4M3: below 2**-10 it is 0, above 464 NaN.
    """
    a = np.asarray(amax, dtype=np.float64)
    if fmt.scale is not None and fmt.scale.name == "fp8-e8m0":
        with np.errstate(divide="ignore", invalid="ignore"):
            exp = np.floor(np.log2(a)) - fmt.emax
        exp = np.where(a == 0, _E8M0_EXP[0], exp)
        ok = np.isfinite(exp) & (exp <= _E8M0_EXP[1])
        whole = np.where(ok, exp, 0.0).astype(np.int64)
        ideal = np.where(ok, np.ldexp(1.0, whole), np.nan)
        stored = np.where(ok, np.ldexp(1.0, np.maximum(whole, _E8M0_EXP[0])), np.nan)
        return BlockScales(stored, ideal)
    assert fmt.scale is not None  # asked of block-scaled formats only
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ideal = a.astype(np.float32) / (np.float32(fmt.element.max) * np.float32(global_scale))
        ideal = np.where(ideal == 0, np.float32(1.0), ideal)
        stored = ideal.astype(fmt.scale.np_dtype).astype(np.float64)
    return BlockScales(stored, ideal.astype(np.float64), global_scale)


def global_scale_of(array: np.ndarray, fmt: Format) -> float:
    """NVFP4's float32 scale of a whole tensor, as ModelOpt computes it: amax / 6 / 448 (so that the largest block
    scale is E4M3's 448), 1.0 for an all-zero tensor; 1.0 for formats without one."""
    if not fmt.global_scale or fmt.scale is None:
        return 1.0
    data = np.asarray(array)
    amax = np.float32(np.max(np.abs(data))) if data.size else np.float32(0)
    if amax == 0:
        return 1.0
    with np.errstate(over="ignore", invalid="ignore"):
        return float(amax / np.float32(fmt.element.max) / np.float32(fmt.scale.max))
