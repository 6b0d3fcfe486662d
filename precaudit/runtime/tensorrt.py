"""TensorRT: 10 honours a LayerNormalization's stash_type; 11 is strongly typed, and a node computes in exactly the
dtype its inputs are cast to.

Read in NVIDIA/TensorRT include/NvInfer.h at v10.16 (INormalizationLayer::setComputePrecision: "defaults to
kFLOAT"; a strongly typed network rejects it) and at v11.0 (no setComputePrecision; "the network is always strongly
typed"), the TensorRT 11.0.0 release notes (weak typing and BuilderFlag::kFP16 removed; mixed precision by ModelOpt
AutoCast), and onnx-tensorrt 10.1's LayerNormalization importer (stash_type → setComputePrecision). Whether the 11.x
ONNX parser casts for stash_type was not read: the model takes the strongly typed rule as written. No GPU here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Fact, Kernel, Runtime

if TYPE_CHECKING:
    from ..dtypes import Format
    from ..ir import Graph, Node

__all__ = ["TensorRT"]

_NORMS = {"LayerNormalization", "GroupNormalization", "InstanceNormalization", "RMSNormalization"}

STASH_HONOURED = Fact(
    "normalization-compute-precision", "a normalization computes its statistics in stash_type's dtype (float32 by "
    "default) through INormalizationLayer::setComputePrecision", "NVIDIA/TensorRT NvInfer.h v10.16; onnx-tensorrt "
    "10.1 onnxOpImporters.cpp (LayerNormalization)", until="11")
STRONGLY_TYPED = Fact(
    "strongly-typed", "networks are strongly typed: a normalization computes in its input's dtype unless the graph "
    "casts it (setComputePrecision is gone); nothing widens", "NVIDIA/TensorRT NvInfer.h v11.0; TensorRT 11.0.0 "
    "release notes", since="11")


class TensorRT(Runtime):
    name = "tensorrt"
    title = "TensorRT"
    versions = ("10", "11")
    facts = (STASH_HONOURED, STRONGLY_TYPED)

    def kernel(self, node: Node, held: Format, graph: Graph) -> Kernel | None:
        if node.op_type not in _NORMS or node.domain:
            return None
        if self.holds(STRONGLY_TYPED):
            return Kernel(STRONGLY_TYPED, statistics="input", eps="input")
        return None
