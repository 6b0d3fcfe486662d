"""What the fused normalization ops of ONNX and onnxruntime do with their epsilon, and which of their inputs are
parameters, from their specs."""

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
    # its parameter inputs (input index, what it is): one number per channel, which the static audit reads (their
    # float16 range, analysis/sites/weight.py) where it reads no other weight
    params: tuple[tuple[int, str], ...] = ()


_ORT_FP32 = "onnxruntime's kernels accumulate its statistics in float32"
_SCALE, _SCALE_BIAS = ((1, "scale"),), ((1, "scale"), (2, "bias"))

FUSED_NORMS: dict[tuple[str, str], NormSpec] = {
    ("", "LayerNormalization"): NormSpec("LayerNorm", "epsilon", 1e-5, "inside_sqrt", stash_since=17,
                                         params=_SCALE_BIAS),
    ("", "RMSNormalization"): NormSpec("RMSNorm", "epsilon", 1e-5, "inside_sqrt", stash_since=23,
                                       params=_SCALE),
    ("", "GroupNormalization"): NormSpec("GroupNorm", "epsilon", 1e-5, "inside_sqrt", stash_since=21,
                                         params=_SCALE_BIAS),
    ("", "BatchNormalization"): NormSpec("BatchNorm", "epsilon", 1e-5, "inside_sqrt", params=(
        (1, "scale"), (2, "bias"), (3, "running mean"), (4, "running variance"))),
    ("", "InstanceNormalization"): NormSpec("InstanceNorm", "epsilon", 1e-5, "inside_sqrt", params=_SCALE_BIAS),
    # y = x / ||x||_p: the spec has no eps at all, so an all-zero row is 0/0.
    ("", "LpNormalization"): NormSpec("LpNorm", None, None, "missing"),
    # The spec's function body: (X - E[X]) / (sqrt(Var[X]) + 1e-9).
    ("", "MeanVarianceNormalization"): NormSpec("MeanVarianceNorm", None, None, "outside_sqrt", fixed_eps=1e-9),
    # y = x / (bias + alpha/size * sum(x^2))^beta: bias plays the eps.
    ("", "LRN"): NormSpec("LRN", "bias", 1.0, "inside_pow", eps_role="bias"),
    ("com.microsoft", "LayerNormalization"): NormSpec("LayerNorm", "epsilon", 1e-5, "inside_sqrt", stash_since=1,
                                                      params=_SCALE_BIAS),
    ("com.microsoft", "SimplifiedLayerNormalization"): NormSpec("RMSNorm", "epsilon", 1e-5, "inside_sqrt", stash_since=1,
                                                                params=_SCALE),
    ("com.microsoft", "SkipLayerNormalization"): NormSpec("LayerNorm", "epsilon", 1e-12, "inside_sqrt", fp32_accumulate=_ORT_FP32,
                                                          params=((2, "gamma"), (3, "beta"), (4, "bias"))),
    ("com.microsoft", "SkipSimplifiedLayerNormalization"): NormSpec("RMSNorm", "epsilon", 1e-12, "inside_sqrt", fp32_accumulate=_ORT_FP32,
                                                                    params=((2, "gamma"), (3, "bias"))),
    ("com.microsoft", "GroupNorm"): NormSpec("GroupNorm", "epsilon", 1e-5, "inside_sqrt", fp32_accumulate=_ORT_FP32),
    ("com.microsoft", "SkipGroupNorm"): NormSpec("GroupNorm", "epsilon", 1e-5, "inside_sqrt", fp32_accumulate=_ORT_FP32),
}
