"""A mask fill beyond the target's range (torch.finfo(float32).min baked into an fp32 export, -inf once converted)
becomes the target's own finfo.min: a new initializer in the dtype the model stores the fill, read by every node
that read the old one and computes in the narrow type. A folded mask tensor (0 or the fill, the dynamo exporter's
causal mask) gets a copy with each fill replaced, the zeros kept. Only fills that reach a softmax (mask fills) are
changed; any other out-of-range constant is a number the model means, and is left alone."""

from __future__ import annotations

import numpy as np

from ..analysis.constants import resolve_fill, resolve_scalar
from ..analysis.sites.walks import softmax_after
from ..escape import printable
from .common import const_shape, constant_producers, float_dtype, stored_array
from .plan import Check, Context, Group, Repair

__all__ = ["mask_fill"]



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
               if (dt := ctx.resolver.of_node(c)) is not None and dt.fmt.is_narrow]
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
    softmax = softmax_after(node)
    compared = softmax.outputs[0].name if softmax is not None and not softmax.subgraph_path else None
    others = [r for r in readers if r is not node]
    also = f"; also read by {', '.join(repr(printable(r.name)) for r in others)}" if others else ""
    side = "min" if number < 0 else "max"
    return Repair("mask-fill", node, sorted(group.ids), f"fill {number:.4g} ({facts.get('source')}), "
                  f"{facts.get('value_rounded')} in {facts.get('compute_dtype')}",
                  f"fill {fill:g}, finfo({target.long_name}).{side} (new {edit.constant_word} '{printable(name)}'{also})",
                  f"exact at the softmax{' ' + repr(printable(softmax.name)) if softmax is not None else ''}: a masked "
                  f"score gets weight exp(fill - max) = 0 in float32 either way, while the kept scores stay above "
                  f"{fill:g} + 104",
                  Check("exact", value=compared) if compared else Check("none"), apply,
                  nodes=[r.name for r in readers], changed=[name])
