"""Epsilon repairs: raise an eps to the smallest normal number of its compute dtype (or --min-eps), move an eps
from after the root to inside it, add one where a norm has none, and set stash_type=1 on a fused norm whose
statistics would run in the narrow type.

A new eps is a new initializer in the dtype the model stores the value it replaces (a Constant or initializer
other nodes read stays as it is), wired into the one node the finding names; an attribute eps is set on its node.
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np

from ..analysis.constants import resolve_scalar
from ..analysis.fused_norms import FUSED_NORMS
from ..dtypes import FORMATS, round_to_format
from ..escape import printable
from ..ir import Node
from .common import (
    const_shape,
    constant_producers,
    divisions,
    float_dtype,
    root_after,
    root_before,
    scalar_input,
    stored_array,
)
from .plan import Check, Context, Group, Repair, Skipped

__all__ = ["EPS_BAD", "new_eps", "norm_repairs"]

EPS_BAD = ("PA101", "PA102", "PA106", "PA108")  # the eps is 0, subnormal, stored as 0 or not positive there
_MAX_RAISE = 1e-3  # a raise past this would dominate ordinary variances (PA103 calls 0.01 too large)


def new_eps(ctx: Context, facts: dict, stored_zero: bool = False) -> float:
    """The eps a repair writes: the smallest normal number of the compute dtype, or --min-eps if larger; an eps
    stored as 0.0 (PA106) gets at least the target's smallest normal, whatever dtype it now computes in."""
    value = max(float(facts.get("fmt_smallest_normal") or 0.0), ctx.min_eps or 0.0)
    if stored_zero:
        value = max(value, ctx.target.smallest_normal)
    return value


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def norm_repairs(ctx: Context, group: Group) -> tuple[list[Repair], list[Skipped]]:
    """The repairs for the findings at one norm site (fused op or decomposed chain)."""
    site = group.site("norm")
    assert site is not None  # the planner sends here only the groups at a norm site
    node = group.node
    spec = FUSED_NORMS.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))
    if spec is not None:
        return _fused(ctx, group, site.facts, spec)
    return _decomposed(ctx, group, site.facts)


def _skip(group: Group, ids, reason: str, keep: list[str] | None = None) -> list[Skipped]:
    return [Skipped(r.id, r.name, group.node, reason, list(keep or [])) for r, _ in group.pairs if r.id in ids]


# ---- fused norms ---------------------------------------------------------------------------------------------


def _fused(ctx: Context, group: Group, facts: dict, spec) -> tuple[list[Repair], list[Skipped]]:
    node, ids = group.node, group.ids
    repairs, skipped = [], []
    bad = [i for i in EPS_BAD if i in ids]
    stash_ok = spec.stash_since is not None and (node.opset is None or node.opset >= spec.stash_since) \
        and node.attrs.get("stash_type") is not None and int(node.attrs["stash_type"]) != 1
    eps = facts.get("eps")
    if bad and stash_ok and eps is not None and eps > 0 and math.isfinite(eps) \
            and round_to_format(eps, FORMATS["fp32"]) >= FORMATS["fp32"].smallest_normal:
        repairs.append(_stash(ctx, group, [i for i in bad], facts))
        bad = []
    if bad:
        if spec.eps_attr is None:
            assert eps is not None  # an eps rule fired: the site's eps is known
            skipped += _skip(group, bad, f"{node.op_type}'s eps is fixed by the ONNX spec ({_fmt(eps)}); rewrite the "
                                         "norm as LayerNormalization (stash_type=1) over the same axes")
        else:
            repair = _fused_raise(ctx, group, bad, facts, spec)
            if isinstance(repair, Repair):
                repairs.append(repair)
            else:
                skipped += _skip(group, bad, repair)
    rest = ids - set(EPS_BAD)
    skipped += _skip(group, rest & {"PA104"}, f"{node.op_type}'s eps sits outside the root by the ONNX spec; "
                                              "rewrite it as LayerNormalization (stash_type=1) over the same axes")
    skipped += _skip(group, rest & {"PA105"}, f"{node.op_type} has no eps in the ONNX spec; write the norm out with "
                                              "a clamp (x / max(||x||, eps))")
    skipped += _other_norm_rules(group, rest - {"PA104", "PA105"})
    return repairs, skipped


def _other_norm_rules(group: Group, ids: set[str]) -> list[Skipped]:
    out = _skip(group, ids & {"PA103"}, "a large eps is a modelling choice: fix leaves it to you")
    out += _skip(group, ids & {"PA107"}, "an eps beyond the dtype's max: lowering it changes what the model computes "
                                         "everywhere; choose the value yourself")
    known = {"PA103", "PA107", "PA208"}
    out += [Skipped(r.id, r.name, group.node, f"no repair for {r.id}") for r, _ in group.pairs
            if r.id in ids and r.id not in known and r.id not in EPS_BAD and r.id not in ("PA104", "PA105")]
    return out


def _stash(ctx: Context, group: Group, rules: list[str], facts: dict) -> Repair:
    node = group.node
    edit = ctx.edit
    old = node.attrs.get("stash_type")
    eps = facts.get("eps")
    assert eps is not None  # _fused repairs stash_type only for a known, positive eps

    def apply() -> None:
        edit.set_attr(node, "stash_type", 1)

    edit.touched.add(id(node))
    return Repair("stash-type", node, rules, f"stash_type={old} (statistics in {facts.get('compute_dtype')})",
                  "stash_type=1 (statistics in float32, eps " + _fmt(eps) + " normal there)",
                  "exact in float32: stash_type names the dtype of the statistics, float32 either way there",
                  Check("exact", value=_out(node)), apply, nodes=[node.name], changed=_outs(node))


def _fused_raise(ctx: Context, group: Group, rules: list[str], facts: dict, spec) -> Repair | str:
    node = group.node
    old = facts.get("eps")
    new = new_eps(ctx, facts, stored_zero=old == 0)
    if new > _MAX_RAISE:
        return (f"the smallest normal {facts.get('compute_dtype')} is {_fmt(new)}: an eps that large stops the norm "
                f"normalizing; keep the norm in a wider type (precaudit keep-list)")
    edit = ctx.edit

    def apply() -> None:
        edit.set_attr(node, spec.eps_attr, float(new))

    edit.touched.add(id(node))
    check, words = _fused_check(node, old, new)
    assert old is not None  # an eps rule fired: the site's eps is known
    return Repair("eps-raise", node, rules, f"{spec.eps_attr} {_fmt(old)} ({facts.get('eps_source')})",
                  f"{spec.eps_attr} {_fmt(new)}, the smallest normal {facts.get('compute_dtype')}"
                  if new == facts.get("fmt_smallest_normal") else f"{spec.eps_attr} {_fmt(new)}",
                  words, check, apply, nodes=[node.name], changed=_outs(node))


def _fused_check(node: Node, old: float | None, new: float) -> tuple[Check, str]:
    """A fused norm's rows are scaled by sqrt((var + old)/(var + new)); var computed from its input (LayerNorm,
    InstanceNorm, GroupNorm) or its running variances (BatchNorm)."""
    old = 0.0 if old is None or not math.isfinite(old) else old
    words = (f"each row's normalized output is scaled by sqrt((var + {_fmt(old)})/(var + {_fmt(new)})): relative change "
             f"at most {_fmt(new - old)}/(2·(var + {_fmt(old)})), negligible for rows whose variance is well above "
             f"{_fmt(new)}")
    bias = _bias(node)
    if node.op_type == "BatchNormalization":
        variances = node.input(4)
        running = variances.const() if variances is not None and variances.is_const else None
        if running is None:
            return Check("none", value=_out(node)), words
        var = np.asarray(running, np.float64)
        return Check("ratio", value=_out(node), old=lambda _: np.sqrt(var + old), new=lambda _: np.sqrt(var + new),
                     offset=bias), words
    stat = _variance_of(node)
    source = node.input(0)
    if stat is None or source is None:
        return Check("none", value=_out(node)), words
    return Check("ratio", value=_out(node), stat=source.name,
                 old=lambda x: np.sqrt(stat(x) + old), new=lambda x: np.sqrt(stat(x) + new), offset=bias), words


def _variance_of(node: Node):
    """The per-row variance a fused norm computes, as a function of its input."""
    if node.op_type == "LayerNormalization":
        axis = int(node.attrs.get("axis", -1))
        return lambda x: np.var(np.asarray(x, np.float64), axis=tuple(range(axis % x.ndim, x.ndim)))
    if node.op_type == "InstanceNormalization":
        return lambda x: np.var(np.asarray(x, np.float64), axis=tuple(range(2, x.ndim)))
    if node.op_type == "GroupNormalization":
        groups = int(node.attrs.get("num_groups", 1))
        return lambda x: np.var(np.asarray(x, np.float64).reshape(x.shape[0], groups, -1), axis=-1)
    return None


def _bias(node: Node):
    """The norm's bias as a function of its output's shape (the bound is on y - bias): per channel (axis 1) for
    BatchNorm, InstanceNorm and GroupNorm, over the last axes for LayerNorm."""
    index = {"LayerNormalization": 2, "BatchNormalization": 2, "InstanceNormalization": 2,
             "GroupNormalization": 2}.get(node.op_type)
    value = node.input(index) if index is not None else None
    if value is None or not value.is_const or (value.const_size or 0) > 1 << 20:
        return None
    bias = np.asarray(value.const(), np.float64)
    if node.op_type == "LayerNormalization":
        return lambda y: bias
    return lambda y: bias.reshape((-1,) + (1,) * (y.ndim - 2))


def _outs(node: Node) -> list[str]:
    return [v.name for v in node.outputs if v.name]


def _out(node: Node) -> str | None:
    if node.subgraph_path or not node.outputs:
        return None  # a value inside an If/Loop body is no graph output of either model
    return node.outputs[0].name


# ---- decomposed chains ---------------------------------------------------------------------------------------


def _decomposed(ctx: Context, group: Group, facts: dict) -> tuple[list[Repair], list[Skipped]]:
    from .islands import island_repair, narrow_stored

    node, ids = group.node, group.ids
    placement = facts.get("eps_placement")
    chain = ctx.chains.of(node) or [node]
    keep = [n.name for n in chain]
    repairs: list[Repair] = []
    skipped: list[Skipped] = []
    bad = [i for i in EPS_BAD if i in ids]
    handled: set[str] = set()
    if "PA104" in ids:
        repair = _inside(ctx, group, facts, [*bad, "PA104"])
        if isinstance(repair, Repair):
            repairs.append(repair)
            handled |= {"PA104", *bad}
            if "PA208" in ids:
                skipped += _skip(group, {"PA208"}, "the eps moved inside the root first; run precaudit fix on the "
                                                   "fixed model again to compute the statistics in float32", keep)
                handled.add("PA208")
        else:
            skipped += _skip(group, {"PA104", *bad}, repair)
            handled |= {"PA104", *bad}
    if "PA105" in ids and "PA105" not in handled:
        repair = _add_eps(ctx, group, facts)
        if isinstance(repair, Repair):
            repairs.append(repair)
        else:
            skipped += _skip(group, {"PA105"}, repair)
        handled.add("PA105")
    if ({"PA208", *bad} & ids) - handled and narrow_stored(chain):
        repair = island_repair(ctx, group, chain, facts, [i for i in ("PA208", *bad) if i in ids and i not in handled])
        if isinstance(repair, Repair):
            repairs.append(repair)
            handled |= set(repair.rules)
    if [i for i in bad if i not in handled]:
        rules = [i for i in bad if i not in handled]
        repair = _raise_constant(ctx, group, facts, rules, placement)
        if isinstance(repair, Repair):
            repairs.append(repair)
        else:
            skipped += _skip(group, set(rules), repair, keep)
        handled |= set(rules)
    if "PA208" in ids and "PA208" not in handled:
        skipped += _skip(group, {"PA208"}, "a float32 model: a Cast to float32 written into it is a no-op that every "
                                           "converter rewrites or removes, so the fix is your converter's block list: "
                                           "keep this chain in float32 (precaudit keep-list MODEL --for CONVERTER)",
                         keep)
        handled.add("PA208")
    skipped += _other_norm_rules(group, ids - handled)
    return repairs, skipped


def _eps_input(node: Node) -> int | None:
    if node.op_type == "Clip":
        return 1 if node.input(1) is not None and resolve_scalar(node.input(1)) is not None else None
    return scalar_input(node)


def _ratio(facts: dict, placement: str | None, node: Node, old: float, new: float) -> tuple[Check, str]:
    """Check and words for an eps change at a decomposed norm's eps node (inside the root, or a guard after it)."""
    words = (f"each row is scaled by sqrt((var + {_fmt(old)})/(var + {_fmt(new)})): relative change at most "
             f"{_fmt(new - old)}/(2·(var + {_fmt(old)})), negligible where the variance is well above {_fmt(new)}")
    index = _eps_input(node) if node.op_type != "Clip" else 1
    stat = node.input(0 if index != 0 else 1)
    root = root_after(node)
    after = root is None
    if after:
        root = root_before(stat)
    if root is None or stat is None or node.subgraph_path:
        return Check("none"), words
    target = divisions(root)
    compared = (target[0] if target else root).outputs[0].name
    combine = np.maximum if node.op_type in ("Max", "Clip") else np.add
    # check.py calls old and new with the array of the check's stat, which these checks always name
    if after:  # a guard after the root: the denominator is max(root, eps) (or root + eps)
        words = (f"rows whose {'norm' if node.op_type != 'Add' else 'root'} is below {_fmt(new)} are divided by "
                 f"{_fmt(new)} instead of {_fmt(old)}; the others are unchanged")
        return Check("ratio", value=compared, stat=stat.name, old=lambda v: combine(cast(np.ndarray, v), old),
                     new=lambda v: combine(cast(np.ndarray, v), new)), words
    return Check("ratio", value=compared, stat=stat.name, old=lambda v: np.sqrt(combine(cast(np.ndarray, v), old)),
                 new=lambda v: np.sqrt(combine(cast(np.ndarray, v), new))), words


def _raise_constant(ctx: Context, group: Group, facts: dict, rules: list[str], placement: str | None) -> Repair | str:
    node = group.node
    source = str(facts.get("eps_source") or "")
    if "the cap of" in source:
        return "the eps is a cap on the reciprocal (min(1/sqrt(s), 1/eps)): raise eps where the model is written"
    old = facts.get("eps")
    new = new_eps(ctx, facts, stored_zero=old == 0)
    if new > _MAX_RAISE:
        return (f"the smallest normal {facts.get('compute_dtype')} is {_fmt(new)}: an eps that large stops the norm "
                "normalizing; keep the chain in a wider type (precaudit keep-list)")
    edit = ctx.edit
    if node.op_type == "Clip" and node.input(1) is None and "min" in node.attrs:
        def apply_attr() -> None:
            edit.set_attr(node, "min", float(new))
        assert old is not None  # an eps rule fired: the site's eps is known
        check, words = _ratio(facts, placement, node, old, new)
        edit.touched.add(id(node))
        return Repair("eps-raise", node, rules, f"eps {_fmt(old)} (attribute min)", f"min {_fmt(new)}", words, check,
                      apply_attr, nodes=[node.name], changed=_outs(node))
    index = _eps_input(node)
    if index is None:
        return "the eps is not a constant input fix can replace"
    value = node.inputs[index]
    assert value is not None  # scalar_input names an input that holds a constant
    dtype = float_dtype(value)
    array = stored_array(new, dtype, const_shape(value))
    name = edit.unique(f"{node.name}/precaudit_eps")
    others = [c for c in value.consumers if c is not node]

    def apply() -> None:
        edit.add_named_initializer(node, name, array)
        edit.set_input(node, index, name)
        edit.orphan(*constant_producers(value))

    edit.touched.add(id(node))
    assert old is not None  # an eps rule fired: the site's eps is known
    check, words = _ratio(facts, placement, node, old, new)
    shown = FORMATS[dtype].long_name if dtype else "float32"
    after = f"eps {_fmt(new)} (new {edit.constant_word} '{printable(name)}', {shown})"
    notes = [f"'{printable(value.name)}' stays as it is for {len(others)} other reader{'s' * (len(others) != 1)}"] \
        if others else []
    return Repair("eps-raise", node, rules, f"eps {_fmt(old)} ({source})", after, words, check, apply, notes,
                  nodes=[node.name], changed=[name])


def _inside(ctx: Context, group: Group, facts: dict, rules: list[str]) -> Repair | str:
    """sqrt(var) + eps → sqrt(var + eps): a new Add before the root; the old Add becomes an Identity of the root
    path (its output name, and so every reader, stays)."""
    node = group.node
    if node.op_type != "Add":
        return f"the eps after the root is a {node.op_type}, not an Add"
    index = scalar_input(node)
    if index is None:
        return "the eps is not a constant input fix can replace"
    path = node.inputs[1 - index]
    root = root_before(path)
    if root is None or root.op_type == "ReduceL2" or root.input(0) is None:
        return "no square root of a statistic found under the eps"
    if root.op_type == "Pow" and root.input(1) is not None:
        exponent = resolve_scalar(root.input(1))
        assert exponent is not None  # root_before found a root: a Pow's exponent there is the scalar 0.5 or -0.5
        if exponent.value < 0:
            return "the root is an rsqrt: no eps is added after it"
    old = facts.get("eps")
    bad = [r for r in rules if r in EPS_BAD]
    new = new_eps(ctx, facts, stored_zero=old == 0) if bad or not old or old <= 0 else old
    new = max(new, old or 0.0)
    if new > _MAX_RAISE and bad:
        return f"the smallest normal {facts.get('compute_dtype')} is {_fmt(new)}: too large for an eps"
    edit = ctx.edit
    stat = root.inputs[0]
    assert stat is not None  # checked above (root.input(0))
    dtype = float_dtype(stat)
    eps_name = edit.unique(f"{root.name}/precaudit_eps")
    add_out = edit.unique(f"{root.name}/precaudit_eps_inside_output")
    add = edit.make_node("Add", [stat.name, eps_name], [add_out], f"{root.name}/precaudit_eps_inside")

    def apply() -> None:
        edit.add_named_initializer(root, eps_name, stored_array(new, dtype, ()))
        edit.insert_before(root, add)
        edit.set_input(root, 0, add_out)
        proto = edit.proto(node)
        proto.op_type = "Identity"
        keep = proto.input[1 - index]
        del proto.input[:]
        proto.input.append(keep)

    edit.touched.update({id(node), id(root)})
    target = divisions(root)
    compared = (target[0] if target else node).outputs[0].name
    # check.py calls old and new with the array of the check's stat, which this check names
    check = Check("none") if node.subgraph_path else Check(
        "ratio", value=compared, stat=stat.name, old=lambda v: np.sqrt(np.maximum(cast(np.ndarray, v), 0)) + old,
        new=lambda v: np.sqrt(cast(np.ndarray, v) + new))
    assert old is not None  # PA104 fired: the eps after the root is known
    words = (f"each row's denominator sqrt(var) + {_fmt(old)} becomes sqrt(var + {_fmt(new)}): relative change "
             f"below {_fmt(math.sqrt(new))}/sqrt(var), negligible for rows whose variance is well above {_fmt(new)}")
    return Repair("eps-inside-root", node, rules, f"sqrt(var) + {_fmt(old)} at '{printable(node.name)}'",
                  f"sqrt(var + {_fmt(new)}) (new Add '{printable(add.name)}' before '{printable(root.name)}'; "
                  f"'{printable(node.name)}' passes the root on as an Identity)", words, check, apply,
                  nodes=[add.name, node.name], changed=[eps_name, add_out, *_outs(node)], moved_to=add.name)


def _add_eps(ctx: Context, group: Group, facts: dict) -> Repair | str:
    """A norm that divides by its root with no eps: an Add(stat, eps) before a Sqrt/Pow, a Max(norm, eps) after a
    ReduceL2 (as F.normalize clamps)."""
    root = group.node
    edit = ctx.edit
    new = new_eps(ctx, facts)
    if new > _MAX_RAISE:
        return f"the smallest normal {facts.get('compute_dtype')} is {_fmt(new)}: too large for an eps"
    if root.op_type == "ReduceL2":
        out = root.outputs[0]
        users = list(out.consumers)
        if not users or out in ctx.graph.outputs:
            return "the norm is a graph output"
        name = edit.unique(f"{root.name}/precaudit_eps")
        clamped = edit.unique(f"{out.name}/precaudit_clamped")
        node = edit.make_node("Max", [out.name, name], [clamped], f"{root.name}/precaudit_clamp")

        def apply_l2() -> None:
            edit.add_named_initializer(root, name, stored_array(new, float_dtype(out), ()))
            edit.insert_after(root, node)
            for user in users:
                for i, v in enumerate(user.inputs):
                    if v is out:
                        edit.set_input(user, i, clamped)

        edit.touched.add(id(root))
        target = divisions(root)
        # check.py calls old and new with the array of the check's stat, which this check names
        check = Check("ratio", value=target[0].outputs[0].name, stat=out.name, old=lambda v: cast(np.ndarray, v),
                      new=lambda v: np.maximum(cast(np.ndarray, v), new)) if target and not root.subgraph_path \
            else Check("none")
        return Repair("eps-add", root, ["PA105"], "x / ||x|| with no eps", f"x / max(||x||, {_fmt(new)}) "
                      f"(new Max '{printable(node.name)}')", f"exact wherever the norm is at least {_fmt(new)}",
                      check, apply_l2, nodes=[node.name], changed=[name, clamped], moved_to=node.name)
    stat = root.input(0)
    if stat is None:
        return "the root has no input"
    name = edit.unique(f"{root.name}/precaudit_eps")
    add_out = edit.unique(f"{root.name}/precaudit_eps_output")
    node = edit.make_node("Add", [stat.name, name], [add_out], f"{root.name}/precaudit_eps")

    def apply() -> None:
        edit.add_named_initializer(root, name, stored_array(new, float_dtype(stat), ()))
        edit.insert_before(root, node)
        edit.set_input(root, 0, add_out)

    edit.touched.add(id(root))
    target = divisions(root)
    compared = (target[0] if target else root).outputs[0].name
    # check.py calls old and new with the array of the check's stat, which this check names
    check = Check("none") if root.subgraph_path else Check(
        "ratio", value=compared, stat=stat.name, old=lambda v: np.sqrt(cast(np.ndarray, v)),
        new=lambda v: np.sqrt(cast(np.ndarray, v) + new))
    return Repair("eps-add", root, ["PA105"], "sqrt(var) with no eps", f"sqrt(var + {_fmt(new)}) (new Add "
                  f"'{printable(node.name)}')", f"each row is scaled by sqrt(var/(var + {_fmt(new)})): negligible where "
                  f"the variance is well above {_fmt(new)}; a row of variance 0 was 0/0 and is now 0",
                  check, apply, nodes=[node.name], changed=[name, add_out], moved_to=node.name)

