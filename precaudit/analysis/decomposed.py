"""Recognize normalizations that exporters decompose into chains, and where each puts (or lost) its eps.

A chain is found from its root: the square root of a statistic (Sqrt or Pow(±0.5) of a mean or sum of
squares, or a ReduceL2). Its eps is then inside the root (Add(var, eps) → Sqrt), after it (Sqrt → Add(eps)),
a guard (Sqrt/ReduceL2 → Clip(min)/Max(eps)), or missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import Graph, Node, Value
from .compute_dtype import ComputeDtype, DtypeResolver
from .constants import ScalarConst, producer_through_casts, resolve_scalar
from .sites import Site, dtype_facts, eps_facts, scalar_of

__all__ = ["ChainScan", "find_decomposed_norms"]

_SHAPE_ONLY = {"Cast", "Identity", "Expand", "Reshape", "Unsqueeze", "Squeeze"}
# ReduceVar is the torch frontend's name for aten.var / var_mean / std: not an ONNX op, but a statistic.
_STATISTICS = {"ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL2", "ReduceVar"}
_OPTIMIZED_AWAY = ("; torch.onnx's dynamo exporter deletes Add(x, c) when |c| <= 1e-8, so a tiny eps written in the "
                   "source may have been optimized away")


@dataclass
class ChainScan:
    """The norm sites found, and every node they account for (so generic division rules skip them)."""

    sites: list[Site] = field(default_factory=list)
    claimed: set[int] = field(default_factory=set)  # id(node)


def find_decomposed_norms(graph: Graph, resolver: DtypeResolver) -> ChainScan:
    scan = ChainScan()
    for node in graph.nodes:
        if _is_root(node):
            _scan_root(node, graph, resolver, scan)
    return scan


def _is_root(node: Node) -> bool:
    if node.op_type == "ReduceL2":
        return True
    if node.op_type == "Sqrt" or node.op_type == "Pow" and scalar_of(node.input(1)) in (0.5, -0.5):
        return _statistic(_strip_eps(node.input(0))[0]) is not None
    return False


def _scan_root(root: Node, graph: Graph, resolver: DtypeResolver, scan: ChainScan) -> None:
    inner_value, inner_add, inner_eps = _strip_eps(root.input(0)) if root.op_type != "ReduceL2" else (None, None, None)
    stat = root if root.op_type == "ReduceL2" else _statistic(inner_value)
    guard, guard_eps, divisions = _after_root(root)
    rsqrt = root.op_type == "Pow" and scalar_of(root.input(1)) == -0.5  # the root is itself the division
    if inner_add is not None:
        site_node, eps = inner_add, inner_eps
        placement = "inside_sqrt" if inner_add.op_type == "Add" else "guard"
    elif guard is not None:
        site_node, eps, placement = guard, guard_eps, "guard" if guard.op_type in ("Clip", "Max") else "outside_sqrt"
    elif divisions or rsqrt:
        site_node, eps, placement = root, None, "missing"
    else:
        return  # a root that no division uses is not a normalization (a std for logging, say)
    dtype = _narrower(resolver.of_node(site_node), resolver.of_node(root), root) if site_node is not root \
        else resolver.of_node(root)
    if dtype is None:
        return
    # a root no division uses is a standard deviation, not a normalization
    facts = {"norm": _family(stat) if divisions or rsqrt or placement == "missing" else "std", "op": site_node.op_type, "eps_role": "eps", "eps_placement": placement,
             "eps_source": eps.source if eps else "none in the graph",
             "missing_note": _OPTIMIZED_AWAY if placement == "missing" and graph.exporter == "torch-dynamo" else "",
             "keep_hint": _chain_glob(site_node, root), "stat_floor": None, **_square_facts(stat, resolver),
             **eps_facts(eps.value if eps else None, dtype), **dtype_facts(dtype, resolver)}
    scan.sites.append(Site("norm", site_node, facts))
    scan.claimed.update(id(n) for n in (root, site_node, *divisions))


def _strip_eps(value: Value | None) -> tuple[Value | None, Node | None, ScalarConst | None]:
    """If value is Add(x, c), Max(x, c) or Clip(x, min=c) for a scalar constant c, return (x, that node, c);
    else (value, None, None). A clamp under the root guards it as well as an added eps does."""
    node = producer_through_casts(value)
    if node is None:
        return value, None, None
    if node.op_type == "Clip":
        const = _guard_constant(node, node.input(0))
        return (node.input(0), node, const) if const is not None else (value, None, None)
    if node.op_type in ("Add", "Max"):
        for x_i, c_i in ((0, 1), (1, 0)):
            const = resolve_scalar(node.input(c_i))
            if const is not None and resolve_scalar(node.input(x_i)) is None:
                return node.input(x_i), node, const
    return value, None, None


def _statistic(value: Value | None) -> Node | None:
    """The reduction that makes a variance or mean square, or E[x²] − E[x]² built from two reductions."""
    node = producer_through_casts(value)
    if node is None:
        return None
    if node.op_type in _STATISTICS:
        return node
    if node.op_type == "Sub":
        left, right = producer_through_casts(node.input(0)), producer_through_casts(node.input(1))
        if left is not None and left.op_type in _STATISTICS and right is not None and right.op_type in ("Pow", "Mul"):
            return left
    return None


def _after_root(root: Node) -> tuple[Node | None, ScalarConst | None, list[Node]]:
    """The eps added or clamped after the root, if any, and the nodes that divide by the result."""
    guard, eps = None, None
    frontier = [root.outputs[0]]
    divisions: list[Node] = []
    for _ in range(4):  # root → [Cast/Expand] → [Add/Clip/Max] → [Cast/Expand] → Div
        next_frontier = []
        for value in frontier:
            for user in _consumers(value):
                if guard is None and user.op_type in ("Add", "Max", "Clip"):
                    const = _guard_constant(user, value)
                    if const is not None:
                        guard, eps = user, const
                        next_frontier.append(user.outputs[0])
                        continue
                if _divides_by(user, value):
                    divisions.append(user)
        frontier = next_frontier
    return guard, eps, divisions


def _guard_constant(node: Node, value: Value) -> ScalarConst | None:
    if node.op_type == "Clip":
        if node.input(1) is not None:
            return resolve_scalar(node.input(1))
        return ScalarConst(float(node.attrs["min"]), "attribute min") if "min" in node.attrs else None
    other = [v for v in node.inputs if v is not None and _root_value(v) is not _root_value(value)]
    return resolve_scalar(other[0]) if len(other) == 1 else None


def _divides_by(node: Node, value: Value) -> bool:
    if node.op_type == "Reciprocal":
        return True
    if node.op_type == "Div":
        return _root_value(node.input(1)) is _root_value(value)
    return False


def _consumers(value: Value) -> list[Node]:
    """Consumers, looking through Casts and shape-only ops (F.normalize expands its clamped norm).

    Depth-first in consumer order with an explicit stack (a chain of any length costs no recursion); a
    shape-only op whose output leads back to a value already on the path (a cycle) is not followed again.
    """
    found: list[Node] = []
    on_path = {id(value)}
    stack = [(value, iter(value.consumers))]
    while stack:
        current, users = stack[-1]
        for node in users:
            if node.op_type in _SHAPE_ONLY and node.input(0) is current:
                out = node.outputs[0]
                if id(out) not in on_path:
                    on_path.add(id(out))
                    stack.append((out, iter(out.consumers)))
                    break
            else:
                found.append(node)
        else:
            stack.pop()
            on_path.discard(id(current))
    return found


def _root_value(value: Value | None) -> Value | None:
    while value is not None and value.producer is not None and value.producer.op_type in _SHAPE_ONLY:
        value = value.producer.input(0)
    return value


def _narrower(at_eps: ComputeDtype | None, at_root: ComputeDtype | None, root: Node) -> ComputeDtype | None:
    """var + eps only helps if it survives into the square root: judge it in the less precise of the two."""
    if at_eps is None or at_root is None or at_root.fmt.ulp_at_1 <= at_eps.fmt.ulp_at_1:
        return at_eps
    return ComputeDtype(at_root.fmt, f"the guarded value reaches {root.op_type} '{root.name}' in "
                                     f"{at_root.fmt.long_name}: {at_root.reason}")


def _chain_glob(node: Node, root: Node) -> str:
    """A --keep-fp32 entry covering the norm chain: its module path, its name prefix, or the nodes themselves."""
    if node.scope and node.scope == root.scope and "/" not in node.name:  # torch.export names carry no path
        return node.scope
    if "/" in node.name.strip("/"):
        return node.name.rsplit("/", 1)[0] + "/*"
    return node.name if node is root else f"{node.name},{root.name}"


def _family(stat: Node | None) -> str:
    """LayerNorm for a mean of squared deviations, RMSNorm for a mean of squares, L2Norm for a norm."""
    if stat is None:
        return "norm"
    if stat.op_type in ("ReduceSumSquare", "ReduceL2"):
        return "L2Norm"
    if stat.op_type == "ReduceVar":
        return "LayerNorm"
    square = producer_through_casts(stat.input(0))
    if square is None or not _is_square(square):
        return "norm"
    if stat.op_type == "ReduceSum":
        return "L2Norm"
    base = producer_through_casts(square.input(0))
    return "LayerNorm" if base is not None and base.op_type == "Sub" else "RMSNorm"


def _square_facts(stat: Node | None, resolver: DtypeResolver) -> dict:
    """The dtype an explicit square (Pow 2, x*x) of the statistic is computed in, and where it overflows.

    ReduceL2 / ReduceSumSquare are left out: their kernels choose their own accumulation dtype.
    """
    square = producer_through_casts(stat.input(0)) if stat is not None else None
    if square is None or not _is_square(square):
        return {"stat_dtype": None, "stat_square_overflow": None}
    dtype = resolver.of_node(square)
    if dtype is None:
        return {"stat_dtype": None, "stat_square_overflow": None}
    return {"stat_dtype": dtype.fmt.long_name, "stat_square_overflow": dtype.fmt.square_overflow}


def _is_square(node: Node) -> bool:
    if node.op_type == "Pow":
        return scalar_of(node.input(1)) == 2.0
    return node.op_type == "Mul" and node.input(0) is node.input(1)
