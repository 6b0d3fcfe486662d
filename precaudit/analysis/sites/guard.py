"""Guard sites: an eps added to, or a floor (Max, Clip) on, what a division, a negative power, a Log or a Sqrt
reads, outside any norm."""

from __future__ import annotations

from ...dtypes import COMPUTED, FORMATS
from ...ir import Node, Value
from ..canonical import producer
from ..compute_dtype import DtypeResolver
from ..constants import ScalarConst, resolve_scalar
from ..decomposed import narrower
from ..signs import SignAnalysis
from .base import Site
from .facts import dtype_facts, eps_facts
from .walks import scalar_of

__all__ = ["guard_site", "guarded_input"]


def _stored_narrow(value: Value | None) -> bool:
    """A constant stored in a narrow float (float16, bfloat16, fp8), through Casts and shape ops."""
    for _ in range(4):
        if value is None or value.is_const:
            break
        node = producer(value)
        value = node.input(0) if node is not None and node.op_type in ("Cast", "Identity", "Reshape", "Unsqueeze",
                                                                       "Expand", "Constant") else None
    if value is not None and not value.is_const:
        return False
    return value is not None and value.dtype in COMPUTED and FORMATS[value.dtype].is_narrow


def guarded_input(node: Node) -> Value | None:
    """What a guard would sit on: a Div's divisor, a Reciprocal's, Log's or Sqrt's input, a negative power's base."""
    if node.op_type == "Div":
        return node.input(1)
    if node.op_type == "Pow":
        exponent = scalar_of(node.input(1))
        return node.input(0) if exponent is not None and exponent < 0 else None
    return node.input(0) if node.op_type in ("Reciprocal", "Log", "Sqrt") else None


def guard_site(reader: Node, resolver: DtypeResolver, signs: SignAnalysis) -> Site | None:
    """y + eps, max(y, eps) or clip(y, min=eps) under the reader, eps a positive constant: the guard's site."""
    read = guarded_input(reader)
    guard = producer(read)
    if guard is None or guard.op_type not in ("Add", "Max", "Clip"):
        return None
    const, guarded, stored_zero = None, None, False
    if guard.op_type == "Clip":
        const = resolve_scalar(guard.input(1)) if guard.input(1) is not None else None
        if const is None and "min" in guard.attrs:
            const = ScalarConst(float(guard.attrs["min"]), "attribute min")
        guarded = guard.input(0)
    elif len(guard.inputs) == 2:
        for i in (0, 1):
            found, other = resolve_scalar(guard.input(i)), guard.input(1 - i)
            if found is not None and not (other is not None and other.is_const):
                const, guarded = found, other
                stored_zero = found.value == 0 and guard.op_type == "Add" and _stored_narrow(guard.input(i))
                break
    # an eps, not a bias or a shift; or y + 0.0 stored in float16: nobody writes that, an fp16 export leaves it of
    # an eps that rounded away (max(y, 0) is a ReLU, not a guard)
    if const is None or not (0 < const.value < 1 or stored_zero):
        return None
    # a guard kept in float32 whose reader is not is cast back to the reader's dtype (a converter's block list
    # does that): the eps must survive there too
    dtype = narrower(resolver.of_node(guard), resolver.of_node(reader), reader)
    if dtype is None:
        return None
    facts = {"op": guard.op_type, "guard_op": guard.op_type, "reader": reader.name, "reader_op": reader.op_type,
             "guarded_class": signs.of(guarded), "reader_input_class": signs.of(read),
             "in_norm_chain": False, "eps_source": const.source,
             "eps_role": "guard", "eps_placement": "guard", "keep_hint": guard.op_type,
             **eps_facts(const, dtype), **dtype_facts(dtype, resolver)}
    return Site("guard", guard, facts, span=[guard, reader])
