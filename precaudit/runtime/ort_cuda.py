"""onnxruntime's CUDA execution provider: ops compute in their input's dtype, normalizations and reductions
accumulate in float32 — but SkipLayerNormalization kept float16 statistics until 1.27.

Read in onnxruntime contrib_ops/cuda/bert/skip_layer_norm_impl.cu (before PR #28682: cub::KeyValuePair<T, T> sums
and maybe2half<T>(epsilon)), PR #28682 "Use fp32 accumulation in SkipLayerNorm/EmbedLayerNorm CUDA kernels" (merged
2026-05-27; first released in 1.27.0, per the maintainer's word on issue #29034 and the release branch dates),
core/providers/cuda/nn/layer_norm.cc and layer_norm_impl.cu (LayerNorm<T, U=float>, U(epsilon)), and
core/providers/cuda/reduction/reduction_ops.cc (cudnnReduceTensor with a float compute type for float16).
No GPU here: nothing in this module is measured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Fact, Kernel, Runtime

if TYPE_CHECKING:
    from ..dtypes import Format
    from ..ir import Graph, Node

__all__ = ["OrtCuda"]

_MS = "com.microsoft"
_SKIP = {(_MS, "SkipLayerNormalization"), (_MS, "SkipSimplifiedLayerNormalization")}
_LAYER_NORMS = {("", "LayerNormalization"), ("", "SimplifiedLayerNormalization")}

SKIP_HALF = Fact(
    "skip-layer-norm-fp16-accumulator", "SkipLayerNormalization and SkipSimplifiedLayerNormalization sum x and x² in "
    "float16 and round eps to float16: mean(x²) overflows once a row's RMS passes 256, and the output is all "
    "zeros (issue #29034; fixed in 1.27, and before it ORT_ENABLE_SKIP_LAYER_NORM_STRICT_MODE=1 computes them in "
    "float32)", "onnxruntime contrib_ops/cuda/bert/skip_layer_norm_impl.cu before PR #28682; issue #29034 "
    "(1.24.2)", until="1.27")
SKIP_FLOAT = Fact(
    "skip-layer-norm-fp32-accumulator", "SkipLayerNormalization and SkipSimplifiedLayerNormalization accumulate in "
    "float32 with eps a float", "onnxruntime PR #28682 (merged 2026-05-27, in 1.27.0)", since="1.27")
EMBED_EPS_HALF = Fact(
    "embed-layer-norm-eps-fp16", "EmbedLayerNormalization holds eps in the input's dtype (1e-12 is 0.0 in float16)",
    "onnxruntime contrib_ops/cuda/bert/embed_layer_norm_impl.cu before PR #28682 (const T epsilon)", until="1.27")
LAYER_NORM_FLOAT = Fact(
    "layer-norm-fp32-statistics", "LayerNormalization computes its statistics in float32 (U = float) whatever "
    "stash_type says, with eps a float", "onnxruntime core/providers/cuda/nn/layer_norm.cc, layer_norm_impl.cu "
    "(LayerNorm<T, float>, U(epsilon))")
REDUCE_FLOAT = Fact(
    "reductions-fp32-accumulator", "ReduceSum, ReduceMean and Softmax accumulate float16 in float32, and write their "
    "result in float16", "onnxruntime core/providers/cuda/reduction/reduction_ops.cc (cudnnReduceTensor, float "
    "compute type), core/providers/cuda/math/softmax_impl.cu (acc_t)")
FUSED_LAYER_NORM = Fact(
    "layer-norm-fusion", "a decomposed LayerNorm (ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div) is fused "
    "into one LayerNormalization, whose statistics are float32", "onnxruntime core/optimizer/layer_norm_fusion.cc "
    "(registered for the CPU, ACL, CUDA and DirectML EPs at Level 2, per issue #31626)")
ELEMENTWISE = Fact(
    "elementwise-in-input-dtype", "elementwise ops (Pow, Mul, Add, Exp, Sqrt, Div) compute in the dtype their "
    "inputs are held in", "onnxruntime core/providers/cuda/math/binary_elementwise_ops.cc, unary_elementwise_ops.cc")


class OrtCuda(Runtime):
    name = "ort-cuda"
    title = "onnxruntime CUDA"
    versions = ("1.26", "1.27", "1.32")
    facts = (SKIP_HALF, SKIP_FLOAT, EMBED_EPS_HALF, LAYER_NORM_FLOAT, FUSED_LAYER_NORM, REDUCE_FLOAT, ELEMENTWISE)

    def fuses_layer_norm(self, root: Node, graph: Graph) -> Kernel | None:
        return Kernel(FUSED_LAYER_NORM, statistics="fp32")

    def kernel(self, node: Node, held: Format, graph: Graph) -> Kernel | None:
        op = (node.domain or "", node.op_type)
        if op in _SKIP:
            if self.holds(SKIP_HALF) and held.name in ("fp16", "bf16"):
                return Kernel(SKIP_HALF, statistics="input", eps="input")
            return Kernel(SKIP_FLOAT, statistics="fp32")
        if op == (_MS, "EmbedLayerNormalization") and self.holds(EMBED_EPS_HALF):
            return Kernel(EMBED_EPS_HALF, eps="input")
        if op in _LAYER_NORMS:
            return Kernel(LAYER_NORM_FLOAT, statistics="fp32")
        return None
