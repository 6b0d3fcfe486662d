"""Run rules over sites and turn every match into a Finding."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from ..analysis.sites.base import Site
from ..finding import Finding
from .condition import ConditionError
from .loader import Rule
from .template import render

__all__ = ["Match", "apply_rules", "holds", "match_rules"]


class Match(NamedTuple):
    """A rule that fired, the site it fired on (its node is the finding's, by identity) and the finding."""

    rule: Rule
    site: Site
    finding: Finding


def apply_rules(rules: Iterable[Rule], sites: list[Site], model: str) -> list[Finding]:
    """Every (rule, site) pair whose condition holds, in site order then rule id."""
    return [m.finding for m in match_rules(rules, sites, model)]


def match_rules(rules: Iterable[Rule], sites: list[Site], model: str) -> list[Match]:
    """apply_rules with the rule and the site of each finding: keep-list and fix act on the site's node."""
    by_kind: dict[str, list[Rule]] = {}  # the rules that judge each site kind, in the order given
    for rule in rules:
        for kind in dict.fromkeys(rule.sites):
            by_kind.setdefault(kind, []).append(rule)
    findings: list[Match] = []
    for site in sites:
        for rule in by_kind.get(site.kind, ()):
            if site.rule_id is not None and site.rule_id != rule.id:
                continue  # a pattern site belongs to its own rule
            if rule.ops and site.node.op_type not in rule.ops:
                continue
            env = {**site.facts, **rule.params}
            if holds(rule, env, site.node.name, model):
                findings.append(Match(rule, site, _finding(rule, site, env, model)))
    return findings


def holds(rule: Rule, env: dict[str, Any], node_name: str, model: str | None = None) -> bool:
    """The rule's condition on one site's facts; one that cannot be computed is an error at the condition's line,
    which names the node and the model it was met in (with several models, the line would not say which)."""
    try:
        return rule.condition.evaluate(env)
    except ConditionError as exc:
        where = f" of {model}" if model else ""
        raise rule.located("condition", f"condition {exc} at node {node_name!r}{where}") from None


def _finding(rule: Rule, site: Site, env: dict[str, Any], model: str) -> Finding:
    node = site.node
    return Finding(
        rule_id=rule.id, rule_name=rule.name, severity=rule.severity,
        message=render(rule.message, env), fix=render(rule.fix, env),
        model=model, node_name=node.name, op_type=node.op_type, scope=node.scope,
        source_file=node.source_file, source_line=node.source_line,
        values={k: v for k, v in site.facts.items() if not k.startswith("fmt_") and _plain(v)},
        references=list(rule.references),
        related_locations=[{"file": node.call_site[0], "line": node.call_site[1],
                            "message": "the call into the module whose forward() holds this op"}]
        if node.call_site else [],
    )


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))
