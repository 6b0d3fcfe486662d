"""Floating-point formats, computed from finfo, and rounding a value into one."""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np

__all__ = ["Format", "FORMATS", "ALIASES", "format_named", "round_to_format", "classify", "format_of_onnx_type"]


@dataclass(frozen=True)
class Format:
    """One float format and the numbers an audit compares against."""

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

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self.np_dtype.itemsize

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
    )


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        # the ONNX element types are onnx.proto's numbers, written out: importing onnx here would cost
        # `precaudit rules` and every import of this module the onnx package
        _make("fp16", "float16", np.float16, 10),
        _make("bf16", "bfloat16", ml_dtypes.bfloat16, 16),
        _make("fp8-e4m3", "float8_e4m3fn", ml_dtypes.float8_e4m3fn, 17),
        _make("fp8-e5m2", "float8_e5m2", ml_dtypes.float8_e5m2, 19),
        _make("fp32", "float32", np.float32, 1),
        _make("fp64", "float64", np.float64, 11),
    )
}

# Spellings users type for --dtype; the canonical names are the keys of FORMATS.
ALIASES: dict[str, str] = {
    "float16": "fp16", "half": "fp16", "f16": "fp16",
    "bfloat16": "bf16",
    "e4m3": "fp8-e4m3", "fp8": "fp8-e4m3", "float8_e4m3fn": "fp8-e4m3", "fp8_e4m3": "fp8-e4m3",
    "e5m2": "fp8-e5m2", "float8_e5m2": "fp8-e5m2", "fp8_e5m2": "fp8-e5m2",
    "float32": "fp32", "float": "fp32", "f32": "fp32",
    "float64": "fp64", "double": "fp64",
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
    rounds the same few constants (its eps, its scales) at every layer: each is worked out once per format.
    """
    # a number other than 0 (0.0 and -0.0 would be one key) and NaN (no key finds it)
    key = (value, fmt.name) if isinstance(value, (float, int)) and value and value == value else None
    rounded = _ROUNDED.get(key) if key is not None else None
    if rounded is None:
        with np.errstate(over="ignore", invalid="ignore"):
            rounded = float(np.asarray(value, dtype=np.float64).astype(fmt.np_dtype).astype(np.float64))
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


_BY_ONNX_TYPE = {f.onnx_type: f for f in FORMATS.values()}


def format_of_onnx_type(elem_type: int) -> Format | None:
    """The Format of an ONNX tensor element type, or None for non-float types."""
    return _BY_ONNX_TYPE.get(elem_type)
