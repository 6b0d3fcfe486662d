"""OpenVINO's CPU plugin: nothing computes in float16; on CPUs with bfloat16 (AVX512_BF16, AMX) the default
inference precision runs MatMul, Convolution and the fused LayerNorm (MVN) in bfloat16.

Measured here with the openvino wheel 2026.4.1 on an x86_64 CPU with avx512_bf16 (tests/test_runtime_openvino.py
measures it again where the wheel is installed): INFERENCE_PRECISION_HINT defaults to bf16; an fp32 MatMul runs as a
bf16 FullyConnected (relative error 2e-3 against float64); a decomposed float16 LayerNorm with |x - mean| 800 is
fused into an MVN computed in f32 and its output is finite; float32 subnormals are kept. Constants a float16 file
stores keep their float16 values (an eps stored as 0.0 stays 0.0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Fact, Kernel, Runtime

if TYPE_CHECKING:
    from ..dtypes import Format
    from ..ir import Graph, Node, Value

__all__ = ["OpenVinoCpu"]

_BF16_OPS = {"MatMul", "Gemm", "Conv", "ConvTranspose"}
_NORMS = {"LayerNormalization", "GroupNormalization", "InstanceNormalization", "MeanVarianceNormalization"}

NO_FP16 = Fact(
    "cpu-no-fp16", "the CPU plugin computes a float16 model in its inference precision (float32, or bfloat16 for "
    "matrix products and normalizations): no op computes in float16; a decomposed LayerNorm is fused into MVN",
    "measured: openvino 2026.4.1 CPU plugin, runtime model layerType/runtimePrecision")
BF16_HINT = Fact(
    "cpu-bf16-hint", "on a CPU with bfloat16 support INFERENCE_PRECISION_HINT defaults to bf16: MatMul, Convolution "
    "and MVN run in bfloat16 (relative error 2e-3 to 7e-3 against float32)",
    "measured: openvino 2026.4.1 on avx512_bf16 (core.get_property('CPU', 'INFERENCE_PRECISION_HINT'))")
SUBNORMALS_KEPT = Fact(
    "cpu-subnormals-kept", "float32 subnormals are kept under both hints", "measured: openvino 2026.4.1, Add(x, 0) "
    "keeps 1e-40")


class OpenVinoCpu(Runtime):
    name = "openvino-cpu"
    title = "OpenVINO CPU"
    versions = ("2026.4",)
    facts = (NO_FP16, BF16_HINT, SUBNORMALS_KEPT)

    def kernel(self, node: Node, held: Format, graph: Graph) -> Kernel | None:
        if node.op_type in _BF16_OPS:
            return Kernel(BF16_HINT, compute="bf16")
        if node.op_type in _NORMS:
            return Kernel(BF16_HINT, statistics="bf16")
        if held.name == "fp16":
            return Kernel(NO_FP16, compute="fp32")
        return None

    def widened(self, value: Value, graph: Graph) -> Fact | None:
        if value in graph.outputs or value.producer is None:
            return None
        return NO_FP16
