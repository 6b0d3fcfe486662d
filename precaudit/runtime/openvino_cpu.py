"""OpenVINO's CPU plugin, 2026.4, on a CPU with bfloat16 (AVX512_BF16 or AMX): nothing computes in float16, and the
default inference precision runs everything but the graph's tail in bfloat16.

Read in openvinotoolkit/openvino src/plugins/intel_cpu/src/graph.cpp @473faca3 (Graph::EnforceInferencePrecision):
walking back from each graph output, every node met before a Convolution, FullyConnected, MatMul, RNN, ROIPooling or
Interpolate (the tail) keeps float32; every other node's float32 inputs and outputs are set to bf16, but for an
input read from a constant, and an elementwise kernel's input read from a graph input. Measured here with openvino
2026.4.1 on avx512_bf16 (tests/test_runtime_openvino.py measures it again where the wheel is installed, from the
runtime model's runtimePrecision and outputPrecisions and from the outputs): INFERENCE_PRECISION_HINT defaults to
bf16. A MatMul reads its inputs and its weights rounded to bfloat16, sums in float32 (relative error 2e-3 against
float64) and writes bfloat16, but to a float32 graph output it writes float32; a bias Add after it is part of the
same FullyConnected. Outside the tail what passes between kernels is bfloat16, but elementwise ops fused into one
Snippets kernel keep what passes between them in float32 (Mul then Exp before a MatMul: the Exp's input is not
rounded). MVN (the plugin's LayerNorm, and what a decomposed LayerNorm is fused into) keeps its statistics in
float32: outside the tail it is bit for bit a float32 LayerNorm of the bfloat16 input, rounded to bfloat16. The tail
computes in float32: an elementwise-only graph gives the f32 hint's outputs bit for bit, and a decomposed float16
LayerNorm with |x - mean| 800 at the outputs is a float32 MVN with finite outputs. A float16 graph runs so too (its
inputs converted at the edge, its outputs converted back; an eps it stores as 0.0 stays 0.0); float32 subnormals are
kept.

Not modelled: a Mul by a constant after a MatMul is folded into the weights before they are rounded to bfloat16;
which elementwise ops Snippets fuses is approximated (an elementwise op whose readers are all elementwise); the
float32 sums run in another order than numpy's (a float32 output differs in its last bits, 8e-5 of the bfloat16
error); OpenVINO's own Exp, its Div by a constant (a Mul by the reciprocal) and its Mul-then-Add (one FMA) differ
from numpy's in the last bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..analysis.constants import is_constant
from .base import Fact, Kernel, Runtime

if TYPE_CHECKING:
    from ..dtypes import Format
    from ..ir import Graph, Node, Value

__all__ = ["OpenVinoCpu", "STOPS", "BF16_KERNELS"]

# where EnforceInferencePrecision's walk back from the outputs stops (graph.cpp's list, as the ONNX ops that become
# those nodes): what lies beyond one of them is not the tail
STOPS = frozenset({"MatMul", "Gemm", "Conv", "LSTM", "GRU", "RNN", "Resize", "MaxRoiPool"})
# kernels that read every float input, weights included, rounded to bfloat16 and accumulate in float32
BF16_KERNELS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"})
_NORMS = frozenset({"LayerNormalization", "GroupNormalization", "InstanceNormalization", "MeanVarianceNormalization"})
# elementwise ops Snippets fuses into one kernel, which keeps what passes between them in float32
_ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Exp", "Log", "Sqrt", "Abs", "Neg", "Relu", "Sigmoid", "Tanh", "Erf", "Clip",
    "Max", "Min", "Floor", "Ceil", "Round", "Reciprocal", "Gelu", "Elu", "LeakyRelu", "Softplus", "HardSigmoid",
    "HardSwish", "Mish", "PRelu", "Selu", "Where", "Cast", "Sin", "Cos"})

_SOURCE = "openvino src/plugins/intel_cpu/src/graph.cpp (Graph::EnforceInferencePrecision)"
BF16_HINT = Fact(
    "cpu-bf16-hint", "on a CPU with bfloat16 support INFERENCE_PRECISION_HINT defaults to bf16",
    "measured: openvino 2026.4.1 on avx512_bf16 (core.get_property('CPU', 'INFERENCE_PRECISION_HINT'))")
TAIL_FP32 = Fact(
    "cpu-tail-fp32", "the graph's tail (every node a graph output is reached from without passing a MatMul, Gemm, "
    "Convolution, RNN or Resize) computes in float32, a float16 graph's too",
    f"{_SOURCE}; measured: openvino 2026.4.1, an elementwise-only graph gives the f32 hint's outputs bit for bit")
BF16_MATMUL = Fact(
    "cpu-bf16-matmul", "MatMul, Gemm and Convolution read their inputs and weights rounded to bfloat16, accumulate in "
    "float32 and write bfloat16 (a float32 graph output directly); a bias Add after one is part of its kernel",
    f"{_SOURCE}; measured: openvino 2026.4.1, FullyConnected runtimePrecision bf16, relative error 2e-3 against float64")
BF16_BETWEEN = Fact(
    "cpu-bf16-between-kernels", "outside the tail what passes between kernels is held in bfloat16; elementwise ops "
    "fused into one kernel keep what passes between them in float32",
    f"{_SOURCE}; measured: openvino 2026.4.1, runtime model outputPrecisions bf16, a fused Mul and Exp")
MVN_FP32 = Fact(
    "cpu-mvn-fp32-statistics", "MVN (LayerNormalization, and a decomposed LayerNorm fused into it) keeps its "
    "statistics in float32; outside the tail it reads and writes bfloat16",
    "measured: openvino 2026.4.1, a LayerNormalization before a MatMul is bit for bit float32 statistics of the "
    "bfloat16 input, rounded to bfloat16")
SUBNORMALS_KEPT = Fact(
    "cpu-subnormals-kept", "float32 subnormals are kept under both hints", "measured: openvino 2026.4.1, Add(x, 0) "
    "keeps 1e-40")


@dataclass(frozen=True)
class _Parts:
    """How the plugin splits one graph: its tail, and the bias Adds fused into the MatMul or Gemm before them."""

    tail: frozenset[int]  # id(node)
    bias: dict[int, int]  # id(MatMul) -> id(its bias Add)


class OpenVinoCpu(Runtime):
    name = "openvino-cpu"
    title = "OpenVINO CPU"
    versions = ("2026.4",)
    facts = (BF16_HINT, TAIL_FP32, BF16_MATMUL, BF16_BETWEEN, MVN_FP32, SUBNORMALS_KEPT)

    def __init__(self, version: str, asked: str | None = None):
        super().__init__(version, asked)
        self._parts: dict[int, _Parts] = {}  # id(graph) -> its parts

    def fuses_layer_norm(self, root: Node, graph: Graph) -> Kernel | None:
        return Kernel(MVN_FP32, statistics="fp32")

    def kernel(self, node: Node, held: Format, graph: Graph) -> Kernel | None:
        parts = self._split(graph)
        narrow = held.name in ("fp16", "bf16")
        compute = "fp32" if narrow else None
        if node.op_type in BF16_KERNELS and id(_top(node)) not in parts.tail:
            return Kernel(BF16_MATMUL, compute="bf16", reads="bf16", reads_weights=True,
                          writes=None if id(node) in parts.bias else _writes(node, held, graph))
        if id(node) in parts.bias.values():  # the FullyConnected's bias, added to its float32 sums
            return Kernel(BF16_MATMUL, compute=compute, writes=_writes(node, held, graph))
        if id(_top(node)) in parts.tail:
            if node.op_type in _NORMS:
                return Kernel(MVN_FP32, compute=compute, statistics="fp32")
            return Kernel(TAIL_FP32, compute="fp32") if narrow else None
        if node.op_type in _NORMS:
            return Kernel(MVN_FP32, compute=compute, statistics="fp32", reads="bf16")
        if node.op_type not in _ELEMENTWISE:  # its activation inputs are enforced to bfloat16
            return Kernel(BF16_BETWEEN, compute=compute, reads="bf16")
        return Kernel(BF16_BETWEEN, compute="fp32") if narrow else None

    def held_in(self, value: Value, stored: Format, graph: Graph) -> tuple[str, Fact] | None:
        producer = value.producer
        if producer is None or is_constant(value):
            return None
        parts = self._split(graph)
        narrow = stored.name in ("fp16", "bf16")
        if id(_top(producer)) in parts.tail or id(producer) in parts.bias:
            # (a graph output nothing reads is rounded to the graph's format at the edge)
            out = value in graph.outputs and not value.consumers
            return ("fp32", TAIL_FP32 if id(producer) not in parts.bias else BF16_MATMUL) if narrow and not out \
                else None
        if value in graph.outputs and not value.consumers:
            return None  # a kernel's output leaving the graph: written as the kernel writes it (Kernel.writes)
        if producer.op_type in _ELEMENTWISE and all(c.op_type in _ELEMENTWISE and id(_top(c)) not in parts.tail
                                                    for c in value.consumers):
            return ("fp32", BF16_BETWEEN) if narrow else None  # inside one fused kernel
        return ("bf16", BF16_BETWEEN)

    def _split(self, graph: Graph) -> _Parts:
        parts = self._parts.get(id(graph))
        if parts is None:
            bias = _biases(graph)
            parts = self._parts[id(graph)] = _Parts(_tail(graph, set(bias.values())), bias)
        return parts


def _top(node: Node) -> Node:
    """A node inside an If/Loop/Scan body runs as its control-flow node does."""
    while node.parent is not None:
        node = node.parent
    return node


def _tail(graph: Graph, biases: set[int]) -> frozenset[int]:
    """Every node a graph output is reached from without passing a STOPS node (graph.cpp's searchForNodesToSkip),
    nor a bias Add (part of the FullyConnected before it)."""
    tail: set[int] = set()
    todo = [v.producer for v in graph.outputs if v.producer is not None]
    while todo:
        node = _top(todo.pop())
        if node.op_type in STOPS or id(node) in biases or id(node) in tail:
            continue
        tail.add(id(node))
        todo += [v.producer for v in node.inputs if v is not None and v.producer is not None]
    return frozenset(tail)


def _biases(graph: Graph) -> dict[int, int]:
    """MatMul -> the Add of a constant that reads nothing else of it: the plugin makes them one FullyConnected."""
    found = {}
    for node in graph.nodes:
        if node.op_type != "MatMul" or not node.outputs or node.outputs[0] is None:
            continue
        out = node.outputs[0]
        readers = out.consumers
        if len(readers) == 1 and readers[0].op_type == "Add" and out not in graph.outputs and \
                any(v is not None and v is not out and is_constant(v) for v in readers[0].inputs):
            found[id(node)] = id(readers[0])
    return found


def _writes(node: Node, held: Format, graph: Graph) -> str | None:
    """bfloat16, but a kernel writing a float32 graph output writes float32 (measured: no bfloat16 rounding there)."""
    if held.name == "fp32" and any(v is not None and v in graph.outputs for v in node.outputs):
        return None
    return "bf16"
