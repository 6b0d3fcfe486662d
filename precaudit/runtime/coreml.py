"""Core ML through coremltools (mlprogram, compute_precision FLOAT16, the default): every op computes in float16,
and a small constant that float16 rounds to 0 is bumped to the smallest subnormal.

Read in apple/coremltools (HEAD e0e2f42b, 9.1.dev1; 9.0 tagged 2025-11-04):
converters/mil/mil/passes/defs/quantization.py (FP16ComputePrecision casts every float32 input of an op, a norm's
epsilon, gamma and beta included; _check_underflow_to_zero: a constant of fewer than 400 elements that is not ≈0 in
float32 but 0 in float16 becomes ±5.96e-8 — 1e-45 counts as ≈0 in float32 and becomes 0), ops/defs/iOS17/
normalization.py, and the MIL defaults it inserts (log 1e-45, rsqrt 1e-12, inverse 1e-4; kept float32 on iOS 17+).
coremltools converts PyTorch models, not ONNX files; it converts on Linux but cannot run the model here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..converters import Clamp
from ..dtypes import FORMATS
from .base import Fact, Runtime

if TYPE_CHECKING:
    from ..dtypes import Format

__all__ = ["CoreMl", "CoremlBump"]

FP16_PRECISION = Fact(
    "coreml-fp16-compute-precision", "compute_precision FLOAT16 (the default for mlprogram) casts every float32 "
    "input of an op to float16, a normalization's eps, gamma and beta included",
    "coremltools converters/mil/mil/passes/defs/quantization.py (FP16ComputePrecision); ops/defs/iOS17/normalization.py")
UNDERFLOW_BUMP = Fact(
    "coreml-underflow-bump", "a constant of fewer than 400 elements that float16 rounds to 0 (and is not 0 in "
    "float32) becomes ±5.96e-8, the smallest float16 subnormal: eps 1e-12 is 5.96e-8, not 0.0",
    "coremltools quantization.py (_check_underflow_to_zero)")
INSERTED_EPS = Fact(
    "coreml-inserted-eps", "the converter writes eps of its own: log(x + 1e-45) (0.0 in float16 below iOS 17), "
    "rsqrt(x + 1e-12), 1/(x + 1e-4) for torch.reciprocal (9.0 and earlier)",
    "coremltools ops/defs/iOS15/elementwise_unary.py; frontend/torch/ops.py")


@dataclass(frozen=True)
class CoremlBump(Clamp):
    """_check_underflow_to_zero: not ≈0 in float32 (|v| above float32's smallest subnormal) but 0 in float16 →
    ±5.96e-8; nothing else changes (9.0 leaves overflow to inf)."""

    def apply(self, value: float) -> float:
        fp16 = FORMATS["fp16"]
        if abs(value) > FORMATS["fp32"].smallest_subnormal and abs(value) <= fp16.smallest_subnormal / 2:
            return fp16.smallest_subnormal if value > 0 else -fp16.smallest_subnormal
        return value


BUMP = CoremlBump(0.0, float("inf"), "coremltools bumps a small constant that float16 rounds to 0 to ±5.96e-8",
                  by="coremltools FLOAT16 (_check_underflow_to_zero)")


class CoreMl(Runtime):
    name = "coreml"
    title = "Core ML (coremltools FLOAT16)"
    versions = ("9.0",)
    facts = (FP16_PRECISION, UNDERFLOW_BUMP, INSERTED_EPS)
    runs = ("torch",)

    def target(self, fmt: Format) -> tuple[Format, Fact | None]:
        return FORMATS["fp16"], FP16_PRECISION

    def clamp(self, fmt: Format) -> Clamp | None:
        return BUMP if fmt.name == "fp16" else None
