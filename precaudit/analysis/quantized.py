"""Which parts of a model are quantized: QDQ pairs, integer ops, and the float parts the audit judges.

An int8 model is audited like any other, but its report says so: the integer ops (MatMulInteger, QLinearConv, ...)
compute in integers whatever --dtype says, so the audit judges the float parts around them (scales, rescales,
norms, softmaxes) and the Casts that turn an integer accumulator back into a float, which a float16 converter
makes float16: an int8 x int8 sum over K terms reaches K * 127 * 128 (16,256 per term), beyond 65504 from K = 5.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..dtypes import COMPUTED, ELEMENTS, FORMATS
from ..ir import Graph, Node

__all__ = ["Quantization", "quantization", "QDQ_OPS", "INTEGER_OPS", "TRT_QDQ_OPS"]

# ModelOpt's TensorRT ops (domain trt; modelopt/torch/quantization/export_onnx.py and onnx/quantization/qdq_utils.py)
TRT_QDQ_OPS = ("TRT_FP8QuantizeLinear", "TRT_FP8DequantizeLinear", "TRT_FP4DynamicQuantize", "TRT_FP4QDQ",
               "TRT_MXFP8DynamicQuantize", "TRT_MXFP8DequantizeLinear", "TRT_INT4QuantizeLinear",
               "TRT_INT4DequantizeLinear")
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", *TRT_QDQ_OPS)
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
    blocks: dict[str, int] = field(default_factory=dict)  # block-scaled data ("float4_e2m1fn in blocks of 16"): nodes

    def describe(self) -> str:
        ops = ", ".join(f"{n} {op}" for op, n in self.ops.items())
        casts = (f"; {len(self.accumulator_casts)} Cast{'s' * (len(self.accumulator_casts) != 1)} of an integer "
                 "accumulator to float, which a float16 converter makes float16" if self.accumulator_casts else "")
        n = self.integer_nodes
        blocks = "".join(f"; {k} node{'s' * (k != 1)} with {data}" for data, k in self.blocks.items())
        return (f"quantized ({ops}{blocks}): {n} node{'s' * (n != 1)} compute{'s' * (n == 1)} in integers and "
                f"{'is' if n == 1 else 'are'} not judged as float; the audit covers the {self.float_nodes} float nodes (scales, "
                f"rescales, norms, softmaxes){casts}")

    def record(self) -> dict:
        return {"ops": dict(self.ops), "integer_nodes": self.integer_nodes, "float_nodes": self.float_nodes,
                "accumulator_casts": list(self.accumulator_casts), **({"blocks": dict(self.blocks)} if self.blocks else {})}


_ACCUMULATORS = ("MatMulInteger", "ConvInteger")


def quantization(graph: Graph) -> Quantization | None:
    """The model's quantized parts, or None when it has none."""
    found = Quantization()
    for node in graph.nodes:
        if node.op_type in QDQ_OPS or node.op_type in INTEGER_OPS:
            found.ops[node.op_type] = found.ops.get(node.op_type, 0) + 1
            data = _blocked_data(node)
            if data is not None:
                found.blocks[data] = found.blocks.get(data, 0) + 1
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


# ModelOpt's ops that quantize in blocks, and the format they use
_TRT_BLOCKED = {"TRT_FP4DynamicQuantize": ("nvfp4", 16), "TRT_FP4QDQ": ("nvfp4", 16),
                "TRT_MXFP8DynamicQuantize": ("mxfp8", 32), "TRT_MXFP8DequantizeLinear": ("mxfp8", 32)}


def _blocked_data(node: Node) -> str | None:
    """What a blocked quantize or dequantize node holds its data in ("float4_e2m1fn in blocks of 16"); None for one
    that quantizes per tensor or per axis."""
    trt = _TRT_BLOCKED.get(node.op_type)
    block = int(node.attr("block_size", trt[1] if trt else 0) or 0)
    if not block:
        return None
    if trt is not None:
        return f"{FORMATS[trt[0]].long_name} blocks of {block}"
    data = node.input(0) if "Dequantize" in node.op_type else node.outputs[0]
    dtype = data.dtype if data is not None else None
    name = ELEMENTS[dtype].long_name if dtype in ELEMENTS else dtype or "data"
    return f"{name} in blocks of {block}"
