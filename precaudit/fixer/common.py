"""Small graph questions the repairs share: where a norm's root and its division are, which input of a node is a
scalar constant, and a new constant written in the dtype the model stores the value it replaces."""

from __future__ import annotations

import numpy as np

from ..analysis.canonical import SHAPE_ONLY
from ..analysis.constants import resolve_scalar, skip_casts
from ..analysis.sites.walks import scalar_of
from ..dtypes import FORMATS
from ..ir import Node, Value

__all__ = [
    "divisions",
    "float_dtype",
    "int_list",
    "is_root",
    "producer_through_casts",
    "root_after",
    "root_before",
    "scalar_input",
    "stored_array",
]


def float_dtype(value: Value | None) -> str | None:
    """The value's stored float format name (fp16, fp32, ...), or None for other types or an unknown one."""
    return value.dtype if value is not None and value.dtype in FORMATS else None


def stored_array(number: float, dtype: str | None, shape=()) -> np.ndarray:
    """number as a tensor of the format a value is stored in (float32 when unknown), of the given shape."""
    np_dtype = FORMATS[dtype].np_dtype if dtype in FORMATS else np.float32
    return np.full(tuple(shape), number, dtype=np.float64).astype(np_dtype)


def static_shape(value: Value | None) -> tuple[int, ...] | None:
    shape = value.shape if value is not None else None
    if shape is None or not all(isinstance(d, int) and d > 0 for d in shape):
        return None
    return tuple(shape)


def const_shape(value: Value | None) -> tuple[int, ...]:
    """The shape a replacement for a (possibly cast or expanded) scalar constant takes: the value's own static
    shape when known, else a scalar (which broadcasts as the one-valued constant did)."""
    shape = static_shape(value)
    return shape if shape is not None else ()


def scalar_input(node: Node) -> int | None:
    """The input index of a two-input node that is a scalar constant while the other is not (an eps, a guard)."""
    for c_i, x_i in ((1, 0), (0, 1)):
        if resolve_scalar(node.input(c_i)) is not None and resolve_scalar(node.input(x_i)) is None:
            return c_i
    return None


def is_root(node: Node | None) -> bool:
    return node is not None and (node.op_type in ("Sqrt", "ReduceL2") or
                                 (node.op_type == "Pow" and scalar_of(node.input(1)) in (0.5, -0.5)))


def _through_shape_down(value: Value, depth: int = 4) -> list[Node]:
    """Consumers of value, looking through shape-only ops (Cast, Reshape, Expand, ...)."""
    found, frontier = [], [value]
    for _ in range(depth):
        nxt = []
        for v in frontier:
            for user in v.consumers:
                if user.op_type in SHAPE_ONLY and user.input(0) is v:
                    nxt.extend(user.outputs[:1])
                else:
                    found.append(user)
        frontier = nxt
    return found


def root_after(node: Node) -> Node | None:
    """The root (Sqrt, Pow ±0.5) that reads the node's output, through shape-only ops: an eps inside the root."""
    return next((u for u in _through_shape_down(node.outputs[0]) if is_root(u)), None) if node.outputs else None


def root_before(value: Value | None) -> Node | None:
    """The root that makes a value, through shape-only ops: an eps or guard after the root."""
    for _ in range(6):
        node = value.producer if value is not None else None
        if node is None:
            return None
        if is_root(node):
            return node
        if node.op_type not in SHAPE_ONLY:
            return None
        value = node.input(0)
    return None


def divisions(root: Node) -> list[Node]:
    """The nodes that divide by a root's result (Div by it, Reciprocal of it, or a Mul by an rsqrt), through
    shape-only ops and one guard (Add/Max/Clip of a constant) on the way; in graph order of discovery."""
    found: list[Node] = []
    frontier = list(root.outputs[:1])
    seen = {id(root)}
    for _ in range(5):
        nxt = []
        for v in frontier:
            for user in v.consumers:
                if id(user) in seen:
                    continue
                seen.add(id(user))
                if user.op_type in SHAPE_ONLY or (user.op_type in ("Add", "Max", "Clip") and scalar_input(user) is not None):
                    nxt.extend(user.outputs[:1])
                elif (user.op_type == "Div" and user.input(1) is v) or user.op_type == "Reciprocal" or (user.op_type == "Mul" and root.op_type == "Pow"):
                    found.append(user)
        frontier = nxt
    return found


def producer_through_casts(value: Value | None) -> Node | None:
    value = skip_casts(value)
    return value.producer if value is not None else None


def int_list(value: Value | None, limit: int = 64) -> list[int] | None:
    """A small constant integer vector (axes given as an input), else None."""
    if value is None or not value.is_const or (value.const_size or 0) > limit:
        return None
    data = value.const()
    if data is None or data.dtype.kind not in "iu":
        return None
    return [int(v) for v in np.asarray(data).reshape(-1)]


def constant_producers(value: Value | None) -> list[Node]:
    """The Constant node behind a constant value and the pass-through ops (Cast, Expand, ...) in between: what an
    edit that stops reading the value may leave without readers."""
    found = []
    for _ in range(8):
        node = value.producer if value is not None else None
        if node is None:
            break
        found.append(node)
        if node.op_type == "Constant":
            break
        if node.op_type not in SHAPE_ONLY and node.op_type not in ("CastLike", "Flatten"):
            return []
        value = node.input(0)
    return found
