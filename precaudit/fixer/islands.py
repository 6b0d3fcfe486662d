"""A decomposed norm's statistics in float32, in a model stored in float16 or bfloat16: Casts around the chain, as
a converter's block list leaves a blocked node (Cast up at its inputs, Cast back at its outputs), and its constants
written as float32 initializers.

Only where the model stores the chain in the narrow type. In a float32 model a Cast to float32 is a no-op that every
converter rewrites, retypes or removes (docs/dtypes.md): there the fix is the converter's block list
(precaudit keep-list) and, for the eps, a raise; eps.py says so.
"""

from __future__ import annotations

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


def island_repair(ctx: Context, group: Group, chain: list[Node], facts: dict, rules: list[str]) -> Repair | str:
    edit = ctx.edit
    if any(id(n) in edit.touched for n in chain):
        return "another repair changed this chain already"
    members = {id(n) for n in chain}
    outputs = {id(v) for v in ctx.graph.outputs}
    first: dict[int, tuple[Value, Node]] = {}  # value id -> the first chain node (graph order) that reads it
    for node in chain:
        for v in node.inputs:
            if v is not None and (v.producer is None or id(v.producer) not in members):
                first.setdefault(id(v), (v, node))
    ups: list[tuple[Node, NodeProto]] = []  # (anchor, new node)
    inits: list[tuple[Node, str, np.ndarray]] = []
    rename: dict[int, str] = {}  # outside value id -> name chain nodes read instead
    dead: list = []  # the Constants (and Casts of them) chain nodes no longer read
    stored_zero = "PA106" in rules
    new_eps = None
    for vid, (v, reader) in first.items():
        dtype = float_dtype(v)
        if dtype not in _NARROW:
            continue  # float32 already, or not a float (axes, shapes)
        const = resolve_scalar(v)
        if const is not None:
            number = const.value
            if stored_zero and number == 0 and _is_eps(v, group.node):
                number = max(ctx.target.smallest_normal, ctx.min_eps or 0.0)
                new_eps = number
            name = edit.unique(f"{v.name}/precaudit_float32")
            stored = _stored_number(v, number)
            shape = v.shape
            inits.append((reader, name, np.full(tuple(shape) if shape is not None and _static(v) else (), stored,
                                                np.float32)))
            dead.append(v)
            rename[vid] = name
            continue
        name = edit.unique(f"{v.name}/precaudit_float32")
        ups.append((reader, edit.make_node("Cast", [v.name], [name], f"{v.name}/precaudit_to_float32", to=T.FLOAT)))
        rename[vid] = name
    downs: list[tuple[Node, NodeProto]] = []
    out_rename: dict[int, str] = {}
    exits: list[str] = []
    for node in chain:
        for v in node.outputs:
            outside = [c for c in v.consumers if id(c) not in members]
            if not v.name or not (outside or id(v) in outputs):
                continue
            dtype = float_dtype(v)
            if dtype not in _NARROW:
                continue
            inner = edit.unique(f"{v.name}/precaudit_float32")
            out_rename[id(v)] = inner
            downs.append((node, edit.make_node("Cast", [inner], [v.name], f"{v.name}/precaudit_to_{dtype}",
                                               to=ELEM_OF[dtype])))
            exits.append(v.name)
    if not exits:
        return "the chain's result is not read outside it"
    narrowing = [n for n in chain if n.op_type == "Cast" and int(n.attrs.get("to", 0)) in (T.FLOAT16, T.BFLOAT16)]

    def apply() -> None:
        for reader, name, array in inits:
            edit.add_named_initializer(reader, name, array)
        for anchor, new in ups:
            edit.insert_before(anchor, new)
        for anchor, new in downs:
            edit.insert_after(anchor, new)
        for node in chain:
            proto = edit.proto(node)
            for i, v in enumerate(node.inputs):
                if v is None:
                    continue
                if id(v) in rename:
                    proto.input[i] = rename[id(v)]
                elif id(v) in out_rename:
                    proto.input[i] = out_rename[id(v)]
            for i, v in enumerate(node.outputs):
                if id(v) in out_rename:
                    proto.output[i] = out_rename[id(v)]
        for cast in narrowing:  # a narrowing Cast inside the chain would end the island
            edit.set_attr(cast, "to", T.FLOAT)
        edit.retyped(*(v.name for n in chain for v in n.outputs if v.name))
        for v in dead:
            edit.orphan(*constant_producers(v))

    for node in chain:
        edit.touched.add(id(node))
    dtype_words = FORMATS[float_dtype(chain[-1].outputs[0]) or "fp16"].long_name
    after = (f"statistics in float32: {len(ups)} Cast{'s' * (len(ups) != 1)} to float32 at the chain's inputs, "
             f"{len(downs)} back to {dtype_words} at '{printable(exits[0])}'" + (" and more" if len(exits) > 1 else "")
             + f", {len(inits)} constant{'s' * (len(inits) != 1)} as float32 initializers")
    if new_eps is not None:
        after += f"; eps stored as 0.0 raised to {new_eps:.4g}"
    check = Check("exact", value=exits[0]) if not chain[0].subgraph_path else Check("none")
    words = ("exact in float32: every added Cast is a no-op there and each constant keeps the number the model stores"
             + ("; the eps stored as 0.0 adds rows' worth of eps only where the variance is near 0" if new_eps else ""))
    if new_eps is not None:
        check = Check("none")
    return Repair("norm-float32", group.node, rules,
                  f"{len(chain)} nodes ({chain[0].op_type} … {chain[-1].op_type}) computing in {dtype_words}",
                  after, words, check, apply,
                  nodes=[n.name for _, n in ups] + [n.name for _, n in downs],
                  changed=[name for _, name, _ in inits] + [o for _, n in ups for o in n.output]
                  + [out_rename.get(id(v), v.name) for n in chain for v in n.outputs if v.name])


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
