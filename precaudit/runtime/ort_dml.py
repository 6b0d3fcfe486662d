"""onnxruntime's DirectML execution provider: LayerNormalization ignores stash_type.

Read in onnxruntime core/providers/dml/DmlExecutionProvider/src/Operators/DmlOperatorLayerNormalization.cpp (reads
epsilon and axis only; DML_OPERATOR_MEAN_VARIANCE_NORMALIZATION1 in the input's dtype, Casts only for mixed input
and scale types) and issue #17692 (variance 246,419 broke a float16 model; still open). No DirectML device here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Fact, Kernel, Runtime

if TYPE_CHECKING:
    from ..dtypes import Format
    from ..ir import Graph, Node

__all__ = ["OrtDml"]

STASH_IGNORED = Fact(
    "layer-norm-stash-type-ignored", "LayerNormalization ignores stash_type: a float16 input computes its mean and "
    "variance in float16", "onnxruntime DmlOperatorLayerNormalization.cpp (stash_type never read); issue #17692")


FUSED_STASH_IGNORED = Fact(
    "layer-norm-fusion-stash-ignored", "a decomposed LayerNorm is fused into one LayerNormalization, which then "
    "ignores stash_type too: its statistics stay float16", "onnxruntime core/optimizer/layer_norm_fusion.cc "
    "(Level 2, registered for DirectML per issue #31626); DmlOperatorLayerNormalization.cpp")


class OrtDml(Runtime):
    name = "ort-dml"
    title = "onnxruntime DirectML"
    versions = ("1.32",)
    facts = (STASH_IGNORED, FUSED_STASH_IGNORED)

    def fuses_layer_norm(self, root: Node, graph: Graph) -> Kernel | None:
        return Kernel(FUSED_STASH_IGNORED, statistics="input")

    def kernel(self, node: Node, held: Format, graph: Graph) -> Kernel | None:
        if node.op_type == "LayerNormalization" and not node.domain:
            return Kernel(STASH_IGNORED, statistics="input")
        return None
