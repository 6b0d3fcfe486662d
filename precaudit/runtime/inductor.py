"""PyTorch Inductor (torch.compile): pointwise ops and reductions fuse into kernels that compute in float32, and
what passes between two fused ops is never written in half.

Read in torch 2.13: torch/_refs/__init__.py (_normalize converts to the computation dtype, float32 for half, before
var_mean), torch/_inductor/config.py (emulate_precision_casts, default False: the downcast-upcast pair between fused
low-precision ops is elided; emulate_precision_casts_on_saved_tensors, default True), torch/_inductor/lowering.py
and codegen/triton.py. Matrix products run in the input's dtype with float32 accumulation. No GPU here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Fact, Kernel, Runtime

if TYPE_CHECKING:
    from ..dtypes import Format
    from ..ir import Graph, Node, Value

__all__ = ["Inductor"]

# ops Inductor hands to an extern kernel (cuBLAS, cuDNN) or a template: their output is written in the input dtype
_EXTERN = {"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum"}

FUSED_FP32 = Fact(
    "fused-kernels-fp32", "pointwise ops and reductions fused into one kernel compute in float32 and keep what passes "
    "between them in float32 (emulate_precision_casts is off by default)",
    "torch/_inductor/config.py (emulate_precision_casts); torch/_refs/__init__.py (_normalize)")


class Inductor(Runtime):
    name = "inductor"
    title = "PyTorch Inductor"
    versions = ("2.13",)
    facts = (FUSED_FP32,)
    runs = ("torch",)

    def kernel(self, node: Node, held: Format, graph: Graph) -> Kernel | None:
        if held.name in ("fp16", "bf16") and node.op_type not in _EXTERN:
            return Kernel(FUSED_FP32, compute="fp32", statistics="fp32")
        return None

    def widened(self, value: Value, graph: Graph) -> Fact | None:
        producer = value.producer
        if producer is None or producer.op_type in _EXTERN or value in graph.outputs or not value.consumers:
            return None
        if any(c.op_type in _EXTERN for c in value.consumers):
            return None
        return FUSED_FP32
