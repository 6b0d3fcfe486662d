"""Which parts of a model are quantized: QDQ pairs, integer ops, and the float parts the audit judges.

An int8 model is audited like any other, but its report says so: the integer ops (MatMulInteger, QLinearConv, ...)
compute in integers whatever --dtype says, so the audit judges the float parts around them (scales, rescales,
norms, softmaxes) and the Casts that turn an integer accumulator back into a float, which a float16 converter
makes float16: an int8 x int8 sum over K terms reaches K * 127 * 128 (16,256 per term), beyond 65504 from K = 5.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..dtypes import COMPUTED
from ..ir import Graph

__all__ = ["Quantization", "quantization", "QDQ_OPS", "INTEGER_OPS"]

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear")
# ops whose arithmetic is integer (their float inputs, if any, are scales)
INTEGER_OPS = ("MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv", "QLinearAdd", "QLinearMul",
               "QLinearSigmoid", "QLinearLeakyRelu", "QLinearAveragePool", "QLinearGlobalAveragePool",
               "QLinearConcat", "QLinearSoftmax", "QAttention", "QGemm", "DynamicQuantizeMatMul",
               "MatMulIntegerToFloat", "MatMulNBits", "QOrderedMatMul")


@dataclass
class Quantization:
    """What is quantized in one model: op counts, and how many nodes compute in float."""

    ops: dict[str, int] = field(default_factory=dict)  # each QDQ or integer op type, and how many
    integer_nodes: int = 0  # nodes whose arithmetic is integer
    float_nodes: int = 0  # every other node with a float output: what the audit judges
    accumulator_casts: list[str] = field(default_factory=list)  # Casts of an integer accumulator to a float

    def describe(self) -> str:
        ops = ", ".join(f"{n} {op}" for op, n in self.ops.items())
        casts = (f"; {len(self.accumulator_casts)} Cast{'s' * (len(self.accumulator_casts) != 1)} of an integer "
                 "accumulator to float, which a float16 converter makes float16" if self.accumulator_casts else "")
        n = self.integer_nodes
        return (f"quantized ({ops}): {n} node{'s' * (n != 1)} compute{'s' * (n == 1)} in integers and "
                f"{'is' if n == 1 else 'are'} not judged as float; the audit covers the {self.float_nodes} float nodes (scales, "
                f"rescales, norms, softmaxes){casts}")

    def record(self) -> dict:
        return {"ops": dict(self.ops), "integer_nodes": self.integer_nodes, "float_nodes": self.float_nodes,
                "accumulator_casts": list(self.accumulator_casts)}


_ACCUMULATORS = ("MatMulInteger", "ConvInteger")


def quantization(graph: Graph) -> Quantization | None:
    """The model's quantized parts, or None when it has none."""
    found = Quantization()
    for node in graph.nodes:
        if node.op_type in QDQ_OPS or node.op_type in INTEGER_OPS:
            found.ops[node.op_type] = found.ops.get(node.op_type, 0) + 1
            if node.op_type in INTEGER_OPS:
                found.integer_nodes += 1
                continue
        if any(v.dtype in COMPUTED for v in node.outputs if v is not None):
            found.float_nodes += 1
        source = node.input(0)
        if node.op_type == "Cast" and source is not None:
            producer = source.producer
            if producer is not None and producer.op_type in _ACCUMULATORS:
                found.accumulator_casts.append(node.name)
    return found if found.ops else None
