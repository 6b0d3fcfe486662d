"""A mask fill beyond the target's range (torch.finfo(float32).min baked into an fp32 export, -inf once converted)
becomes the target's own finfo.min: a new initializer in the dtype the model stores the fill, read by every node
that read the old one and computes in the narrow type. A folded mask tensor (0 or the fill, the dynamo exporter's
causal mask) gets a copy with each fill replaced, the zeros kept. Only fills that reach a softmax (mask fills) are
changed; any other out-of-range constant is a number the model means, and is left alone."""

from __future__ import annotations

from collections import deque

import numpy as np

from ..analysis.constants import resolve_fill, resolve_scalar
from ..escape import printable
from ..ir import Node
from .common import const_shape, constant_producers, float_dtype, stored_array
from .plan import Check, Context, Group, Repair

__all__ = ["mask_fill"]

# what a mask fill passes through on its way into a softmax (analysis.sites.feeds_softmax walks the same ops)
_TO_SOFTMAX = {"Where", "Add", "Sub", "Mul", "Cast", "Expand", "Reshape", "Unsqueeze", "Squeeze", "Transpose",
               "Identity", "Slice", "Concat"}


def _softmax_after(node: Node, depth: int = 6) -> Node | None:
    """The first Softmax the fill reaches through mask arithmetic (analysis.sites.feeds_softmax's walk)."""
    queue, seen = deque([(node, 0)]), {id(node)}
    while queue:
        current, d = queue.popleft()
        if current.op_type in ("Softmax", "LogSoftmax"):
            return current
        if d >= depth or current.op_type not in _TO_SOFTMAX and current is not node:
            continue
        for user in (u for out in current.outputs for u in out.consumers):
            if id(user) not in seen:
                seen.add(id(user))
                queue.append((user, d + 1))
    return None


def mask_fill(ctx: Context, group: Group) -> Repair | str:
    node = group.node
    site = group.site("constant")
    assert site is not None  # the planner sends here only the groups at a constant site
    facts = site.facts
    if not facts.get("mask_fill"):
        return ("a constant beyond the dtype's range that no softmax reads is a number the model means: "
                "fix leaves it to you")
    number = float(facts["value"])
    index = next((i for i, v in enumerate(node.inputs) if v is not None
                  and (scalar := resolve_scalar(v)) is not None and scalar.value == number), None)
    tensor = None
    if index is None:
        # a folded mask read as it is stored (a moved one would need its moves redone on the copy)
        index = next((i for i, v in enumerate(node.inputs) if v is not None and v.is_const
                      and (found := resolve_fill(v)) is not None and found.value == number), None)
        if index is None:
            return "the fill is not a constant input fix can replace"
        stored = node.inputs[index]
        assert stored is not None  # the search above takes only inputs that are there
        tensor = stored.const()
    value = node.inputs[index]
    assert value is not None  # the searches above take only inputs that are there
    target = ctx.target
    fill = -target.max if number < 0 else target.max
    readers = [c for c in value.consumers
               if (dt := ctx.resolver.of_node(c)) is not None and dt.fmt.name not in ("fp32", "fp64")]
    if node not in readers:
        readers.insert(0, node)
    edit = ctx.edit
    name = edit.unique(f"{value.name}/precaudit_fill")
    array = stored_array(fill, float_dtype(value), const_shape(value)) if tensor is None else \
        np.where(tensor == number, np.asarray(fill, tensor.dtype), tensor)

    def apply() -> None:
        edit.add_named_initializer(node, name, array)
        for reader in readers:
            for i, v in enumerate(reader.inputs):
                if v is value:
                    edit.set_input(reader, i, name)
        edit.orphan(*constant_producers(value))

    for reader in readers:
        edit.touched.add(id(reader))
    softmax = _softmax_after(node)
    compared = softmax.outputs[0].name if softmax is not None and not softmax.subgraph_path else None
    others = [r for r in readers if r is not node]
    also = f"; also read by {', '.join(repr(printable(r.name)) for r in others)}" if others else ""
    side = "min" if number < 0 else "max"
    return Repair("mask-fill", node, ["PA209"], f"fill {number:.4g} ({facts.get('source')}), "
                  f"{facts.get('value_rounded')} in {facts.get('compute_dtype')}",
                  f"fill {fill:g}, finfo({target.long_name}).{side} (new {edit.constant_word} '{printable(name)}'{also})",
                  f"exact at the softmax{' ' + repr(printable(softmax.name)) if softmax is not None else ''}: a masked "
                  f"score gets weight exp(fill - max) = 0 in float32 either way, while the kept scores stay above "
                  f"{fill:g} + 104",
                  Check("exact", value=compared) if compared else Check("none"), apply,
                  nodes=[r.name for r in readers], changed=[name])
