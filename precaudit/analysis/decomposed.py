"""Recognize normalizations that exporters decompose into chains, and where each puts (or lost) its eps.

A chain is found from its root: the square root of a statistic (Sqrt or Pow(±0.5) of a mean or sum of
squares, or a ReduceL2). Its eps is then inside the root (Add(var, eps) → Sqrt), after it (Sqrt → Add(eps)),
a guard (Sqrt/ReduceL2 → Clip(min)/Max(eps), or a cap on the reciprocal: Min(1/sqrt(s), 1/eps), Keras's
normalize), or missing.

What counts as a statistic, a square or a step between two ops is read through canonical.py, so the forms of
tf2onnx, jax2onnx and paddle2onnx (ReduceSum·(1/n), GlobalAveragePool, ReduceSumSquare/n, flax's
max(0, E[x²] − E[x]²), Reshape/Expand between steps) are the same chain as torch.onnx's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..dtypes import round_to_format
from ..ir import Graph, Node, Value
from .canonical import SHAPE_ONLY, Reduction, clamped_difference, is_centred, producer, reduction, square_base
from .compute_dtype import ComputeDtype, DtypeResolver
from .constants import ScalarConst, resolve_scalar
from .sites.base import Site
from .sites.facts import dtype_facts, eps_facts
from .sites.walks import scalar_of

__all__ = ["ChainScan", "find_decomposed_norms", "narrower"]

_OPTIMIZED_AWAY = ("; torch.onnx's dynamo exporter deletes Add(x, c) when |c| <= 1e-8, so a tiny eps written in the "
                   "source may have been optimized away")


@dataclass(frozen=True)
class _Stat:
    """The statistic under a root: a reduction, or E[x²] − E[x]² (moments: the Sub; reduction: the E[x²])."""

    reduction: Reduction
    moments: Node | None = None


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
    if node.op_type == "Sqrt" or (node.op_type == "Pow" and scalar_of(node.input(1)) in (0.5, -0.5)):
        return _statistic(_strip_eps(node.input(0))[0]) is not None
    return False


def _scan_root(root: Node, graph: Graph, resolver: DtypeResolver, scan: ChainScan) -> None:
    if root.op_type == "ReduceL2":
        inner_add, inner_eps = None, None
        stat: _Stat | None = _Stat(Reduction("l2", root, root.input(0), squares=True))
    else:
        inner_value, inner_add, inner_eps = _strip_eps(root.input(0))
        stat = _statistic(inner_value)
    rsqrt = root.op_type == "Pow" and scalar_of(root.input(1)) == -0.5  # the root is itself the division
    guard, guard_eps, divisions = _after_root(root)
    cap = _cap(root, divisions, rsqrt) if inner_add is None and guard is None else None
    if inner_add is not None:
        site_node, eps = inner_add, inner_eps
        placement = "inside_sqrt" if inner_add.op_type == "Add" else "guard"
    elif guard is not None:
        site_node, eps, placement = guard, guard_eps, "guard" if guard.op_type in ("Clip", "Max") else "outside_sqrt"
    elif cap is not None:
        (site_node, eps, _), placement = cap, "guard"
    elif divisions or rsqrt:
        site_node, eps, placement = root, None, "missing"
    else:
        return  # a root that no division uses is not a normalization (a std for logging, say)
    dtype = narrower(resolver.of_node(site_node), resolver.of_node(root), root) if site_node is not root \
        else resolver.of_node(root)
    if dtype is None:
        return
    # a root no division uses is a standard deviation, not a normalization
    facts = {"norm": _family(stat) if divisions or rsqrt or placement == "missing" else "std", "op": site_node.op_type, "eps_role": "eps", "eps_placement": placement,
             "eps_source": eps.source if eps else "none in the graph",
             "missing_note": _OPTIMIZED_AWAY if placement == "missing" and graph.exporter == "torch-dynamo" else "",
             "keep_hint": _chain_glob(site_node, root), "stat_floor": None,
             **_square_facts(stat, resolver),
             **eps_facts(eps, dtype), **dtype_facts(dtype, resolver)}
    if cap is not None and site_node is cap[0]:
        facts.update(_cap_rounding(cap[2], dtype))
    scan.sites.append(Site("norm", site_node, facts))
    scan.claimed.update(id(n) for n in (root, site_node, *divisions))


def _strip_eps(value: Value | None) -> tuple[Value | None, Node | None, ScalarConst | None]:
    """If value is Add(x, c), Max(x, c) or Clip(x, min=c) for a scalar constant c, return (x, that node, c);
    else (value, None, None). A clamp under the root guards it as well as an added eps does — except a clamp at 0
    of a difference (flax's max(0, E[x²] − E[x]²)), which only keeps a variance non-negative: that is part of the
    statistic, not an eps."""
    node = producer(value)
    if node is None or clamped_difference(value) is not None:
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


def _statistic(value: Value | None) -> _Stat | None:
    """The reduction that makes a variance or mean square (a mean however written: canonical.reduction), or
    E[x²] − E[x]² built from two reductions, clamped at zero or not."""
    value = clamped_difference(value) or value
    stat = reduction(value)
    if stat is not None:
        return _Stat(stat)
    node = producer(value)
    if node is not None and node.op_type == "Sub":
        left, right = reduction(node.input(0)), producer(node.input(1))
        if left is not None and right is not None and right.op_type in ("Pow", "Mul"):
            return _Stat(left, moments=node)
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


def _guard_constant(node: Node, value: Value | None) -> ScalarConst | None:
    if node.op_type == "Clip":
        if node.input(1) is not None:
            return resolve_scalar(node.input(1))
        return ScalarConst(float(node.attrs["min"]), "attribute min") if "min" in node.attrs else None
    other = [v for v in node.inputs if v is not None and _root_value(v) is not _root_value(value)]
    return resolve_scalar(other[0]) if len(other) == 1 else None


def _cap(root: Node, divisions: list[Node], rsqrt: bool) -> tuple[Node, ScalarConst, float] | None:
    """A cap on the reciprocal of the root, Min(1/sqrt(s), c) or Clip(max=c): x * min(rsqrt(s), 1/eps) is
    max(sqrt(s), eps) written after the division (keras.ops.normalize, Keras UnitNormalization). Returns the
    capping node, the eps it stands for (1/c) and c."""
    reciprocals = [root.outputs[0]] if rsqrt else []
    for node in divisions:
        if node.op_type == "Reciprocal" or (node.op_type == "Div" and _is_one(node.input(0))):
            reciprocals.append(node.outputs[0])
    for value in reciprocals:
        for user in _consumers(value):
            const = None
            if user.op_type == "Min" and len(user.inputs) == 2:
                others = [v for v in user.inputs if _root_value(v) is not _root_value(value)]
                const = resolve_scalar(others[0]) if len(others) == 1 else None
            elif user.op_type == "Clip" and _root_value(user.input(0)) is _root_value(value):
                const = resolve_scalar(user.input(2)) if user.input(2) is not None else (
                    ScalarConst(float(user.attrs["max"]), "attribute max") if "max" in user.attrs else None)
            if const is not None and const.value > 0:
                eps = ScalarConst(1.0 / const.value, f"1/{const.value:g}, the cap of {user.op_type} '{user.name}' on "
                                                     f"1/{root.op_type} ({const.source})")
                return user, eps, const.value
    return None


def _is_one(value: Value | None) -> bool:
    const = resolve_scalar(value)
    return const is not None and const.value == 1.0


def _cap_rounding(cap: float, dtype: ComputeDtype) -> dict:
    """A cap c guards as long as it is a finite number in the compute dtype: past the format's max it becomes inf
    (NaN in e4m3fn) and min(1/0, inf) = inf, so the eps it stands for (1/c) is as good as 0 there."""
    rounded = round_to_format(cap, dtype.fmt)
    if not math.isfinite(rounded) or abs(rounded) > dtype.fmt.max:
        return {"eps_rounded": 0.0, "eps_class": "zero"}
    if rounded == 0.0:
        return {}  # an eps of 1/0: eps_facts already calls it what it is
    return {"eps_rounded": 1.0 / rounded, "eps_class": "normal"}


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
            if node.op_type in SHAPE_ONLY and node.input(0) is current:
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
    seen = set()
    while value is not None and value.producer is not None and value.producer.op_type in SHAPE_ONLY \
            and id(value) not in seen:
        seen.add(id(value))
        value = value.producer.input(0)
    return value


def narrower(at_eps: ComputeDtype | None, at_root: ComputeDtype | None, root: Node) -> ComputeDtype | None:
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


def _family(stat: _Stat | None) -> str:
    """LayerNorm for a mean of squared deviations (or E[x²] − E[x]²), RMSNorm for a mean of squares, L2Norm for
    a norm or a sum of squares."""
    if stat is None:
        return "norm"
    red = stat.reduction
    if stat.moments is not None or red.kind == "var":
        return "LayerNorm"
    if red.kind == "l2":
        return "L2Norm"
    if red.squares:  # ReduceSumSquare, alone or over n
        base = red.data
    else:
        square = square_base(red.data)
        if square is None:
            return "norm"
        base = square[1]
    if red.kind == "sum":
        return "L2Norm"
    return "LayerNorm" if is_centred(base) else "RMSNorm"


def _square_facts(stat: _Stat | None, resolver: DtypeResolver) -> dict:
    """The dtype an explicit square (Pow 2, x*x) of the statistic is computed in, and where it overflows.

    ReduceL2 / ReduceSumSquare are left out: their kernels choose their own accumulation dtype.
    """
    square = square_base(stat.reduction.data) if stat is not None and not stat.reduction.squares else None
    dtype = resolver.of_node(square[0]) if square is not None else None
    if dtype is None:
        return {"stat_dtype": None, "stat_square_overflow": None}
    return {"stat_dtype": dtype.fmt.long_name, "stat_square_overflow": dtype.fmt.square_overflow}
