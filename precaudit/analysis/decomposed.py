"""Recognize normalizations that exporters decompose into chains: statistic → Add(eps) → Sqrt → divide."""

from __future__ import annotations

from ..ir import Graph, Node, Value
from .compute_dtype import ComputeDtype, DtypeResolver
from .constants import resolve_scalar
from .sites import Site, dtype_facts, eps_facts, scalar_of

__all__ = ["find_decomposed_norms"]

_CASTS = {"Cast", "Identity"}
_STATISTICS = {"ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL2", "ReduceVariance"}


def find_decomposed_norms(graph: Graph, resolver: DtypeResolver) -> list[Site]:
    """One norm site per Add(statistic, eps) whose result goes under a square root."""
    sites = []
    for node in graph.by_op("Add"):
        site = _sqrt_of_stat_plus_eps(node, resolver)
        if site is not None:
            sites.append(site)
    return sites


def _sqrt_of_stat_plus_eps(add: Node, resolver: DtypeResolver) -> Site | None:
    for stat_i, eps_i in ((0, 1), (1, 0)):
        stat, const = add.input(stat_i), resolve_scalar(add.input(eps_i))
        if const is None or stat is None:
            continue
        reducer = _upstream(stat)
        sqrt = _sqrt_after(add.outputs[0])
        if reducer is None or reducer.op_type not in _STATISTICS or sqrt is None:
            continue
        dtype = _narrower(resolver.of_node(add), resolver.of_node(sqrt), sqrt)
        if dtype is None:
            return None
        facts = {"norm": _family(reducer), "op": "Add", "eps_source": const.source, "eps_role": "eps",
                 "eps_placement": "inside_sqrt", "keep_hint": _chain_glob(add, sqrt),
                 **eps_facts(const.value, dtype), **dtype_facts(dtype, resolver)}
        return Site("norm", add, facts)
    return None


def _narrower(at_add: ComputeDtype | None, at_sqrt: ComputeDtype | None, sqrt: Node) -> ComputeDtype | None:
    """var + eps only helps if it survives into the square root: judge it in the less precise of the two."""
    if at_add is None or at_sqrt is None or at_sqrt.fmt.ulp_at_1 <= at_add.fmt.ulp_at_1:
        return at_add
    return ComputeDtype(at_sqrt.fmt, f"the sum var + eps reaches Sqrt '{sqrt.name}' in {at_sqrt.fmt.long_name}: {at_sqrt.reason}")


def _chain_glob(add: Node, sqrt: Node) -> str:
    """A --keep-fp32 entry covering the norm chain from the eps to the root: a name prefix, or both nodes."""
    if "/" in add.name.strip("/"):
        return add.name.rsplit("/", 1)[0] + "/*"
    return f"{add.name},{sqrt.name}"


def _upstream(value: Value | None) -> Node | None:
    """The producer of a value, looking through Casts."""
    while value is not None and value.producer is not None and value.producer.op_type in _CASTS:
        value = value.producer.input(0)
    return value.producer if value is not None else None


def _downstream(value: Value) -> list[Node]:
    """The consumers of a value, looking through Casts."""
    found = []
    for node in value.consumers:
        if node.op_type in _CASTS:
            found.extend(_downstream(node.outputs[0]))
        else:
            found.append(node)
    return found


def _sqrt_after(value: Value) -> Node | None:
    """The Sqrt (or Pow ±0.5) that takes the square root of this value, if any."""
    for node in _downstream(value):
        if node.op_type == "Sqrt":
            return node
        if node.op_type == "Pow" and scalar_of(node.input(1)) in (0.5, -0.5):
            return node
    return None


def _family(reducer: Node) -> str:
    """LayerNorm when the statistic is a mean of squared deviations from a mean, RMSNorm for a mean of squares."""
    if reducer.op_type in ("ReduceSumSquare", "ReduceL2"):
        return "L2Norm"
    square = _upstream(reducer.input(0))
    if square is None or not _is_square(square):
        return "norm"
    base = _upstream(square.input(0))
    return "LayerNorm" if base is not None and base.op_type == "Sub" else "RMSNorm"


def _is_square(node: Node) -> bool:
    if node.op_type == "Pow":
        return scalar_of(node.input(1)) == 2.0
    return node.op_type == "Mul" and node.input(0) is node.input(1)
