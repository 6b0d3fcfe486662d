"""Which dtype each node computes in and why, as the DtypeResolver decided it: the HTML report's per-op map.

The audit builds it only when the HTML report is asked for (audit_models(dtype_maps=True)); it reads what the
resolver already knows and adds no analysis.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..analysis.compute_dtype import DtypeResolver
from ..ir import Graph

__all__ = ["NodeDtype", "node_dtypes"]


@dataclass(frozen=True, slots=True)
class NodeDtype:
    """One node: the dtype it computes in (None when it reads no float: shape plumbing, masks) and why."""

    order: int
    node: str
    op: str
    scope: str | None
    dtype: str | None  # format name: fp16, bf16, fp32, ...
    reason: str


def node_dtypes(graph: Graph, resolver: DtypeResolver) -> list[NodeDtype]:
    """Every node of the graph in order, with resolver.of_node's answer."""
    out = []
    for i, node in enumerate(graph.nodes):
        dtype = resolver.of_node(node)
        out.append(NodeDtype(i, node.name, node.op_type, node.scope, dtype.fmt.name if dtype else None,
                             dtype.reason if dtype else "reads no float tensor"))
    return out
