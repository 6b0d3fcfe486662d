"""Guards for an unguarded Log, Sqrt, Div or Reciprocal (PA301-PA304), where a clamp is the documented fix.

The guarded input becomes Max(x, c), c the smallest normal number of the compute dtype (or --min-eps, or
--data-floor; 0 for a Sqrt, which needs no more than non-negative): a new Max node and a new scalar initializer, in
the dtype the model stores x. A signed divisor is left alone: clamping it would change the sign of every negative
value.

Where x already comes from a Max or Clip of a constant that is 0.0 or subnormal there (a clamp(min=1e-12) before
the Log of a power spectrum), that floor is the author's, on data: raising it to 6.1e-5 moves every quiet frame from
-120 dB to -42 dB, in float32 too. So by default (--data-floor keep) it is left, with the nodes to keep in float32
instead, which changes nothing in float32; --data-floor subnormal|normal|V raises it, and the float32 gate
(--tolerance, on the user's inputs) decides whether that is written."""

from __future__ import annotations

import math

from ..analysis.constants import resolve_scalar
from ..dtypes import round_to_format
from ..escape import printable
from ..ir import Node
from .common import float_dtype, scalar_input, stored_array
from .plan import Check, Context, Group, Left, Repair

__all__ = ["guard"]

_GUARDED = {"Log": 0, "Sqrt": 0, "Reciprocal": 0, "Div": 1}


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def guard(ctx: Context, group: Group, rule_ids: list[str]) -> Repair | Left | str:
    node = group.node
    site = group.site("log", "sqrt", "div", "reciprocal")
    facts = site.facts if site is not None else {}
    index = _GUARDED.get(node.op_type)
    if index is None or node.input(index) is None:
        return f"no guardable input on a {node.op_type}"
    cls = facts.get("divisor_class") if node.op_type in ("Div", "Reciprocal") else facts.get("input_class")
    if node.op_type in ("Div", "Reciprocal") and cls == "signed":
        return ("the divisor can be negative: a clamp would change the sign of every negative value; guard it by hand "
                "(x / where(|d| < eps, eps·sign(d), d))")
    value = node.inputs[index]
    assert value is not None  # checked above
    fmt_name = facts.get("compute_dtype", "")
    edit = ctx.edit
    existing = _existing_guard(ctx, value, facts) if node.op_type != "Sqrt" else None
    # a clamp at 0 is all a square root needs; a log or a divisor needs a normal number, or the --data-floor asked
    normal = float(facts.get("fmt_smallest_normal") or 0.0)
    floor = 0.0 if node.op_type == "Sqrt" else _floor(ctx, normal, existing is not None)
    compared = None if node.subgraph_path else node.outputs[0].name
    if existing is not None and floor is None:
        guard_node, _, old = existing
        return Left(f"{guard_node.op_type} '{printable(guard_node.name)}' clamps the data at {_fmt(old)} "
                    f"({_meaning(node.op_type, old)}), {_class(old, facts)} in {fmt_name}: raising that floor changes "
                    f"what the model computes wherever the data is below it, in float32 too (to the smallest normal "
                    f"{_fmt(normal)}: {_meaning(node.op_type, normal)}); keep these nodes in float32 instead, or pass "
                    f"--data-floor subnormal|normal|V to raise it, checked against --tolerance on your --inputs",
                    [guard_node.name, node.name])
    assert floor is not None  # only a clamp already on the data is kept as it is
    words = (f"exact wherever the guarded value is at least {_fmt(floor)}; below it the clamp's value is used "
             f"({_meaning(node.op_type, floor)} instead of -inf, inf or NaN)")
    if existing is not None:
        guard_node, c_index, old = existing
        name = edit.unique(f"{guard_node.name}/precaudit_guard")
        source = guard_node.inputs[c_index]
        array = stored_array(floor, float_dtype(source), ())

        def apply_raise() -> None:
            edit.add_named_initializer(guard_node, name, array)
            edit.set_input(guard_node, c_index, name)

        edit.touched.update({id(node), id(guard_node)})
        stat = guard_node.inputs[1 - c_index] if guard_node.op_type != "Clip" else guard_node.inputs[0]
        check = Check("guard", value=compared, stat=stat.name if stat is not None else None, threshold=floor) \
            if compared else Check("none")
        return Repair("guard-raise", node, rule_ids,
                      f"{guard_node.op_type} '{printable(guard_node.name)}' clamps at {_fmt(old)} "
                      f"({_meaning(node.op_type, old)}), {_class(old, facts)} in {fmt_name}",
                      f"clamps at {_fmt(floor)} ({_meaning(node.op_type, floor)}; new {edit.constant_word} "
                      f"'{printable(name)}')", words, check, apply_raise,
                      nodes=[guard_node.name], changed=[name])
    clamp = edit.unique(f"{node.name}/precaudit_floor")
    out = edit.unique(f"{value.name}/precaudit_guarded")
    maxnode = edit.make_node("Max", [value.name, clamp], [out], f"{node.name}/precaudit_guard")
    array = stored_array(floor, float_dtype(value), ())

    def apply() -> None:
        edit.add_named_initializer(node, clamp, array)
        edit.insert_before(node, maxnode)
        edit.set_input(node, index, out)

    edit.touched.add(id(node))
    form = {"Log": "log({})", "Sqrt": "sqrt({})", "Reciprocal": "1/{}", "Div": "y / {}"}[node.op_type]
    source = facts.get("divisor_op") if node.op_type in ("Div", "Reciprocal") else facts.get("input_op")
    check = Check("guard", value=compared, stat=value.name, threshold=floor) if compared else Check("none")
    return Repair("guard", node, rule_ids, f"{form.format('x')}, x from {source}, unguarded in {fmt_name}",
                  f"{form.format(f'max(x, {_fmt(floor)})')} (new Max '{printable(maxnode.name)}')", words, check,
                  apply, nodes=[maxnode.name],
                  changed=[clamp, out])


def _floor(ctx: Context, normal: float, on_data: bool) -> float | None:
    """The floor to write: --data-floor's, else --min-eps or the smallest normal; None where a clamp already on
    the data is to be kept as it is (--data-floor keep)."""
    choice = ctx.data_floor
    if choice == "normal":
        return max(normal, ctx.min_eps or 0.0)
    if choice == "subnormal":
        return ctx.target.smallest_subnormal
    if choice != "keep":
        return float(choice)
    return None if on_data else max(normal, ctx.min_eps or 0.0)


def _meaning(op: str, floor: float) -> str:
    """What a floor means where it is read: in decibels of a power before a Log, as the largest 1/x before a
    division, as sqrt before a root."""
    if floor <= 0:
        return {"Log": "log of 0 is -inf", "Sqrt": "sqrt(0) = 0"}.get(op, "1/0 is inf")
    if op == "Log":
        return f"log {math.log(floor):.3g}, {10 * math.log10(floor):.1f} dB as a power"
    if op == "Sqrt":
        return f"sqrt {math.sqrt(floor):.3g}"
    return f"1/x at most {1 / floor:.3g}"


def _class(value: float, facts: dict) -> str:
    """What the constant is in the compute dtype: 0.0 where it rounds away, else subnormal."""
    from ..dtypes import FORMATS
    fmt = next((f for f in FORMATS.values() if f.long_name == facts.get("compute_dtype")), None)
    rounded = round_to_format(value, fmt) if fmt is not None else value
    return "0.0" if rounded == 0 else "subnormal"


def _existing_guard(ctx: Context, value, facts: dict) -> tuple[Node, int, float] | None:
    """A Max(x, c) or Clip(x, min=c) right under the guarded input whose c is 0.0 or subnormal in the compute
    dtype: (that node, c's input index, c as written)."""
    node = value.producer
    while node is not None and node.op_type in ("Cast", "Identity"):
        node = node.inputs[0].producer if node.input(0) is not None else None
    if node is None or node.op_type not in ("Max", "Clip"):
        return None
    index: int | None
    if node.op_type == "Clip":
        if node.input(1) is None:
            return None
        index = 1
    else:
        index = scalar_input(node)
        if index is None or len(node.inputs) != 2:
            return None
    const = resolve_scalar(node.inputs[index])
    if const is None:
        return None
    fmt_normal = float(facts.get("fmt_smallest_normal") or 0.0)
    from ..dtypes import FORMATS
    fmt = next((f for f in FORMATS.values() if f.long_name == facts.get("compute_dtype")), None)
    rounded = round_to_format(const.value, fmt) if fmt is not None else const.value
    if rounded >= fmt_normal:
        return None
    return node, index, const.value

