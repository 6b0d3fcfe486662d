"""The checks' vocabulary: each finding's id, name and summary, and the finding itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .header import TensorInfo
from .values import Counts, unravel

__all__ = ["RULES", "ScaleFinding", "ScaleTensor"]

# id -> (name, the severity it has unless the finding says otherwise, summary)
RULES: dict[str, tuple[str, str, str]] = {
    "SC101": ("scale-nonfinite", "error",
              "A scale entry is NaN or inf: everything it scales dequantizes to NaN or inf."),
    "SC102": ("scale-negative", "error",
              "A scale entry is negative: the block it scales flips sign."),
    "SC103": ("scale-zero", "warning",
              "A scale entry is 0: its block dequantizes to 0; a global, per-tensor or activation scale of 0 zeroes "
              "the whole tensor, or gives inf where a loader divides by it."),
    "SC104": ("scale-subnormal", "warning",
              "A scale entry is subnormal in its format (an E8M0 code 0 is 2^-127): 0 wherever subnormals are "
              "flushed, or where a consumer builds an E8M0 scale by a shift."),
    "SC201": ("global-scale-convention", "error",
              "A global scale is on the wrong side of its layout's convention: ModelOpt stores amax/(6*448), under 1 "
              "(loaders assert weight_scale_2 < 1); compressed-tensors stores (6*448)/amax, over 1. The other side "
              "is the other toolchain's reciprocal, or an uncalibrated 1.0."),
    "SC301": ("scale-shape", "error",
              "A scale's shape does not match its weight: block-scale columns must be ceil(in_features / block), "
              "and FP4 weights hold two values a byte (in_features = 2 x packed columns)."),
    "SC302": ("scale-dtype", "error", "A scale is stored in a dtype its layout's loaders do not read it as."),
    "SC401": ("claimed-twice", "error",
              "A module is claimed by two quantization groups at the same precedence, or by a group and the "
              "ignore list: which scheme a loader applies depends on the order of a JSON object."),
    "SC402": ("layout-mismatch", "error",
              "The quantization config gives a module another format than its tensors are stored in, or none."),
    "SC501": ("missing-scale", "error",
              "A quantized weight lacks a scale its layout needs (per expert too): loaders fill it with 0 "
              "(1/0 = inf) or a NaN sentinel."),
}


@dataclass(frozen=True)
class ScaleFinding:
    """One check firing at one tensor. Names and messages are raw, as the checkpoint spells them; a report for
    people escapes them (escape.printable)."""

    rule: str
    severity: str
    tensor: str
    file: str
    message: str
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return RULES[self.rule][0]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.rule, "name": self.name, "severity": self.severity, "tensor": self.tensor,
                "file": self.file, "message": self.message, "values": self.values}


@dataclass
class ScaleTensor:
    """One scale tensor read: whose scale it is, how its bytes were decoded, and its counts (None: an integer
    dtype no layout gives a meaning to, not counted)."""

    tensor: TensorInfo
    unit: str
    layout: str | None
    role: str
    decode: str
    counts: Counts | None

    def to_dict(self) -> dict[str, Any]:
        c = self.counts
        numbers = {"count": c.count, **{k: getattr(c, k) for k in Counts.KINDS}, "min": c.min, "max": c.max,
                   "first": {k: unravel(v, self.tensor.shape) for k, v in c.first.items()}} if c else {}
        return {"name": self.tensor.name, "file": self.tensor.file, "unit": self.unit, "layout": self.layout,
                "role": self.role, "dtype": self.tensor.dtype, "read_as": self.decode,
                "shape": list(self.tensor.shape), "counted": c is not None, **numbers}

