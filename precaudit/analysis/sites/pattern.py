"""Pattern sites: the nodes a rule's op pattern matches, with the names it binds."""

from __future__ import annotations

from ...ir import Graph
from ..compute_dtype import DtypeResolver
from ..pattern import OpP, match_node
from .base import Site
from .facts import dtype_facts
from .walks import feeding_op

__all__ = ["find_pattern_sites"]


def find_pattern_sites(graph: Graph, resolver: DtypeResolver, rule_id: str, pattern: OpP) -> list[Site]:
    """A site for every node the pattern matches, its facts the pattern's bindings."""
    sites = []
    for node in graph.nodes:
        if node.op_type not in pattern.ops:
            continue
        result = match_node(pattern, node)
        dtype = resolver.of_node(node)
        if result.ok and dtype is not None:
            facts = {"op": node.op_type, "input_op": feeding_op(node.input(0)), **dtype_facts(dtype, resolver),
                     **result.bindings}
            sites.append(Site("pattern", node, facts, rule_id=rule_id))
    return sites
