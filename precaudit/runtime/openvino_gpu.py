"""OpenVINO's GPU plugin: float32 runs as float16, except the subgraphs its fp16 compression keeps in float32.

Read in openvinotoolkit/openvino src/common/transformations/src/transformations/fp16_compression/
mark_subgraphs_to_keep_in_mixed_precision.cpp (MarkDivWithEps: x / (y + eps), x / max(y, eps), x / sqrt(...), x *
pow(y + eps, -z), eps a constant ≤ float16's smallest normal 6.1e-5 — 1e-4 is not protected; MarkExpInReduceOpPath:
an Exp whose output reaches ReduceSum or ReduceMean; propagation up and down through element-wise ops, MVN,
reductions, reshapes and concatenations, stopping at MatMul and Convolution) and
mark_sin_cos_angles_to_keep_in_mixed_precision.cpp (Sin/Cos of angles with no MatMul or Convolution on their path).
Modelled here as a single pass of those marks; the GPU plugin's default f16 inference precision and the
activations-scaling pass (PR #28996: a norm's eps scaled with the activations) are not read from source.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..analysis.constants import resolve_scalar
from ..dtypes import FORMATS
from .base import Fact, Kernel, Runtime

if TYPE_CHECKING:
    from ..dtypes import Format
    from ..ir import Graph, Node

__all__ = ["OpenVinoGpu", "kept_in_f32"]

_STOP = {"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum"}
_THROUGH = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Neg", "Abs", "Sqrt", "Exp", "Log", "Erf", "Tanh",
            "Sigmoid", "Relu", "Clip", "Reciprocal", "Squeeze", "Unsqueeze", "Reshape", "Expand", "Tile", "Slice",
            "Split", "Concat", "Transpose", "ReduceSum", "ReduceMean", "ReduceL2", "LayerNormalization",
            "MeanVarianceNormalization", "Cast", "Identity", "Where"}

F16_DEFAULT = Fact(
    "gpu-f16-default", "the GPU plugin runs float32 models in float16 by default (INFERENCE_PRECISION_HINT f16)",
    "OpenVINO GPU plugin documentation (not read in source)")
KEPT_F32 = Fact(
    "fp16-compression-keeps", "fp16 compression keeps in float32 a division guarded by an eps ≤ 6.1e-5 (x / (y + "
    "eps), x / sqrt(y + eps), x / max(y, eps)), an Exp summed by ReduceSum/ReduceMean, Sin/Cos of positions, and "
    "what those reach through element-wise ops up to a MatMul or Convolution",
    "openvino fp16_compression/mark_subgraphs_to_keep_in_mixed_precision.cpp, "
    "mark_sin_cos_angles_to_keep_in_mixed_precision.cpp")


class OpenVinoGpu(Runtime):
    name = "openvino-gpu"
    title = "OpenVINO GPU"
    versions = ("2026.4",)
    facts = (F16_DEFAULT, KEPT_F32)

    def __init__(self, version: str, asked: str | None = None):
        super().__init__(version, asked)
        self._marked: dict[int, set[int]] = {}  # id(graph) -> id(node) of every node kept in float32

    def target(self, fmt: Format) -> tuple[Format, Fact | None]:
        if fmt.name in ("fp32", "fp64"):
            return FORMATS["fp16"], F16_DEFAULT
        return fmt, None

    def kernel(self, node: Node, held: Format, graph: Graph) -> Kernel | None:
        marked = self._marked.get(id(graph))
        if marked is None:
            marked = self._marked[id(graph)] = kept_in_f32(graph)
        if id(node) in marked:
            return Kernel(KEPT_F32, compute="fp32", statistics="fp32", keeps_constants=True)
        return None


def kept_in_f32(graph: Graph) -> set[int]:
    """id() of every node fp16 compression keeps in float32: the marked roots and what the marks spread to."""
    roots = [n for n in graph.nodes if _div_with_eps(n) or _exp_into_reduce(n) or _angle(n)]
    marked: set[int] = set()
    todo = list(roots)
    while todo:
        node = todo.pop()
        if id(node) in marked:
            continue
        marked.add(id(node))
        near = [v.producer for v in node.inputs if v is not None and v.producer is not None]
        near += [c for v in node.outputs if v is not None for c in v.consumers]
        todo += [n for n in near if n.op_type in _THROUGH and id(n) not in marked]
    return marked


def _small_eps(node: Node | None) -> bool:
    """Add(y, eps) or Max(y, eps) with a constant eps ≤ float16's smallest normal."""
    if node is None or node.op_type not in ("Add", "Max"):
        return False
    for v in node.inputs:
        c = resolve_scalar(v)
        if c is not None and 0 <= c.value <= FORMATS["fp16"].smallest_normal:
            return True
    return False


def _div_with_eps(node: Node) -> bool:
    if node.op_type == "Div" and len(node.inputs) == 2 and node.inputs[1] is not None:
        d = node.inputs[1].producer
        if d is not None and d.op_type == "Sqrt" and d.inputs and d.inputs[0] is not None:
            d = d.inputs[0].producer
        return _small_eps(d)
    if node.op_type == "Mul":
        for v in node.inputs:
            p = v.producer if v is not None else None
            if p is not None and p.op_type == "Pow" and len(p.inputs) == 2:
                z = resolve_scalar(p.inputs[1])
                if z is not None and z.value < 0 and p.inputs[0] is not None and _small_eps(p.inputs[0].producer):
                    return True
    return False


def _exp_into_reduce(node: Node) -> bool:
    if node.op_type != "Exp":
        return False
    todo, seen = [node], set()
    while todo:
        current = todo.pop()
        for v in current.outputs:
            for c in (v.consumers if v is not None else []):
                if c.op_type in ("ReduceSum", "ReduceMean"):
                    return True
                if c.op_type in _THROUGH and id(c) not in seen:
                    seen.add(id(c))
                    todo.append(c)
    return False


def _angle(node: Node) -> bool:
    """Sin/Cos whose argument has no MatMul or Convolution upstream (angles made of positions)."""
    if node.op_type not in ("Sin", "Cos"):
        return False
    todo, seen = [node], set()
    while todo:
        current = todo.pop()
        for v in current.inputs:
            p = v.producer if v is not None else None
            if p is None or id(p) in seen:
                continue
            if p.op_type in _STOP:
                return False
            seen.add(id(p))
            todo.append(p)
    return True
