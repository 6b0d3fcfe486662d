"""Rewrites of unstable softmax and log forms into their stable equivalents, each mathematically the same function:
Log(Softmax(x)) → LogSoftmax(x), Log(Sigmoid(x)) → -Softplus(-x), exp(x)/sum(exp(x)) → the same of x - max(x), and
log(sum(exp(x))) → max(x) + log(sum(exp(x - max(x)))). The node the finding names keeps its name and its output
name, so every reader (and a graph output) is untouched."""

from __future__ import annotations

import numpy as np

from ..analysis.constants import skip_casts
from ..escape import printable
from ..ir import Node, Value
from .common import float_dtype, int_list
from .model import ELEM_OF, Editable
from .plan import Check, Context, Group, Repair

__all__ = ["log_sigmoid", "log_softmax", "logsumexp_shift", "max_shift"]

_EXACT_WORDS = "exact: the same function, computed without the step that overflows or rounds to 0 (float32 rounding only)"


def _casts_between(value: Value | None) -> list[Node]:
    """The Cast/Identity nodes between a value and what made it (skip_casts's path)."""
    path = []
    while value is not None and value.producer is not None and value.producer.op_type in ("Cast", "Identity"):
        path.append(value.producer)
        value = value.producer.input(0)
    return path


def _compared(node: Node) -> str | None:
    return None if node.subgraph_path or not node.outputs else node.outputs[0].name


def _cast_if_needed(ctx: Context, value: Value, want: str | None, near: Node, hint: str) -> tuple[str, list]:
    """value's name, or a new Cast of it to `want` when its stored dtype differs (a Cast sat between the ops)."""
    have = float_dtype(value)
    if want is None or have is None or have == want:
        return value.name, []
    out = ctx.edit.unique(f"{hint}_output")
    node = ctx.edit.make_node("Cast", [value.name], [out], hint, to=ELEM_OF[want])
    return out, [node]


def _sole_readers(node: Node, allowed: set[int]) -> bool:
    """Whether every reader of node's output (through Casts) is one of `allowed`: a rewrite then changes no one
    else."""
    frontier = list(node.outputs)
    for _ in range(4):
        nxt = []
        for v in frontier:
            for user in v.consumers:
                if id(user) in allowed:
                    continue
                if user.op_type in ("Cast", "Identity"):
                    nxt.extend(user.outputs)
                else:
                    return False
        frontier = nxt
    return True


def _under_log(ctx: Context, log: Node, op_type: str) -> tuple[Node, str, list] | str:
    """The op_type node a Log reads (through Casts), and its input as the Log's dtype (a name, and the Cast that
    makes it where one is needed); or why there is none."""
    source = skip_casts(log.input(0))
    inner = source.producer if source is not None else None
    if inner is None or inner.op_type != op_type or inner.input(0) is None:
        return f"no {op_type} found under the Log"
    x = inner.inputs[0]
    assert x is not None  # checked above
    name, casts = _cast_if_needed(ctx, x, float_dtype(log.input(0)), log, f"{log.name}/precaudit_cast")
    return inner, name, casts


def log_softmax(ctx: Context, group: Group) -> Repair | str:
    log = group.node
    found = _under_log(ctx, log, "Softmax")
    if isinstance(found, str):
        return found
    softmax, name, casts = found
    edit = ctx.edit
    axis = softmax.attrs.get("axis")

    def apply() -> None:
        if casts:
            edit.insert_before(log, *casts)
        proto = edit.proto(log)
        proto.op_type = "LogSoftmax"
        del proto.input[:]
        proto.input.append(name)
        if axis is not None:
            edit.set_attr(log, "axis", int(axis))
        edit.orphan(softmax, *_casts_between(log.input(0)))

    edit.touched.add(id(log))
    where = f"axis {axis}" if axis is not None else "the default axis"
    return Repair("log-softmax", log, sorted(group.ids), f"Log(Softmax(x)) at '{printable(log.name)}'",
                  f"LogSoftmax(x, {where}) (the same node, op changed; Softmax "
                  f"'{printable(softmax.name)}' removed if nothing else reads it)", _EXACT_WORDS,
                  Check("exact", value=_compared(log)), apply, nodes=[log.name],
                  changed=[*(o for c in casts for o in c.output), log.outputs[0].name])


def log_sigmoid(ctx: Context, group: Group) -> Repair | str:
    log = group.node
    found = _under_log(ctx, log, "Sigmoid")
    if isinstance(found, str):
        return found
    sigmoid, name, casts = found
    edit = ctx.edit
    neg_out = edit.unique(f"{log.name}/precaudit_neg_output")
    sp_out = edit.unique(f"{log.name}/precaudit_softplus_output")
    neg = edit.make_node("Neg", [name], [neg_out], f"{log.name}/precaudit_neg")
    softplus = edit.make_node("Softplus", [neg_out], [sp_out], f"{log.name}/precaudit_softplus")

    def apply() -> None:
        edit.insert_before(log, *casts, neg, softplus)
        proto = edit.proto(log)
        proto.op_type = "Neg"
        del proto.input[:]
        proto.input.append(sp_out)
        edit.orphan(sigmoid, *_casts_between(log.input(0)))

    edit.touched.add(id(log))
    return Repair("log-sigmoid", log, sorted(group.ids), f"Log(Sigmoid(x)) at '{printable(log.name)}'",
                  f"-Softplus(-x) (new Neg '{printable(neg.name)}' → Softplus '{printable(softplus.name)}'; "
                  f"'{printable(log.name)}' becomes the outer Neg)", _EXACT_WORDS,
                  Check("exact", value=_compared(log)), apply, nodes=[neg.name, softplus.name, log.name],
                  changed=[*(o for c in casts for o in c.output), neg_out, sp_out, log.outputs[0].name])


def _reduce_axes(node: Node) -> tuple[list[int] | None, bool]:
    """A ReduceSum's axes (attribute, or a constant input) and whether they are known."""
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]], True
    if node.input(1) is not None:
        axes = int_list(node.inputs[1])
        return axes, axes is not None
    if node.attrs.get("noop_with_empty_axes", 0):
        return None, False
    return [], True  # every axis


def _reduce_max(ctx: Context, x: str, axes: list[int], keepdims: int, hint: str, near: Node) -> tuple[list, str, list]:
    """A ReduceMax over the same axes, written for the model's opset (axes an input from opset 18)."""
    edit = ctx.edit
    out = edit.unique(f"{hint}_output")
    opset = near.opset or 13
    inits = []
    if opset >= 18:
        inputs = [x]
        if axes:
            axes_name = edit.unique(f"{hint}_axes")
            inits.append((axes_name, axes))
            inputs.append(axes_name)
        node = edit.make_node("ReduceMax", inputs, [out], hint, keepdims=keepdims)
    else:
        attrs = {"axes": axes} if axes else {}
        node = edit.make_node("ReduceMax", [x], [out], hint, keepdims=keepdims, **attrs)
    return [node], out, inits


def _exp_under(value: Value | None) -> Node | None:
    source = skip_casts(value)
    node = source.producer if source is not None else None
    return node if node is not None and node.op_type == "Exp" else None


def _sum_under(value: Value | None) -> Node | None:
    source = skip_casts(value)
    node = source.producer if source is not None else None
    return node if node is not None and node.op_type == "ReduceSum" else None


def _shift(ctx: Context, exp: Node, reduce: Node, hint: str) -> tuple[list, list, str, str] | str:
    """Nodes that make x - max(x) for the Exp (max over the ReduceSum's axes, kept dims), and the new input."""
    axes, known = _reduce_axes(reduce)
    if not known:
        return "the sum's axes are computed at run time"
    x = exp.input(0)
    if x is None:
        return "the Exp has no input"
    nodes, m, inits = _reduce_max(ctx, x.name, axes or [], 1, f"{hint}_max", exp)
    shifted = ctx.edit.unique(f"{hint}_shifted")
    nodes.append(ctx.edit.make_node("Sub", [x.name, m], [shifted], f"{hint}_sub"))
    return nodes, [(n, np.asarray(v, np.int64)) for n, v in inits], shifted, m


def _shift_exp(edit: Editable, exp: Node, nodes: list, inits: list, shifted: str) -> None:
    """Write _shift's nodes and constants in before the Exp, which then reads x - max(x)."""
    for name, array in inits:
        edit.add_named_initializer(exp, name, array)
    edit.insert_before(exp, *nodes)
    edit.set_input(exp, 0, shifted)


def max_shift(ctx: Context, group: Group) -> Repair | str:
    div = group.node
    exp, reduce = _exp_under(div.input(0)), _sum_under(div.input(1))
    sum_value = div.input(1)
    divisor = sum_value.producer if sum_value is not None else None
    if reduce is None and divisor is not None and divisor.op_type == "Add":
        return ("the divisor is sum(exp(x)) + eps: the max shift would scale what the eps adds by exp(-max), so it "
                "is not exact; keep the softmax in float32 (precaudit keep-list) or write torch.softmax")
    if exp is None or reduce is None or _exp_under(reduce.input(0)) is not exp:
        return "the numerator and the sum do not read one Exp"
    allowed = {id(div), id(reduce)}
    if not _sole_readers(exp, allowed):
        return "the Exp is read by other nodes too, whose values the shift would change"
    made = _shift(ctx, exp, reduce, f"{exp.name}/precaudit")
    if isinstance(made, str):
        return made
    nodes, inits, shifted, _ = made
    edit = ctx.edit

    def apply() -> None:
        _shift_exp(edit, exp, nodes, inits, shifted)

    edit.touched.update({id(div), id(exp)})
    return Repair("max-shift", div, sorted(group.ids), f"exp(x) / sum(exp(x)) at '{printable(div.name)}'",
                  f"exp(x - max(x)) / sum(exp(x - max(x))) (new ReduceMax '{printable(nodes[0].name)}' and Sub "
                  f"'{printable(nodes[1].name)}' before Exp '{printable(exp.name)}')", _EXACT_WORDS,
                  Check("exact", value=_compared(div)), apply, nodes=[n.name for n in nodes],
                  changed=[o for n in nodes for o in n.output] + [n for n, _ in inits])


def logsumexp_shift(ctx: Context, group: Group) -> Repair | str:
    log = group.node
    reduce = _sum_under(log.input(0))
    exp = _exp_under(reduce.input(0)) if reduce is not None else None
    if exp is None:
        return "no ReduceSum(Exp(x)) under the Log"
    assert reduce is not None  # exp was found under it
    if not _sole_readers(exp, {id(reduce)}) or not _sole_readers(reduce, {id(log)}):
        return "the Exp or the sum is read by other nodes too, whose values the shift would change"
    made = _shift(ctx, exp, reduce, f"{exp.name}/precaudit")
    if isinstance(made, str):
        return made
    nodes, inits, shifted, m_keep = made
    x = exp.inputs[0]
    assert x is not None  # _shift made its nodes: the Exp has an input
    edit = ctx.edit
    keepdims = int(reduce.attrs.get("keepdims", 1))
    out = log.outputs[0]
    inner = edit.unique(f"{out.name}/precaudit_shifted")
    after: list = []
    m_out = m_keep
    if not keepdims:
        more, m_out, extra = _reduce_max(ctx, x.name, _reduce_axes(reduce)[0] or [], 0,
                                         f"{exp.name}/precaudit_max_out", exp)
        inits += [(n, np.asarray(v, np.int64)) for n, v in extra]
        nodes += more
    m_name, cast = _cast_if_needed(ctx, _named(x, m_out), float_dtype(out), log,
                                   f"{log.name}/precaudit_cast")
    after += cast
    add = edit.make_node("Add", [inner, m_name], [out.name], f"{log.name}/precaudit_add_max")
    after.append(add)

    def apply() -> None:
        _shift_exp(edit, exp, nodes, inits, shifted)
        edit.proto(log).output[0] = inner
        edit.insert_after(log, *after)
        edit.retyped(out.name)

    edit.touched.update({id(log), id(exp)})
    return Repair("logsumexp-shift", log, sorted(group.ids), f"log(sum(exp(x))) at '{printable(log.name)}'",
                  f"max(x) + log(sum(exp(x - max(x)))) (new ReduceMax '{printable(nodes[0].name)}', Sub "
                  f"'{printable(nodes[1].name)}' before Exp '{printable(exp.name)}', Add '{printable(add.name)}' "
                  f"after the Log, which makes '{printable(out.name)}' as before)", _EXACT_WORDS,
                  Check("exact", value=_compared(log)), apply, nodes=[*(n.name for n in nodes), add.name],
                  changed=[o for n in [*nodes, *after] for o in n.output] + [n for n, _ in inits] + [inner])


def _named(like: Value, name: str) -> Value:
    """A stand-in Value called name with like's dtype (a new node's output has no IR value)."""
    return Value(name=name, dtype=like.dtype)

