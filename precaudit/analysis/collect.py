"""All the sites of a graph for a rule set: fused ops, single ops, decomposed chains, pattern matches."""

from __future__ import annotations

from ..ir import Graph
from .compute_dtype import DtypeResolver
from .decomposed import find_decomposed_norms
from .pattern import OpP
from .signs import SignAnalysis
from .sites.angle import angle_site
from .sites.base import OP_SITES, Site
from .sites.constant import find_constant_sites
from .sites.guard import guard_site
from .sites.integer_float import integer_site
from .sites.norm import find_norm_sites
from .sites.ops import op_site
from .sites.pattern import find_pattern_sites
from .sites.quant import find_quant_sites
from .sites.reduction import REDUCTIONS, reduction_site
from .sites.type_support import find_type_support_sites

__all__ = ["collect_sites"]


def collect_sites(graph: Graph, resolver: DtypeResolver, patterns: dict[str, OpP]) -> list[Site]:
    """Sites in graph order; patterns maps a rule id to the op pattern that makes its sites."""
    chains = find_decomposed_norms(graph, resolver)
    sites = _find_sites(graph, resolver, SignAnalysis(resolver))
    for site in sites:
        if site.kind != "norm":
            # a division or sqrt that a recognized norm chain accounts for is judged by the norm rules
            site.facts["in_norm_chain"] = any(id(n) in chains.claimed for n in (site.span or [site.node]))
    sites += chains.sites + find_constant_sites(graph, resolver) + find_quant_sites(graph, resolver) + \
        find_type_support_sites(graph, resolver)
    for site in sites:
        owner = graph.module_eps.get(site.node.scope or "")
        if site.kind == "norm" and owner:
            where = f"'{site.node.scope}'" if site.node.scope else "the top module"
            site.facts["eps_source"] += f", from {owner} in {where}"  # the attribute the user changes
    for rule_id, pattern in patterns.items():
        sites += find_pattern_sites(graph, resolver, rule_id, pattern)
    order = {id(node): i for i, node in enumerate(graph.nodes)}
    return sorted(sites, key=lambda s: order[id(s.node)])


def _find_sites(graph: Graph, resolver: DtypeResolver, signs: SignAnalysis) -> list[Site]:
    """Every fused-norm, single-op and reduction site of the graph, in graph order."""
    sites = {id(site.node): site for site in find_norm_sites(graph, resolver)}
    reductions = []
    guards: dict[int, Site] = {}
    for node in graph.nodes:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in OP_SITES:
            site = op_site(node, resolver, signs)
            if site is not None:
                sites[id(node)] = site
            guard = guard_site(node, resolver, signs)
            if guard is not None and id(guard.node) not in guards:
                guards[id(guard.node)] = guard
        elif node.op_type in ("Sin", "Cos"):
            site = angle_site(node, resolver)
            if site is not None:
                reductions.append(site)
        elif node.op_type in REDUCTIONS:
            site = reduction_site(node, resolver)
            if site is not None:
                reductions.append(site)
        if node.op_type in ("Range", "CumSum", "Cast"):
            site = integer_site(node, resolver)
            if site is not None:
                reductions.append(site)
    order = {id(node): i for i, node in enumerate(graph.nodes)}
    return sorted([*sites.values(), *reductions, *guards.values()], key=lambda s: order[id(s.node)])
