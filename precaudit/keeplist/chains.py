"""The nodes behind a hazard: a norm's whole chain, the nodes that hold a value too large for the target, the node
where an output's error enters. Pure functions of the graph (and of a traced run's measurements)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from ..analysis.canonical import STATISTICS
from ..analysis.compute_dtype import DtypeResolver
from ..analysis.decomposed import find_decomposed_norms
from ..converters import Converter
from ..ir import Graph, Node, Value

__all__ = ["NormChains", "error_entry", "overflow_closure", "producers", "with_constant_nodes"]

_REDUCTIONS = STATISTICS | {"ReduceL1"}  # a norm's statistic, and an L1 norm's
# What a statistic's input passes through on its way from the normalized tensor x: a square, a centring, a Cast.
_TO_X = {"Pow", "Mul", "Sub", "Cast", "Identity", "Reshape", "Expand", "Unsqueeze", "Squeeze", "Transpose", "Abs"}
_DEPTH = 12  # hops a norm chain spans, at most (HF T5's RMSNorm: 9)


def producers(node: Node) -> list[Node]:
    """The nodes that make the node's non-constant inputs."""
    return [v.producer for v in node.inputs if v is not None and not v.is_const and v.producer is not None]


def _consumers(node: Node) -> list[Node]:
    return [c for out in node.outputs for c in out.consumers]


def _closure(start: Iterable[Node], step, depth: int) -> set[int]:
    seen: dict[int, Node] = {id(n): n for n in start}
    frontier = list(seen.values())
    for _ in range(depth):
        frontier = [m for n in frontier for m in step(n) if id(m) not in seen]
        for m in frontier:
            seen[id(m)] = m
    return set(seen)


class NormChains:
    """Every decomposed norm's chain, from the statistic's input x to the division by the root, keyed by its nodes."""

    def __init__(self, graph: Graph, resolver: DtypeResolver):
        self.graph = graph
        self._order = {id(n): i for i, n in enumerate(graph.nodes)}
        scan = find_decomposed_norms(graph, resolver)
        self._claimed = scan.claimed
        self._of: dict[int, list[Node]] = {}
        for site in scan.sites:
            chain = self._chain(site.node)
            for node in chain:
                self._of.setdefault(id(node), chain)

    def of(self, node: Node) -> list[Node] | None:
        """The norm chain a node belongs to (its nodes in graph order), or None."""
        return self._of.get(id(node))

    def _chain(self, site: Node) -> list[Node]:
        # the site is the eps Add (or guard, or the root itself); the divisions by the root follow it. The walk
        # stops at a division (Div, or the Mul of an rsqrt): past it is the next layer, and a norm right after this
        # one (its centring Sub reads this division) would otherwise lend its division to this chain
        near = _closure([site], lambda n: [] if n.op_type in ("Div", "Mul") and n is not site else _consumers(n), 4)
        seeds = [n for n in self.graph.nodes if id(n) in near and (id(n) in self._claimed or n is site)]
        ends = [n for n in seeds if n.op_type in ("Div", "Mul", "Reciprocal")] or [max(seeds, key=lambda n: self._order[id(n)])]
        upstream = _closure(ends, producers, _DEPTH)
        x = self._source(upstream)
        if x is None:
            return seeds
        downstream = _closure([c for c in x.consumers], _consumers, _DEPTH)
        inside = (upstream & downstream) | {id(n) for n in seeds}
        return [n for n in self.graph.nodes if id(n) in inside]

    def _source(self, upstream: set[int]) -> Value | None:
        """x: the input of the statistic (the reduction nearest the division: an earlier layer's norm is further
        up), followed back through squares, centring and Casts."""
        reductions = [n for n in self.graph.nodes if id(n) in upstream and n.op_type in _REDUCTIONS]
        if not reductions:
            return None
        value = reductions[-1].input(0)
        for _ in range(_DEPTH):
            node = value.producer if value is not None else None
            if node is None or node.op_type not in _TO_X or id(node) not in upstream or node.input(0) is None:
                break
            value = node.input(0)
        return value


def with_constant_nodes(nodes: list[Node], converter: Converter) -> list[Node]:
    """The nodes and the Constant nodes making the float32 tensors they read, where the converter keeps such a value
    float32 only when its Constant node is blocked too: a blocked node's Constant input is converted (clamped:
    a variance of 9.79e7 read as 65504) unless the Constant is in the block list (converters/base.py)."""
    if not converter.keeps_constant_nodes():
        return nodes
    held = {id(n) for n in nodes}
    makers = []
    for node in nodes:
        for value in node.inputs:
            maker = value.producer if value is not None and value.dtype == "fp32" else None
            if maker is not None and maker.op_type == "Constant" and id(maker) not in held:
                held.add(id(maker))
                makers.append(maker)
    return [*makers, *nodes]


def overflow_closure(start: Node, too_large: set[int]) -> list[Node]:
    """The nodes that make or read a value too large for the target (ids in too_large), connected to start:
    kept in float32 they never hold it in the narrow type (a kept node's output read by a narrow one is cast
    back, and overflows there)."""
    found: dict[int, Node] = {id(start): start}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for value in [*node.outputs, *(v for v in node.inputs if v is not None)]:
            if id(value) not in too_large:
                continue
            for other in [value.producer, *value.consumers]:
                if other is not None and id(other) not in found:
                    found[id(other)] = other
                    queue.append(other)
    return list(found.values())


def error_entry(graph: Graph, rel_error: dict[int, float], tolerance: float) -> Node | None:
    """Where the worst output's error enters: walking back along the inputs with the largest error, the first node
    whose inputs are all within the tolerance while its output is not."""
    outputs = [v for v in graph.outputs if rel_error.get(id(v), 0.0) > tolerance]
    if not outputs:
        return None
    value = max(outputs, key=lambda v: rel_error[id(v)])
    seen: set[int] = set()
    while value.producer is not None and id(value) not in seen:
        seen.add(id(value))
        node = value.producer
        inputs = [v for v in node.inputs if v is not None and not v.is_const and id(v) in rel_error]
        worst = max(inputs, key=lambda v: rel_error[id(v)], default=None)
        if worst is None or rel_error[id(worst)] <= tolerance:
            return node
        value = worst
    return value.producer
