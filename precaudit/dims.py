"""The sizes a user gives symbolic dims (--dim NAME=SIZE): how a dim is named, and the check that each name is one.

Traced mode makes its inputs at these sizes; the static pass bounds what a symbolic dim makes (a Range of
positions up to the sequence length) by them, where the graph alone says "unbounded".
"""

from __future__ import annotations

from .errors import InputError
from .ir import Graph, Value

__all__ = ["check_dim_names", "dim_key", "size_dims", "symbolic_dims"]


def dim_key(value: Value, i: int, d) -> str:
    """How a dim is named in the report and set with --dim: its symbol, or input[i] for an unnamed one."""
    return d if isinstance(d, str) else f"{value.name}[{i}]"


def symbolic_dims(graph: Graph) -> set[str]:
    """The names --dim can size: every input dim that is not a fixed positive size."""
    return {dim_key(v, i, d) for v in graph.inputs for i, d in enumerate(v.shape or ())
            if not (isinstance(d, int) and d > 0)}


def check_dim_names(graph: Graph, dims: dict[str, int]) -> None:
    """A --dim that names no symbolic dim of the inputs is a typo: say so rather than ignore it."""
    known = symbolic_dims(graph)
    unknown = sorted(set(dims) - known)
    if unknown:
        names = ", ".join(sorted(known)) or "none: every input dim is fixed"
        raise InputError(graph.path, f"--dim {unknown[0]}: no input has a dim of that name (symbolic dims: {names})")


def size_dims(graph: Graph, dims: dict[str, int] | None, strict: bool = True) -> Graph:
    """The graph with the user's sizes for its symbolic dims. strict (one model audited): each must name one of its
    dims (InputError if not); otherwise (several models, whose dims differ) each model takes the names it has."""
    if dims:
        if strict:
            check_dim_names(graph, dims)
        else:
            known = symbolic_dims(graph)
            dims = {k: v for k, v in dims.items() if k in known}
        graph.dim_sizes = dict(dims)
    return graph
