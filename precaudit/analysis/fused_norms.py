"""What the fused normalization ops of ONNX and onnxruntime do with their epsilon, from their specs."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FUSED_NORMS", "NormSpec"]


@dataclass(frozen=True)
class NormSpec:
    """How one fused norm op stores its eps, where it adds it, and which dtype its statistics use."""

    norm: str  # family name users know: LayerNorm, RMSNorm, ...
    eps_attr: str | None  # attribute holding the eps; None if the op has none
    eps_default: float | None  # value when the attribute is absent (from the op's schema)
    placement: str  # inside_sqrt | outside_sqrt | inside_pow | missing
    stash_since: int | None = None  # opset from which a stash_type attribute sets the statistics dtype
    fixed_eps: float | None = None  # an eps the spec hard-codes (MeanVarianceNormalization)
    fp32_accumulate: str | None = None  # why the kernels compute statistics in float32 regardless of input
    eps_role: str = "eps"  # what the user calls the constant ("bias" for LRN)


_ORT_FP32 = "onnxruntime's kernels accumulate its statistics in float32"

FUSED_NORMS: dict[tuple[str, str], NormSpec] = {
    ("", "LayerNormalization"): NormSpec("LayerNorm", "epsilon", 1e-5, "inside_sqrt", stash_since=17),
    ("", "RMSNormalization"): NormSpec("RMSNorm", "epsilon", 1e-5, "inside_sqrt", stash_since=23),
    ("", "GroupNormalization"): NormSpec("GroupNorm", "epsilon", 1e-5, "inside_sqrt", stash_since=21),
    ("", "BatchNormalization"): NormSpec("BatchNorm", "epsilon", 1e-5, "inside_sqrt"),
    ("", "InstanceNormalization"): NormSpec("InstanceNorm", "epsilon", 1e-5, "inside_sqrt"),
    # y = x / ||x||_p: the spec has no eps at all, so an all-zero row is 0/0.
    ("", "LpNormalization"): NormSpec("LpNorm", None, None, "missing"),
    # The spec's function body: (X - E[X]) / (sqrt(Var[X]) + 1e-9).
    ("", "MeanVarianceNormalization"): NormSpec("MeanVarianceNorm", None, None, "outside_sqrt", fixed_eps=1e-9),
    # y = x / (bias + alpha/size * sum(x^2))^beta: bias plays the eps.
    ("", "LRN"): NormSpec("LRN", "bias", 1.0, "inside_pow", eps_role="bias"),
    ("com.microsoft", "LayerNormalization"): NormSpec("LayerNorm", "epsilon", 1e-5, "inside_sqrt", stash_since=1),
    ("com.microsoft", "SimplifiedLayerNormalization"): NormSpec("RMSNorm", "epsilon", 1e-5, "inside_sqrt", stash_since=1),
    ("com.microsoft", "SkipLayerNormalization"): NormSpec("LayerNorm", "epsilon", 1e-12, "inside_sqrt", fp32_accumulate=_ORT_FP32),
    ("com.microsoft", "SkipSimplifiedLayerNormalization"): NormSpec("RMSNorm", "epsilon", 1e-12, "inside_sqrt", fp32_accumulate=_ORT_FP32),
    ("com.microsoft", "GroupNorm"): NormSpec("GroupNorm", "epsilon", 1e-5, "inside_sqrt", fp32_accumulate=_ORT_FP32),
    ("com.microsoft", "SkipGroupNorm"): NormSpec("GroupNorm", "epsilon", 1e-5, "inside_sqrt", fp32_accumulate=_ORT_FP32),
}
