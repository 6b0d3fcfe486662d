"""From findings to repairs: the audit's (rule, site) pairs grouped by node, each group handed to the module that
repairs its kind, or left alone with the reason."""

from __future__ import annotations

from typing import Callable

from ..audit_models import static_matches
from ..analysis.compute_dtype import DtypeResolver
from ..analysis.sites import Site
from ..finding import Finding
from ..ir import Graph
from ..rules.loader import Rule
from .eps import norm_repairs
from .guards import guard
from .masks import mask_fill
from .plan import Context, Group, Left, Plan, Repair, Skipped
from .softmax import log_sigmoid, log_softmax, logsumexp_shift, max_shift

__all__ = ["audit_pairs", "plan_repairs"]

_PATTERN: dict[str, Callable[[Context, Group], Repair | str]] = {
    "PA201": log_softmax, "PA202": log_sigmoid, "PA203": max_shift, "PA204": logsumexp_shift,
}
_GUARDS = ("PA301", "PA302", "PA303", "PA304")
_LEFT = {
    "PA205": "E[x²] − E[x]² is rewritten by hand as E[(x − E[x])²] (or a fused LayerNormalization)",
    "PA206": "ONNX has no Log1p op: log(1 + x) stays; where it matters, Kahan's log(u)·x/(u − 1) with u = 1 + x "
             "(x where u == 1) computes it in any dtype",
    "PA207": "ONNX has no Expm1 op: exp(x) − 1 stays; where it matters, (u − 1)·x/log(u) with u = exp(x) (x where "
             "u == 1) computes it in any dtype",
    "PA212": "a weight beyond the target's range is the model's own number: keep its reader in float32 "
             "(precaudit keep-list) or rescale it",
    "PA213": "tiny weights are the model's own numbers: keep their reader in float32 (precaudit keep-list)",
    "PA214": "a long float16 sum: keep the reduction in float32 (precaudit keep-list)",
    "PA215": "the converter clamps every constant it converts: no number written in the file survives; pass "
             "max_finite_val=65504 to it or keep the node in float32 (precaudit keep-list)",
}

def audit_pairs(graph: Graph, resolver: DtypeResolver, rules: list[Rule], path: str,
                keep: Callable[[list[Finding]], list[Finding]] | None = None) -> list[tuple[Rule, Site, Finding]]:
    """Every finding of the static audit with the rule and the site it came from (in the audit's order), less
    those the inline suppressions and the configured ignores drop: the pass `precaudit check` runs."""
    return [tuple(m) for m in static_matches(graph, resolver, rules, path, keep=keep)]


def plan_repairs(ctx: Context, pairs: list[tuple[Rule, Site]]) -> Plan:
    plan = Plan()
    order = {id(n): i for i, n in enumerate(ctx.graph.nodes)}
    groups: dict[int, Group] = {}
    for rule, site in pairs:
        groups.setdefault(id(site.node), Group(site.node, [])).pairs.append((rule, site))
    for group in sorted(groups.values(), key=lambda g: order.get(id(g.node), 0)):
        _plan_group(ctx, group, plan)
    if ctx.edit.inlined:
        plan.notes.append("the model's local functions were inlined (the audit reads them inlined): the fixed model "
                          "holds their nodes in place of the calls")
    return plan


def _plan_group(ctx: Context, group: Group, plan: Plan) -> None:
    node = group.node
    if id(node) in ctx.edit.touched:
        for rule, _ in group.pairs:
            plan.skipped.append(Skipped(rule.id, rule.name, node, "another repair already changed this node: run "
                                        "precaudit fix again on the fixed model"))
        return
    norm = [(r, s) for r, s in group.pairs if s.kind == "norm"]
    if norm:
        repairs, skipped = norm_repairs(ctx, Group(node, norm))
        plan.repairs += repairs
        plan.skipped += skipped
    rest = [(r, s) for r, s in group.pairs if s.kind != "norm"]
    guards = [(r, s) for r, s in rest if r.id in _GUARDS]
    if guards:
        made = guard(ctx, Group(node, guards), sorted({r.id for r, _ in guards}))
        _record(plan, Group(node, guards), made)
    for rule, site in rest:
        if rule.id in _GUARDS:
            continue
        one = Group(node, [(rule, site)])
        if rule.id in _PATTERN:
            _record(plan, one, _PATTERN[rule.id](ctx, one))
        elif rule.id == "PA209":
            _record(plan, one, mask_fill(ctx, one))
        elif rule.id in _LEFT:
            plan.skipped.append(Skipped(rule.id, rule.name, node, _LEFT[rule.id],
                                        [node.name] if rule.id in ("PA212", "PA213", "PA214", "PA215") else []))
        else:
            plan.skipped.append(Skipped(rule.id, rule.name, node, f"fix has no repair for {rule.id}"))


def _record(plan: Plan, group: Group, made: Repair | Left | str) -> None:
    if isinstance(made, Repair):
        plan.repairs.append(made)
    elif isinstance(made, Left):
        plan.skipped += [Skipped(r.id, r.name, group.node, made.reason, made.keep_fp32) for r, _ in group.pairs]
    else:
        plan.skipped += [Skipped(r.id, r.name, group.node, made) for r, _ in group.pairs]
