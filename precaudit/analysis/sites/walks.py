"""What a site reads around its node: the op that feeds a value, a constant's single value, whether a value ends
only in a Where branch, whether a node feeds a Softmax."""

from __future__ import annotations

import numpy as np

from ...ir import Node, Value
from ..constants import skip_casts

__all__ = ["feeding_op", "feeds_softmax", "scalar_of", "selected_by_where_only", "softmax_after"]


def feeding_op(value: Value | None) -> str:
    """The op type that produces a value, looking through Casts; 'input' or 'constant' at the graph's edge."""
    value = skip_casts(value)
    if value is None:
        return ""
    if value.is_const:
        return "constant"
    if value.producer is None:
        return "input"
    return value.producer.op_type


def scalar_of(value: Value | None, max_size: int = 1) -> float | None:
    """A constant's single value (reading it only if it is small), else None."""
    if value is None or not value.is_const:
        return None
    if value.const_size is not None and value.const_size > max_size:
        return None
    data = value.const()
    if data is None or data.size != 1 or data.dtype.kind not in "fiu":
        return None
    return float(np.asarray(data, dtype=np.float64).reshape(()))


# Elementwise ops a value can pass through on its way into a Where branch without being used otherwise.
_ELEMENTWISE = {"Cast", "Identity", "Add", "Sub", "Mul", "Div", "Min", "Max", "Clip", "Floor", "Ceil", "Round", "Neg",
                "Abs", "Expand", "Unsqueeze", "Squeeze", "Reshape"}


def selected_by_where_only(node: Node, depth: int = 12) -> bool:
    """True when every use of the node's output ends in a branch of a Where (T5's relative-position log).

    Such a value is computed for every element but kept only where the condition selects it, so an inf or
    NaN in the other elements is thrown away.
    """
    frontier, seen = [node], set()
    while frontier and depth > 0:
        depth -= 1
        next_frontier = []
        for current in frontier:
            for out in current.outputs:
                if not out.consumers:
                    return False  # reaches a graph output
                for user in out.consumers:
                    if user.op_type == "Where" and user.input(0) is not out:
                        continue
                    if user.op_type in ("Shape", "Size"):
                        continue  # reads the dims only (full_like in a dynamic-shape export), none of the values
                    if user.op_type not in _ELEMENTWISE:
                        return False
                    if id(user) not in seen:
                        seen.add(id(user))
                        next_frontier.append(user)
        frontier = next_frontier
    return not frontier


# Ops a mask fill passes through on its way into a softmax: Where(mask, x, fill), x + (1 - mask) * fill, ...
_TO_SOFTMAX = {"Where", "Add", "Sub", "Mul", "Cast", "Expand", "Reshape", "Unsqueeze", "Squeeze", "Transpose",
               "Identity", "Slice", "Concat"}


def feeds_softmax(node: Node, depth: int = 6) -> bool:
    """Whether the node's output reaches a Softmax through ops that only move or add a mask (a mask fill's use)."""
    return node.op_type in _TO_SOFTMAX and softmax_after(node, depth) is not None


def softmax_after(node: Node, depth: int = 6) -> Node | None:
    """The first Softmax (or LogSoftmax) the node's output reaches within depth hops through ops that only move
    or add a mask, breadth first; the node itself may be any op (the reader of a fill)."""
    frontier, seen = [node], {id(node)}
    for _ in range(depth):
        step = []
        for current in frontier:
            if current is not node and current.op_type not in _TO_SOFTMAX:
                continue
            for user in (u for out in current.outputs for u in out.consumers):
                if user.op_type in ("Softmax", "LogSoftmax"):
                    return user
                if id(user) not in seen:
                    seen.add(id(user))
                    step.append(user)
        frontier = step
    return None
