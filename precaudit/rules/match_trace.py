"""Why a rule did or did not fire at each candidate node: the match trace rule authors read."""

from __future__ import annotations

from fnmatch import fnmatchcase

from ..analysis.collect import collect_sites
from ..analysis.compute_dtype import DtypeResolver
from ..analysis.pattern import match_node
from ..dtypes import FORMATS
from ..ir import Graph
from .engine import holds
from .loader import Rule

__all__ = ["trace_rule"]


def trace_rule(graph: Graph, resolver: DtypeResolver, rule: Rule, node_glob: str = "*") -> list[str]:
    """One line per candidate node: fired, or the first reason it did not."""
    if rule.pattern is not None:
        return _trace_pattern(graph, resolver, rule, node_glob)
    lines = []
    for site in collect_sites(graph, resolver, {}):
        if site.kind not in rule.sites or not fnmatchcase(site.node.name, node_glob):
            continue
        where = f"node '{site.node.name}' ({site.node.op_type}, {site.kind} site)"
        if rule.ops and site.node.op_type not in rule.ops:
            lines.append(f"{where}: skipped, the rule applies to ops {', '.join(rule.ops)}")
            continue
        lines.append(f"{where}: {_verdict(rule, {**site.facts, **rule.params}, site.node.name)}")
    if not lines:
        lines.append(f"no {' or '.join(rule.sites)} site in the graph{_glob_note(node_glob)}")
        lines += [line for kind in rule.sites for line in _no_site(graph, kind, node_glob)]
    return lines


_TRACED_FROM = {"traced_angle": "angle", "traced_integer": "integer_float"}
_GUARDED_OPS = ("Div", "Reciprocal", "Log", "Sqrt", "Pow")


def _no_site(graph: Graph, kind: str, node_glob: str) -> list[str]:
    """Why the candidate nodes of a site kind are none: what a Sin/Cos reads when it is no angle, what a division
    reads when no guard sits on it, which site a traced rule measures."""
    from ..analysis.canonical import producer
    from ..analysis.sites.guard import guarded_input

    if kind.startswith("traced_"):
        measured = _TRACED_FROM.get(kind)
        return [f"  {kind} sites come from a traced run (precaudit MODEL --trace): match reads the graph alone"
                + (f"; they are the {measured} sites, measured" if measured else "")]
    lines = []
    for node in graph.nodes:
        if not fnmatchcase(node.name, node_glob):
            continue
        if kind == "angle" and node.op_type in ("Sin", "Cos"):
            made = producer(node.input(0))
            what = f"{made.op_type} '{made.name}'" if made is not None else "a graph input or a constant"
            lines.append(f"  node '{node.name}' ({node.op_type}) reads {what}: no value made from integers (a Range, "
                         f"a CumSum of ones, a Cast of integers) and constants alone, so no angle made from positions")
        elif kind == "guard" and node.op_type in _GUARDED_OPS:
            made = producer(guarded_input(node))
            what = f"{made.op_type} '{made.name}'" if made is not None else "a graph input or a constant"
            lines.append(f"  node '{node.name}' ({node.op_type}) reads {what}: no Add, Max or Clip of a constant "
                         f"between 0 and 1 (or an Add of 0.0 stored in float16), so no guard")
        elif kind == "integer_float" and node.op_type in ("Range", "CumSum") and node.outputs:
            dtype = node.outputs[0].dtype
            why = f"in {dtype}, where integers are exact until a cast to a float" if dtype not in FORMATS else \
                "a cumulative sum of something other than ones (no count)"
            lines.append(f"  node '{node.name}' ({node.op_type}) computes {why}")
    return lines


def _trace_pattern(graph: Graph, resolver: DtypeResolver, rule: Rule, node_glob: str) -> list[str]:
    pattern = rule.pattern
    assert pattern is not None  # trace_rule sends only a pattern rule here
    lines = []
    matched = {id(s.node): s for s in collect_sites(graph, resolver, {rule.id: pattern}) if s.rule_id == rule.id}
    for node in graph.nodes:
        if node.op_type not in pattern.ops or not fnmatchcase(node.name, node_glob):
            continue
        result = match_node(pattern, node)
        where = f"node '{node.name}' ({node.op_type})"
        if not result.ok:
            lines.append(f"{where}: no match: {result.reason}")
        elif id(node) not in matched:
            lines.append(f"{where}: matched, but the node computes in no float dtype")
        else:
            lines.append(f"{where}: matched; {_verdict(rule, {**matched[id(node)].facts, **rule.params}, node.name)}")
    if not lines:
        lines.append(f"no {' or '.join(pattern.ops)} node in the graph{_glob_note(node_glob)}")
    return lines


def _verdict(rule: Rule, env: dict, node_name: str) -> str:
    values = ", ".join(f"{name}={env.get(name)!r}" for name in sorted(rule.condition.names))
    if holds(rule, env, node_name):
        return f"FIRES ({values})" if values else "FIRES"
    return f"condition `{rule.condition.text}` is false with {values}"


def _glob_note(node_glob: str) -> str:
    return f" whose name matches {node_glob!r}" if node_glob != "*" else ""
