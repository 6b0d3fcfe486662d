"""What a keep-list names, as a converter's arguments read it: the nodes by the names the file gives them, the op
types, and the user's own --keep-fp32 entries (every target's snippet is built from these)."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from ..converters import KeepArgs
from ..ir import Node, duplicate_renames

if TYPE_CHECKING:
    from . import KeepList

__all__ = ["is_unnamed", "keep_args", "raw_name"]


def raw_name(node: Node) -> str:
    """The node's name as the file spells it (a body node's IR name carries its If/Loop path first)."""
    path = node.subgraph_path
    return node.name[len(path):] if path and node.name.startswith(path) else node.name


def is_unnamed(node: Node) -> bool:
    """Whether the file gives the node no name: precaudit then names it (ir.generated_name), and so do the lists,
    after the naming loop they come with."""
    return node.unnamed


def _top(node: Node) -> Node:
    while node.parent is not None:
        node = node.parent
    return node


def keep_args(keep: KeepList, top_level: bool = False) -> KeepArgs:
    """The nodes and op types a converter's arguments name: the list, plus the user's own --keep-fp32 entries.
    top_level: a body's node named by its If/Loop (AutoCast classifies top-level nodes only)."""
    graph_ops = {n.op_type for n in keep.graph.nodes}
    op_types = [e for e in keep.keep_fp32 if e in graph_ops]
    patterns = [e for e in keep.keep_fp32 if e not in graph_ops]
    ids = {id(n) for n in keep.nodes}
    nodes = [n for n in keep.graph.nodes
             if id(n) in ids or any(fnmatchcase(n.name, p) or (n.scope and fnmatchcase(n.scope, p)) for p in patterns)]
    if keep.target_for == "modelopt" or top_level:  # AutoCast classifies top-level nodes only: a body goes with its If/Loop
        nodes = list({id(t): t for t in map(_top, nodes)}.values())
    renames = duplicate_renames(keep.graph)
    return KeepArgs(model=keep.model, in_memory=keep.in_memory, dtype=keep.target.name,
                    nodes=[renames.get(id(n), raw_name(n)) for n in nodes],
                    outputs=[[v.name for v in n.outputs if v is not None and v.name] for n in nodes],
                    op_types=op_types, unnamed=any(is_unnamed(n) for n in nodes), duplicates=bool(renames),
                    large=keep.large,
                    modules=sorted({n.scope or "" for n in nodes}),
                    fx_nodes=[keep.graph.fx_names.get(n.name, n.name) for n in nodes],
                    keep_io=keep.keep_io)
