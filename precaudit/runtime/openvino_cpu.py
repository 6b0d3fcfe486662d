"""OpenVINO's CPU plugin, 2026.4, on a CPU with bfloat16 (AVX512_BF16 or AMX): nothing computes in float16, and the
default inference precision runs everything but the graph's tail in bfloat16.

Read in openvinotoolkit/openvino src/plugins/intel_cpu/src/graph.cpp @473faca3 (Graph::EnforceInferencePrecision):
walking back from each graph output, every node met before a Convolution, FullyConnected, MatMul, RNN, ROIPooling or
Interpolate (the tail) keeps float32; every other node's float32 inputs and outputs are set to bf16, but for an
input read from a constant, and an elementwise kernel's input read from a graph input. Measured here with openvino
2026.4.1 on avx512_bf16 (tests/test_runtime_openvino.py measures it again where the wheel is installed, from the
runtime model's runtimePrecision and outputPrecisions and from the outputs): INFERENCE_PRECISION_HINT defaults to
bf16. A MatMul reads its inputs and its weights rounded to bfloat16, sums in float32 (relative error 2e-3 against
float64) and writes bfloat16, but to a float32 graph output it writes float32. A bias Add and the activations after
it (Relu, Sigmoid, Tanh, Clip, ...: POST_OPS, measured one by one) are part of the same FullyConnected, computed on
its float32 sums: it writes float32 where its last activation lies in the tail, and reads its bias in the format it
writes, but in float32 where a MatMul reads what it writes (Snippets makes MatMul, bias, activation, MatMul one MLP
kernel). Outside the tail what passes between kernels is bfloat16, but elementwise ops fused into one
Snippets kernel keep what passes between them in float32 (Mul then Exp before a MatMul: the Exp's input is not
rounded). MVN (the plugin's LayerNorm, and what a decomposed LayerNorm is fused into) keeps its statistics in
float32: outside the tail it is bit for bit a float32 LayerNorm of the bfloat16 input, its normalized value rounded to
bfloat16 before a Multiply and an Add scale and shift it (into bfloat16 again). The tail
computes in float32: an elementwise-only graph gives the f32 hint's outputs bit for bit, and a decomposed float16
LayerNorm with |x - mean| 800 at the outputs is a float32 MVN with finite outputs. A float16 graph runs so too (its
inputs converted at the edge, its outputs converted back; an eps it stores as 0.0 stays 0.0); float32 subnormals are
kept.

Not modelled: a Mul by a constant (or a Neg) after a MatMul is folded into the weights before they are rounded to
bfloat16; which elementwise ops Snippets fuses is approximated (an elementwise op whose readers are all
elementwise), and so is its MLP kernel (a bias read in float32 where only MatMuls read the FullyConnected); a
Convolution's post-ops are not (measured: MatMul only); the
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

__all__ = ["BF16_KERNELS", "POST_OPS", "STOPS", "OpenVinoCpu"]

# where EnforceInferencePrecision's walk back from the outputs stops (graph.cpp's list, as the ONNX ops that become
# those nodes): what lies beyond one of them is not the tail
STOPS = frozenset({"MatMul", "Gemm", "Conv", "LSTM", "GRU", "RNN", "Resize", "MaxRoiPool"})
# kernels that read every float input, weights included, rounded to bfloat16 and accumulate in float32
BF16_KERNELS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"})
# activations the plugin fuses into a FullyConnected after its bias (measured one by one: Exp, Erf, Log and
# HardSigmoid are not; a Mul by a constant and a Neg are folded into the weights, which is not modelled)
POST_OPS = frozenset({"Relu", "Sigmoid", "Tanh", "Clip", "Abs", "Sqrt", "Elu", "LeakyRelu", "Softplus", "HardSwish",
                      "Round", "Mish"})
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
    "float32 and write bfloat16 (float32 to a float32 graph output, or where the activation fused after them lies in "
    "the tail); a bias Add and activations after one are computed in float32 inside its kernel",
    f"{_SOURCE}; measured: openvino 2026.4.1, FullyConnected runtimePrecision bf16, relative error 2e-3 against "
    "float64; the fused post-ops in the runtime model's originalLayersNames")
BF16_BETWEEN = Fact(
    "cpu-bf16-between-kernels", "outside the tail what passes between kernels is held in bfloat16; elementwise ops "
    "fused into one kernel keep what passes between them in float32",
    f"{_SOURCE}; measured: openvino 2026.4.1, runtime model outputPrecisions bf16, a fused Mul and Exp")
MVN_FP32 = Fact(
    "cpu-mvn-fp32-statistics", "MVN (LayerNormalization, and a decomposed LayerNorm fused into it) keeps its "
    "statistics in float32; outside the tail it reads bfloat16 and writes its normalized value in bfloat16 before "
    "the scale and shift", "measured: openvino 2026.4.1, a LayerNormalization before a MatMul is bit for bit float32 "
    "statistics of the bfloat16 input, its normalized value rounded to bfloat16 before the scale and shift")
SUBNORMALS_KEPT = Fact(
    "cpu-subnormals-kept", "float32 subnormals are kept under both hints", "measured: openvino 2026.4.1, Add(x, 0) "
    "keeps 1e-40")


@dataclass(frozen=True)
class _Parts:
    """How the plugin splits one graph: its tail, and the FullyConnected kernels a MatMul or Gemm makes with the
    bias Add and the activations after it (post-ops)."""

    tail: frozenset[int]  # id(node), less the nodes a FullyConnected takes in
    inner: frozenset[int]  # id(node) whose output stays inside its FullyConnected (in float32)
    bias: frozenset[int]  # id(Add) of a FullyConnected's bias
    ends: dict[int, bool]  # id(node) that ends a FullyConnected -> it writes float32 (its last post-op in the tail)


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
        compute = "fp32" if held.name in ("fp16", "bf16") else None
        writes = self._writes(node, held, graph)
        if node.op_type in BF16_KERNELS and id(_top(node)) not in parts.tail:
            return Kernel(BF16_MATMUL, compute="bf16", reads="bf16", weights="bf16", writes=writes)
        if id(node) in parts.inner or id(node) in parts.ends:  # a post-op: in float32 on the float32 sums
            return Kernel(BF16_MATMUL, compute=compute, weights=self._bias(node, held, graph), writes=writes)
        if id(_top(node)) in parts.tail:
            if node.op_type in _NORMS:
                return Kernel(MVN_FP32, compute=compute, statistics="fp32")
            return Kernel(TAIL_FP32, compute=compute) if compute else None
        if node.op_type in _NORMS:  # MVN writes its normalized value, a Multiply and an Add scale and shift it
            return Kernel(MVN_FP32, compute=compute, statistics="fp32", reads="bf16", normalized="bf16")
        if node.op_type not in _ELEMENTWISE:  # its activation inputs are enforced to bfloat16
            return Kernel(BF16_BETWEEN, compute=compute, reads="bf16")
        return Kernel(BF16_BETWEEN, compute=compute) if compute else None

    def held_in(self, value: Value, stored: Format, graph: Graph) -> tuple[str, Fact] | None:
        producer = value.producer
        if producer is None or is_constant(value):
            return None
        parts = self._split(graph)
        narrow = stored.name in ("fp16", "bf16")
        leaves = value in graph.outputs and not value.consumers  # rounded to the graph's format at the edge
        if id(producer) in parts.inner:
            return ("fp32", BF16_MATMUL) if narrow else None
        if id(_top(producer)) in parts.tail or parts.ends.get(id(producer)):
            return ("fp32", TAIL_FP32) if narrow and not leaves else None
        if leaves:
            return None  # a kernel's output leaving the graph: written as the kernel writes it (Kernel.writes)
        if producer.op_type in _ELEMENTWISE and id(producer) not in parts.ends and \
                all(c.op_type in _ELEMENTWISE and id(_top(c)) not in parts.tail for c in value.consumers):
            return ("fp32", BF16_BETWEEN) if narrow else None  # inside one fused kernel
        return ("bf16", BF16_BETWEEN if producer.op_type not in BF16_KERNELS else BF16_MATMUL)

    def _writes(self, node: Node, held: Format, graph: Graph) -> str | None:
        """The format a FullyConnected ending at node writes: float32 where its last post-op lies in the tail, or
        where it writes a float32 graph output; else bfloat16. None for a node that ends none."""
        parts = self._split(graph)
        ends = parts.ends.get(id(node))
        if ends is None and (node.op_type not in BF16_KERNELS or id(node) in parts.inner):
            return None
        if ends or (held.name == "fp32" and any(v is not None and v in graph.outputs for v in node.outputs)):
            return None
        return "bf16"

    def _bias(self, node: Node, held: Format, graph: Graph) -> str | None:
        """The format a FullyConnected reads its bias in: the one it writes (oneDNN's), but float32 where a MatMul
        reads what it writes (Snippets makes the two one MLP kernel, which adds the bias in float32)."""
        parts = self._split(graph)
        if id(node) not in parts.bias:
            return None
        end = node
        while id(end) not in parts.ends:
            end = end.outputs[0].consumers[0]
        readers = end.outputs[0].consumers
        if readers and all(c.op_type == "MatMul" for c in readers):
            return None
        return self._writes(end, held, graph)

    def _split(self, graph: Graph) -> _Parts:
        parts = self._parts.get(id(graph))
        if parts is None:
            parts = self._parts[id(graph)] = _split(graph)
        return parts


def _top(node: Node) -> Node:
    """A node inside an If/Loop/Scan body runs as its control-flow node does."""
    while node.parent is not None:
        node = node.parent
    return node


def _split(graph: Graph) -> _Parts:
    tail = _tail(graph)
    inner: set[int] = set()
    bias: set[int] = set()
    ends: dict[int, bool] = {}
    for node in graph.nodes:
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        chain = _post_ops(node, graph)
        inner.update(id(n) for n in [node, *chain[:-1]] if chain)
        bias.update(id(n) for n in chain if n.op_type == "Add")
        activations = [n for n in chain if n.op_type != "Add"]
        ends[id(chain[-1] if chain else node)] = bool(activations) and id(activations[-1]) in tail
    taken = inner | set(ends)
    return _Parts(frozenset(tail - taken), frozenset(inner), frozenset(bias), ends)


def _tail(graph: Graph) -> set[int]:
    """Every node a graph output is reached from without passing a STOPS node (graph.cpp's searchForNodesToSkip)."""
    tail: set[int] = set()
    todo = [v.producer for v in graph.outputs if v.producer is not None]
    while todo:
        node = _top(todo.pop())
        if node.op_type in STOPS or id(node) in tail:
            continue
        tail.add(id(node))
        todo += [v.producer for v in node.inputs if v is not None and v.producer is not None]
    return tail


def _post_ops(node: Node, graph: Graph) -> list[Node]:
    """What the plugin fuses into the FullyConnected a MatMul or Gemm makes, in order: an Add of a constant (a bias;
    a Gemm has its own) and the activations after it, each the only reader of what the one before makes."""
    chain: list[Node] = []
    current = node
    while current.outputs and current.outputs[0] is not None:
        out = current.outputs[0]
        if out in graph.outputs or len(out.consumers) != 1:
            break
        reader = out.consumers[0]
        is_bias = reader.op_type == "Add" and not chain and node.op_type == "MatMul" and \
            any(v is not None and v is not out and is_constant(v) for v in reader.inputs)
        if not is_bias and reader.op_type not in POST_OPS:
            break
        chain.append(reader)
        current = reader
    return chain
