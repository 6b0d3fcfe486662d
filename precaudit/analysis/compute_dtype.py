"""Which dtype a value is held in, and a node computes in, when the model runs at the target dtype — and why."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from ..dtypes import FORMATS, Format, format_of_onnx_type
from ..ir import Graph, Node, Value, implicit_inputs
from .constants import is_constant

__all__ = ["ComputeDtype", "DtypeResolver"]

_FLOAT_NAMES = {"fp16", "bf16", "fp32", "fp64", "fp8-e4m3", "fp8-e5m2"}


@dataclass(frozen=True)
class ComputeDtype:
    """A format together with the reason it applies, as a finding prints it."""

    fmt: Format
    reason: str


class DtypeResolver:
    """Maps the stored graph onto a run at the target dtype.

    A tensor stored in float32 runs in the target dtype (what an fp16 converter does), unless it lies
    downstream of an explicit Cast to float32 (an intended fp32 island) or comes out of a node the user
    keeps in float32. Tensors stored in another float type (an fp16 model, a Cast to double) keep it. A
    model already converted to the target's narrow format runs as written, so its float32 tensors (an fp32
    constant inside an fp32 island) stay float32.
    """

    def __init__(self, graph: Graph, target: Format, keep_fp32: list[str] | tuple[str, ...] = ()):
        self.graph = graph
        self.target = target
        self.keep_fp32 = list(keep_fp32)
        self.converted = target.name not in ("fp32", "fp64") and graph.converted_to is None and _converted(graph, target)
        self._cast_origin: dict[int, tuple[str, str]] = {}  # id(value) -> (Cast node name, dtype it cast to)
        self._propagate_casts()

    def kept_by(self, node: Node) -> str | None:
        """The --keep-fp32 entry (op type, node name or glob) that keeps this node in float32, if any."""
        for pattern in self.keep_fp32:
            if pattern == node.op_type or fnmatchcase(node.name, pattern) or (node.scope and fnmatchcase(node.scope, pattern)):
                return pattern
        return None

    def of_value(self, value: Value) -> ComputeDtype | None:
        """The dtype a float value is held in during the audited run; None for non-float values."""
        if value.dtype not in _FLOAT_NAMES:
            return None
        cast, cast_to = self._cast_origin.get(id(value), (None, None))
        if value.dtype != "fp32":
            fmt = FORMATS[value.dtype]
            if cast is not None and cast_to == value.dtype:
                return ComputeDtype(fmt, f"after Cast to {fmt.long_name} at node '{cast}'")
            if self.graph.converted_to == value.dtype:
                return ComputeDtype(fmt, f"--dtype {fmt.name}: the module was converted with model.to({fmt.long_name})")
            return ComputeDtype(fmt, f"model stored in {fmt.long_name}")
        if self.target.name == "fp32":
            return ComputeDtype(self.target, "model stored in float32, --dtype fp32")
        if cast is not None and cast_to == "fp32":
            # an explicit upcast marks an intended float32 island (HF RMSNorm, T5 LayerNorm)
            return ComputeDtype(FORMATS["fp32"], f"after Cast to float32 at node '{cast}'")
        if self.converted:
            return ComputeDtype(FORMATS["fp32"], f"stored in float32 in a model stored in {self.target.long_name}")
        return ComputeDtype(self.target, f"--dtype {self.target.name}: float32 tensors run as {self.target.long_name}")

    def of_node(self, node: Node) -> ComputeDtype | None:
        """The dtype a node computes in: its kept-fp32 status, else the dtype of its first float input."""
        pattern = self.kept_by(node)
        if pattern is not None:
            return ComputeDtype(FORMATS["fp32"], f"kept in float32 by --keep-fp32 {pattern}")
        for value in node.inputs:
            if value is not None:
                dtype = self.of_value(value)
                if dtype is not None:
                    return dtype
        return None

    def of_stash(self, node: Node, stash_type: int | None, default_note: str) -> ComputeDtype | None:
        """Compute dtype of a norm op that carries its own statistics dtype (stash_type)."""
        pattern = self.kept_by(node)
        if pattern is not None:
            return ComputeDtype(FORMATS["fp32"], f"kept in float32 by --keep-fp32 {pattern}")
        if stash_type is None:
            return ComputeDtype(FORMATS["fp32"], f"stash_type absent: default 1 (float32){default_note}")
        fmt = format_of_onnx_type(stash_type)
        if fmt is None:  # 0 (undefined) or a non-float type: the statistics stay in the input dtype
            inner = self.of_node(node)
            if inner is None:
                return None
            return ComputeDtype(inner.fmt, f"stash_type={stash_type} is no float type, so the input dtype applies: {inner.reason}")
        return ComputeDtype(fmt, f"stash_type={stash_type} ({fmt.long_name})")

    def _propagate_casts(self) -> None:
        """Remember, for each value, the Cast that set its dtype, until another Cast or a kept node."""
        for node in self.graph.nodes:
            if node.op_type == "Cast":
                fmt = format_of_onnx_type(node.attr("to", 0))
                # casting a constant (an eps) says nothing about the dtype the activations flow in, and casting
                # ints or bools (a mask, positions) to float32 is no upcast of activations
                source = node.input(0)
                upcast = source is not None and source.dtype in _FLOAT_NAMES and not is_constant(source)
                origin = (node.name, fmt.name) if fmt is not None and upcast else None
            elif self.kept_by(node) is not None:
                origin = None  # a converter casts a kept node's outputs back to the target dtype
            else:
                # an If's data comes into its branches by name, not as inputs: those values count too
                reads = [*node.inputs, *implicit_inputs(node)] if node.bodies else node.inputs
                origin = next((self._cast_origin[id(v)] for v in reads
                               if v is not None and id(v) in self._cast_origin and not is_constant(v)), None)
            if origin is not None:
                for out in node.outputs:
                    self._cast_origin[id(out)] = origin


def _converted(graph: Graph, target: Format) -> bool:
    """Whether the model is already stored in the target format: a float input in it, or most of its weights.

    (Token-id models have no float input, so the weights decide; an fp32 model with one fp16 output does not
    count as converted.)
    """
    if any(v.dtype == target.name for v in graph.inputs):
        return True
    sizes: dict[str, int] = {}
    seen: set[int] = set()
    for node in graph.nodes:
        for v in node.inputs:
            if v is not None and v.is_const and v.producer is None and id(v) not in seen:
                seen.add(id(v))
                sizes[v.dtype or ""] = sizes.get(v.dtype or "", 0) + (v.const_size or 1)
    return sizes.get(target.name, 0) > sizes.get("fp32", 0)
