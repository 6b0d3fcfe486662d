"""Which steps onnxruntime can emulate faithfully, which values both runs share, and which ones segments return."""

from __future__ import annotations

from ..analysis.constants import is_constant
from ..dtypes import Format
from ..ir import Node, Value
from .meter import reads_inputs
from .ort_nodes import DOMAINS, ROUND_TO
from .plan import Plan
from .spec import ComputeSpec

__all__ = ["const_is_shared", "measured_values", "refusal", "shared_values"]

# Ops whose output size comes from these inputs' values: onnxruntime would allocate whatever they ask (8 GB for a
# Range to 2**31 read from an int64 input), so where those values come from the graph's input data (not from shapes,
# which existing tensors bound) they run on numpy, which checks the size against traced mode's budget first
# (limits.made_elements)
_SIZED_BY = {"ConstantOfShape": (0,), "Expand": (1,), "Tile": (1,), "Range": (0, 1, 2), "OneHot": (1,), "Pad": (1,)}


def refusal(node: Node, spec: ComputeSpec, input_formats: list[Format | None], rounds: list[Format | None]) -> str | None:
    """Why this node cannot be emulated faithfully on onnxruntime; None when it can (its inputs held in
    input_formats, its outputs rounded into rounds)."""
    if node.domain not in DOMAINS:
        return f"node '{node.name}' is in domain '{node.domain}', which onnxruntime does not run"
    sized = _SIZED_BY.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    if sized and _sized_by_data(node, sized):
        return (f"node '{node.name}' ({node.op_type}) makes a tensor as large as the input data says: numpy "
                f"runs it, checking the size against traced mode's budget first")
    if spec.accumulate is not None:
        return f"node '{node.name}' rounds its statistics into its stash_type, which runs on numpy only"
    if spec.reads is not None or spec.weights is not None or spec.writes is not None or spec.normalized is not None:
        return f"node '{node.name}' reads or writes the runtime's own format, which runs on numpy only"
    if spec.blocks is not None:
        return f"node '{node.name}' reads its inputs in {spec.blocks.long_name} blocks, which runs on numpy only"
    formats = [fmt for fmt in rounds if fmt is not None]
    formats += [fmt for v, fmt in zip(node.inputs, input_formats) if v is not None and v.is_const and fmt is not None]
    narrow = next((fmt for fmt in formats if fmt.name not in ROUND_TO and not fmt.wide), None)
    if narrow is not None:
        return f"node '{node.name}' rounds into {narrow.name}, which runs on numpy only"
    return None


def _sized_by_data(node: Node, indexes: tuple[int, ...], limit: int = 256) -> bool:
    """Whether the inputs that size the node's output are computed from a graph input's values: walking producers
    back (iteratively, at most limit nodes) and stopping at Shape and Size, whose values existing tensors bound, and
    at constants. A walk past the limit counts as shapes (an exported graph's shape arithmetic is long)."""
    todo = [node.input(i) for i in indexes]
    seen: set[int] = set()
    while todo and len(seen) < limit:
        value = todo.pop()
        if value is None or id(value) in seen or is_constant(value):
            continue
        seen.add(id(value))
        if value.is_graph_input:
            return True
        maker = value.producer
        if maker is None or maker.op_type in ("Shape", "Size"):
            continue
        todo.extend(maker.inputs)
    return False


def const_is_shared(plan: Plan, v: Value) -> bool:
    """Whether both runs read a constant alike: it is no float, or held in float32 or float64."""
    fmt = plan.held(v)
    return fmt is None or fmt.wide


def shared_values(plan: Plan) -> set[int]:
    """Values both runs hold alike: integer inputs and what integer-only nodes make of them (shape arithmetic)."""
    shared = {id(v) for v in plan.graph.inputs if plan.graph_input_formats[id(v)] is None}
    for step in plan.steps:
        node = step.node
        floats_out = any(fmt is not None for _, fmt in step.outputs)
        if floats_out or node.domain not in DOMAINS or node.bodies:  # a body may read floats by name
            continue
        # a Shape is shared only when its input is: a shape computed from data (NonZero, Compress) can differ
        if all(v is None or (const_is_shared(plan, v) if v.is_const else id(v) in shared) for v in node.inputs):
            shared.update(vid for vid, _ in step.outputs)
    return shared


def measured_values(plan: Plan) -> set[int]:
    """The values the measurements read: float outputs, and the inputs and outputs of nodes whose measuring
    reads their inputs (hooked ones, Add/Sub). A rearranged output reuses its input's sample instead."""
    made_by_step = {vid for s in plan.steps for vid, fmt in s.outputs if fmt is not None}
    needed: set[int] = set()
    for step in plan.steps:  # (the run has attached the hooks by the time the engine asks)
        for vid, fmt in step.outputs:
            if fmt is not None and not (step.rearranges is not None and step.rearranges in made_by_step):
                needed.add(vid)
        if reads_inputs(step):
            needed.update(id(v) for v in step.inputs if v is not None and not v.is_const)
            needed.update(vid for vid, _ in step.outputs)
    return needed
