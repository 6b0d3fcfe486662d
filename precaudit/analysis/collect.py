"""All the sites of a graph for a rule set: fused ops, single ops, decomposed chains, pattern matches."""

from __future__ import annotations

from ..ir import Graph
from .compute_dtype import DtypeResolver
from .decomposed import find_decomposed_norms
from .pattern import OpP
from .signs import SignAnalysis
from .sites import Site, find_constant_sites, find_pattern_sites, find_sites

__all__ = ["collect_sites"]


def collect_sites(graph: Graph, resolver: DtypeResolver, patterns: dict[str, OpP]) -> list[Site]:
    """Sites in graph order; patterns maps a rule id to the op pattern that makes its sites."""
    chains = find_decomposed_norms(graph, resolver)
    sites = find_sites(graph, resolver, SignAnalysis(resolver))
    for site in sites:
        if site.kind != "norm":
            # a division or sqrt that a recognized norm chain accounts for is judged by the norm rules
            site.facts["in_norm_chain"] = any(id(n) in chains.claimed for n in (site.span or [site.node]))
    sites += chains.sites + find_constant_sites(graph, resolver)
    for site in sites:
        owner = graph.module_eps.get(site.node.scope or "")
        if site.kind == "norm" and owner:
            where = f"'{site.node.scope}'" if site.node.scope else "the top module"
            site.facts["eps_source"] += f", from {owner} in {where}"  # the attribute the user changes
    for rule_id, pattern in patterns.items():
        sites += find_pattern_sites(graph, resolver, rule_id, pattern)
    order = {id(node): i for i, node in enumerate(graph.nodes)}
    return sorted(sites, key=lambda s: order[id(s.node)])
