"""onnxruntime's WebGPU execution provider: a decomposed LayerNorm from an opset < 17 export runs unfused, op by
op, in float16; its fused LayerNormalization sums in float32 but normalizes with a float16 mean and 1/sigma.

Read in onnxruntime issue #31626 (whisper on WebGPU: |x - mean| 795 squared to about 630,000, variance +inf, outputs
with 0 inf and 0 NaN; the Level-2 LayerNormFusion was registered for CPU, ACL, CUDA and DML only), PR #32294 (adds
WebGPU to it: merged, but which release first ships it was not established, so no version here is modelled as
fused), core/providers/webgpu/nn/layer_norm.cc and contrib_ops/webgpu/bert/skip_layer_norm.cc. No GPU here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Fact, Kernel, Runtime

if TYPE_CHECKING:
    from ..dtypes import Format
    from ..ir import Graph, Node

__all__ = ["OrtWebGpu"]

UNFUSED = Fact(
    "decomposed-layer-norm-unfused", "a decomposed LayerNorm is not fused for this EP: each op runs in the dtype it "
    "reads (Pow, ReduceMean, Sqrt in float16)", "onnxruntime issue #31626 (layer_norm_fusion.cc: Level 1 bails below "
    "opset 17, Level 2 not registered for WebGPU); PR #32294 (release not established)")
LAYER_NORM_SHADER = Fact(
    "layer-norm-shader", "LayerNormalization sums x and x² in float32, but normalizes with the mean and 1/sigma "
    "rounded to the input's dtype", "onnxruntime core/providers/webgpu/nn/layer_norm.cc")


FUSED_FROM_17 = Fact(
    "layer-norm-fusion-from-opset-17", "from opset 17 a decomposed LayerNorm is fused by the Level-1 LayerNormFusion "
    "into LayerNormalization (float32 sums); below opset 17 it is not", "onnxruntime issue #31626 "
    "(layer_norm_fusion.cc bails below opset 17 at Level 1)")


class OrtWebGpu(Runtime):
    name = "ort-webgpu"
    title = "onnxruntime WebGPU"
    versions = ("1.32",)
    facts = (UNFUSED, FUSED_FROM_17, LAYER_NORM_SHADER)

    def fuses_layer_norm(self, root: Node, graph: Graph) -> Kernel | None:
        if root.opset is not None and root.opset >= 17:
            return Kernel(FUSED_FROM_17, statistics="fp32")
        return None

    def kernel(self, node: Node, held: Format, graph: Graph) -> Kernel | None:
        if node.op_type in ("LayerNormalization", "SimplifiedLayerNormalization") and not node.domain:
            return Kernel(LAYER_NORM_SHADER, statistics="fp32")
        return None
