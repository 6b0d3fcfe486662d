"""A decomposed norm's statistics in float32, in a model stored in float16 or bfloat16: Casts around the chain, as
a converter's block list leaves a blocked node (Cast up at its inputs, Cast back at its outputs), and its constants
written as float32 initializers.

Only where the model stores the chain in the narrow type. In a float32 model a Cast to float32 is a no-op that every
converter rewrites, retypes or removes (docs/dtypes.md): there the fix is the converter's block list
(precaudit keep-list) and, for the eps, a raise; eps.py says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from onnx import NodeProto
from onnx import TensorProto as T

from ..analysis.constants import resolve_scalar, skip_casts
from ..dtypes import COMPUTED, FORMATS
from ..escape import printable
from ..ir import Node, Value
from .common import constant_producers, float_dtype
from .model import ELEM_OF
from .plan import Check, Context, Group, Repair

__all__ = ["island_repair", "narrow_stored"]

_NARROW = ("fp16", "bf16")


def narrow_stored(chain: list[Node]) -> bool:
    """Whether the chain's values are stored in float16/bfloat16 (a converted model) in one graph."""
    if not chain or len({n.subgraph_path for n in chain}) != 1:
        return False
    dtypes = {float_dtype(v) for n in chain for v in n.outputs} - {None}
    return bool(dtypes) and dtypes <= set(_NARROW) | {"fp32"} and bool(dtypes & set(_NARROW))


@dataclass
class _Island:
    """The edits that put a chain in float32: what its inputs become, what its outputs are cast back to."""

    ups: list[tuple[Node, NodeProto]] = field(default_factory=list)  # (anchor, Cast to float32 before it)
    inits: list[tuple[Node, str, np.ndarray]] = field(default_factory=list)  # (reader, name, float32 constant)
    rename: dict[int, str] = field(default_factory=dict)  # outside value id -> the name chain nodes read instead
    dead: list[Value] = field(default_factory=list)  # the Constants (and Casts of them) chain nodes no longer read
    new_eps: float | None = None  # an eps stored as 0.0, raised
    downs: list[tuple[Node, NodeProto]] = field(default_factory=list)  # (anchor, Cast back after it)
    out_rename: dict[int, str] = field(default_factory=dict)  # chain output id -> its float32 name inside
    exits: list[str] = field(default_factory=list)  # the names read outside, cast back under their own name


def island_repair(ctx: Context, group: Group, chain: list[Node], facts: dict, rules: list[str]) -> Repair | str:
    edit = ctx.edit
    if any(id(n) in edit.touched for n in chain):
        return "another repair changed this chain already"
    island = _Island()
    _inputs_to_float32(ctx, group, chain, "PA106" in rules, island)
    _outputs_back(ctx, chain, island)
    if not island.exits:
        return "the chain's result is not read outside it"
    for node in chain:
        edit.touched.add(id(node))
    dtype_words = FORMATS[float_dtype(chain[-1].outputs[0]) or "fp16"].long_name
    ups, downs, inits, exits, new_eps = island.ups, island.downs, island.inits, island.exits, island.new_eps
    after = (f"statistics in float32: {len(ups)} Cast{'s' * (len(ups) != 1)} to float32 at the chain's inputs, "
             f"{len(downs)} back to {dtype_words} at '{printable(exits[0])}'" + (" and more" if len(exits) > 1 else "")
             + f", {len(inits)} constant{'s' * (len(inits) != 1)} as float32 initializers")
    if new_eps is not None:
        after += f"; eps stored as 0.0 raised to {new_eps:.4g}"
    check = Check("exact", value=exits[0]) if not chain[0].subgraph_path and new_eps is None else Check("none")
    words = ("exact in float32: every added Cast is a no-op there and each constant keeps the number the model stores"
             + ("; the eps stored as 0.0 adds rows' worth of eps only where the variance is near 0" if new_eps else ""))
    return Repair("norm-float32", group.node, rules,
                  f"{len(chain)} nodes ({chain[0].op_type} … {chain[-1].op_type}) computing in {dtype_words}",
                  after, words, check, lambda: _apply(ctx, chain, island),
                  nodes=[n.name for _, n in ups] + [n.name for _, n in downs],
                  changed=[name for _, name, _ in inits] + [o for _, n in ups for o in n.output]
                  + [island.out_rename.get(id(v), v.name) for n in chain for v in n.outputs if v.name])


def _inputs_to_float32(ctx: Context, group: Group, chain: list[Node], stored_zero: bool, island: _Island) -> None:
    """Each narrow value the chain reads from outside, once: a constant becomes a float32 initializer (an eps stored
    as 0.0 raised, when PA106 asks), an activation gets a Cast to float32 before its first reader."""
    edit = ctx.edit
    members = {id(n) for n in chain}
    first: dict[int, tuple[Value, Node]] = {}  # value id -> the first chain node (graph order) that reads it
    for node in chain:
        for v in node.inputs:
            if v is not None and (v.producer is None or id(v.producer) not in members):
                first.setdefault(id(v), (v, node))
    for vid, (v, reader) in first.items():
        if float_dtype(v) not in _NARROW:
            continue  # float32 already, or not a float (axes, shapes)
        name = edit.unique(f"{v.name}/precaudit_float32")
        island.rename[vid] = name
        const = resolve_scalar(v)
        if const is None:
            island.ups.append((reader, edit.make_node("Cast", [v.name], [name], f"{v.name}/precaudit_to_float32",
                                                      to=T.FLOAT)))
            continue
        number = const.value
        if stored_zero and number == 0 and _is_eps(v, group.node):
            number = island.new_eps = max(ctx.target.smallest_normal, ctx.min_eps or 0.0)
        shape = tuple(v.shape) if v.shape is not None and _static(v) else ()
        island.inits.append((reader, name, np.full(shape, _stored_number(v, number), np.float32)))
        island.dead.append(v)


def _outputs_back(ctx: Context, chain: list[Node], island: _Island) -> None:
    """Each narrow chain output read outside it (or a graph output): computed under a new float32 name, and cast back
    to its dtype under its own name, so every reader outside sees what it saw."""
    edit = ctx.edit
    members = {id(n) for n in chain}
    outputs = {id(v) for v in ctx.graph.outputs}
    for node in chain:
        for v in node.outputs:
            outside = [c for c in v.consumers if id(c) not in members]
            if not v.name or not (outside or id(v) in outputs):
                continue
            dtype = float_dtype(v)
            if dtype not in _NARROW:
                continue
            inner = edit.unique(f"{v.name}/precaudit_float32")
            island.out_rename[id(v)] = inner
            island.downs.append((node, edit.make_node("Cast", [inner], [v.name], f"{v.name}/precaudit_to_{dtype}",
                                                      to=ELEM_OF[dtype])))
            island.exits.append(v.name)


def _apply(ctx: Context, chain: list[Node], island: _Island) -> None:
    edit = ctx.edit
    for reader, name, array in island.inits:
        edit.add_named_initializer(reader, name, array)
    for anchor, new in island.ups:
        edit.insert_before(anchor, new)
    for anchor, new in island.downs:
        edit.insert_after(anchor, new)
    for node in chain:
        proto = edit.proto(node)
        for i, v in enumerate(node.inputs):
            if v is not None and (id(v) in island.rename or id(v) in island.out_rename):
                proto.input[i] = island.rename.get(id(v)) or island.out_rename[id(v)]
        for i, v in enumerate(node.outputs):
            if id(v) in island.out_rename:
                proto.output[i] = island.out_rename[id(v)]
    for node in chain:  # a narrowing Cast inside the chain would end the island
        if node.op_type == "Cast" and int(node.attrs.get("to", 0)) in (T.FLOAT16, T.BFLOAT16):
            edit.set_attr(node, "to", T.FLOAT)
    edit.retyped(*(v.name for n in chain for v in n.outputs if v.name))
    for v in island.dead:
        edit.orphan(*constant_producers(v))


def _static(v: Value) -> bool:
    return v.shape is not None and all(isinstance(d, int) for d in v.shape)


def _is_eps(v: Value, site: Node) -> bool:
    return any(x is v for x in site.inputs)


def _stored_number(v: Value, number: float) -> float:
    """The number as the model stores it (a float16 eps 1e-6 is 1.0133e-06): so the float32 copy adds nothing new."""
    source = skip_casts(v)
    dtype = float_dtype(source) or float_dtype(v)
    if dtype in COMPUTED and FORMATS[dtype].is_narrow:
        return float(np.asarray(number, FORMATS[dtype].np_dtype))
    return number
