"""From findings to repairs: the audit's (rule, site) pairs grouped by node, each group handed to the module that
repairs its kind, or left alone with the reason."""

from __future__ import annotations

from collections.abc import Callable

from ..analysis.compute_dtype import DtypeResolver
from ..analysis.sites.base import Site
from ..audit_models import static_matches
from ..finding import Finding
from ..ir import Graph
from ..rules.loader import Rule
from .eps import norm_repairs
from .guards import guard
from .masks import mask_fill
from .plan import Context, Group, Left, Plan, Repair, Skipped
from .softmax import log_sigmoid, log_softmax, logsumexp_shift, max_shift

__all__ = ["audit_pairs", "plan_repairs"]

# repair kind (a rule's `repair:` key, precaudit/repairs.py) -> the code that makes it for one finding's node
_REPAIRS: dict[str, Callable[[Context, Group], Repair | str]] = {
    "log-softmax": log_softmax, "log-sigmoid": log_sigmoid, "max-shift": max_shift,
    "logsumexp-shift": logsumexp_shift, "mask-fill": mask_fill,
}


def audit_pairs(graph: Graph, resolver: DtypeResolver, rules: list[Rule], path: str,
                keep: Callable[[list[Finding]], list[Finding]] | None = None,
                weights: bool = False) -> list[tuple[Rule, Site, Finding]]:
    """Every finding of the static audit (every weight's too where weights) with the rule and the site it came from
    (in the audit's order), less those the inline suppressions and the configured ignores drop: the pass
    `precaudit check` runs."""
    return [(m.rule, m.site, m.finding) for m in static_matches(graph, resolver, rules, path, weights, keep)]


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
    guards = [(r, s) for r, s in rest if r.repair == "guard"]
    if guards:
        made = guard(ctx, Group(node, guards), sorted({r.id for r, _ in guards}))
        _record(plan, Group(node, guards), made)
    for rule, site in rest:
        if rule.repair == "guard":
            continue
        one = Group(node, [(rule, site)])
        if rule.repair in _REPAIRS:
            _record(plan, one, _REPAIRS[rule.repair](ctx, one))
        elif rule.no_repair:
            plan.skipped.append(Skipped(rule.id, rule.name, node, rule.no_repair,
                                        [node.name] if rule.keep_instead else []))
        else:
            plan.skipped.append(Skipped(rule.id, rule.name, node, f"fix has no repair for {rule.id}"
                                        + (f" (its repair '{rule.repair}' does not apply to a {site.kind} site)"
                                           if rule.repair else "")))


def _record(plan: Plan, group: Group, made: Repair | Left | str) -> None:
    if isinstance(made, Repair):
        plan.repairs.append(made)
    elif isinstance(made, Left):
        plan.skipped += [Skipped(r.id, r.name, group.node, made.reason, made.keep_fp32) for r, _ in group.pairs]
    else:
        plan.skipped += [Skipped(r.id, r.name, group.node, made) for r, _ in group.pairs]
