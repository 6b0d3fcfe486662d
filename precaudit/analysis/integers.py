"""Float values that carry integers: positions, counts and indices made by a Range, a CumSum or a Cast from an
integer tensor, and how large they can get when the shapes or constants say.

float16 holds every integer exactly only up to 2048 (bfloat16: 256); beyond, a position 2049 is 2048. And an angle
made from a position (position x frequency, RoPE's and a timestep embedding's) is as coarse as the format is at
its size: float16's spacing is 1.0 at 1024, so the sine of a float16 angle past 1,000 rad is noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..dtypes import COMPUTED
from ..ir import Node, Value
from .bounds import Bounded, bounds_of
from .canonical import producer
from .constants import resolve_scalar
from .sites.reduction import reduction_length

__all__ = ["Angle", "IntegerSource", "angle_source", "compared_by", "integer_source"]

_FLOATS = COMPUTED
_INTS = ("int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64")


@dataclass(frozen=True)
class IntegerSource:
    """Where a float's integer values come from, and the largest |value| the graph fixes (None: not fixed)."""

    node: Node  # the Range, CumSum or Cast that makes them
    kind: str  # "Range", "CumSum", "Cast of an integer input" ...
    bound: float | None
    sized_by: tuple[str, ...] = ()  # the --dim sizes the bound rests on ("seq=4096"), where it does
    open: str = ""  # what leaves them unbounded, where they are: "the symbolic dim 'seq'", "the input 't'"


_WALK = ("Cast", "Identity", "Expand", "Reshape", "Unsqueeze", "Squeeze", "Transpose", "Flatten")


def integer_source(value: Value | None, dims: dict[str, int] | None = None) -> IntegerSource | None:
    """The integers a float value carries: walking back through shape ops and Casts to a Range, a CumSum of
    ones or an integer graph input. The node that makes them a float is the float Range or CumSum itself, or the
    Cast from integers on the way (torch.arange(n).float(), position_ids.float()). None: no such integers.
    dims: the user's sizes for symbolic dims (--dim), which bound a Range up to a symbolic length."""
    cast: Node | None = None
    for _ in range(12):
        node = value.producer if value is not None else None
        if node is None or node.op_type not in _WALK:
            break
        inner = node.input(0)
        if node.op_type == "Cast" and cast is None and value is not None and value.dtype in _FLOATS and \
                inner is not None and inner.dtype in _INTS:
            cast = node
        value = inner
    if value is None:
        return None
    node = value.producer
    if node is None:
        if cast is not None and not value.is_const and value.dtype in _INTS:
            return IntegerSource(cast, f"Cast of the integer input '{value.name}'", None, open=f"the input '{value.name}'")
        return None
    is_float = value.dtype in _FLOATS
    if cast is None and not is_float:
        return None
    if node.op_type == "Range":
        bound, used, open_ = _range_bound(node, dims or {})
        return IntegerSource(cast or node, "Range" if cast is None else "Cast of an integer Range", bound, used, open_)
    if node.op_type == "CumSum" and (resolve_scalar(node.input(0)) is not None or _all_ones(node.input(0))):
        length = _length(node)
        return IntegerSource(cast or node, "CumSum of ones" if cast is None else "Cast of a CumSum of ones",
                             length, open="" if length else "a length the shapes do not fix")
    return None


def _range_bound(node: Node, dims: dict[str, int]) -> tuple[float | None, tuple[str, ...], str]:
    """The largest |value| a Range makes (every value lies between its start and its limit), the --dim sizes that
    rests on, and what leaves it unbounded: a start or limit computed from activations leaves it so too."""
    ends = [bounds_of(node.input(i), dims) for i in (0, 1)]
    if any(end is None for end in ends):
        return None, (), "a start or limit computed at run time"
    start, limit = (end for end in ends if end is not None)
    bound = max(start.interval.magnitude, limit.interval.magnitude)
    if math.isinf(bound):
        return None, (), start.open or limit.open
    return bound, tuple(dict.fromkeys(start.sized_by + limit.sized_by)), ""


def _all_ones(value: Value | None) -> bool:
    """A ConstantOfShape of 1, or a constant tensor of ones (a CumSum that counts)."""
    node = value.producer if value is not None else None
    if node is not None and node.op_type == "ConstantOfShape":
        fill = node.attrs.get("value")
        try:
            import numpy as np
            from onnx import numpy_helper

            return bool(fill is not None and np.all(numpy_helper.to_array(fill) == 1))
        except Exception:
            return False
    return False


def _length(cumsum: Node) -> float | None:
    length, _ = reduction_length(cumsum)
    return float(length) if length else None


@dataclass(frozen=True)
class Angle:
    """An angle made from integers: positions times frequencies, or any arithmetic on them by constants (a shifted,
    scaled coordinate grid). bound: the largest |angle| the graph fixes, or None."""

    positions: IntegerSource
    frequency: float | None  # the largest |frequency| a plain product multiplies the positions by; None otherwise
    bound: float | None
    made: str  # how: "Range times frequencies up to 1", "Range through Div, Mul, Sub, Mul"
    chain: tuple[Node, ...]  # the float nodes from the positions to the angle (a keep-list keeps them all)


# what RoPE puts between position x frequency and its Cos: the transposed product, concatenated with itself
_MOVES = ("Transpose", "Concat", "Slice", "Unsqueeze", "Squeeze", "Reshape", "Expand", "Cast", "Identity", "Tile")
_PRODUCTS = ("Mul", "MatMul", "Div")


def angle_source(value: Value | None, dims: dict[str, int] | None = None) -> Angle | None:
    """The angle a Sin or Cos reads, when it is made from integers (a Range, a CumSum of ones, a Cast of integers)
    and constants, with its bounds (bounds.py); None where it reads an activation. dims: the user's --dim sizes."""
    made = bounds_of(value, dims)
    found = made.positions if made is not None else None
    if made is None or found is None or found.node is None:
        return None  # an activation, constants alone, or integers not yet made floats
    size = found.interval.magnitude
    positions = IntegerSource(found.node, found.kind, None if math.isinf(size) else size, made.sized_by, made.open)
    frequency = _frequency(value, made, dims) if made.steps else 1.0
    if not made.steps:
        text = found.kind
    elif frequency is not None:
        text = f"{found.kind} times frequencies up to {frequency:.3g}"
    else:
        text = f"{found.kind} through {', '.join(made.steps)}"
    bound = made.interval.magnitude
    return Angle(positions, frequency, None if math.isinf(bound) else bound, text, made.chain)


def _frequency(value: Value | None, made: Bounded, dims: dict[str, int] | None) -> float | None:
    """The largest |frequency| of a plain product of positions and frequencies (Mul or MatMul, or a Div of the
    positions by a constant), with only moves after it; None for any other arithmetic."""
    if len(made.steps) != 1 or made.steps[0] not in _PRODUCTS:
        return None
    node = producer(value)
    for _ in range(8):
        if node is None or node.op_type not in _MOVES:
            break
        node = producer(node.input(0))
    if node is None or node.op_type != made.steps[0] or len(node.inputs) != 2:
        return None
    sides = [bounds_of(v, dims) for v in node.inputs]
    source = made.positions.node if made.positions is not None else None
    for i, side in enumerate(sides):
        other = sides[1 - i]
        if side is None or other is None or side.positions is None or side.positions.node is not source or side.steps:
            continue
        if node.op_type == "Div":
            if i != 0 or other.interval.lo <= 0 <= other.interval.hi:
                return None  # frequency / position is no angle that grows with the position
            size = 1 / min(abs(other.interval.lo), abs(other.interval.hi))
        else:
            size = other.interval.magnitude
        return None if math.isinf(size) else size
    return None


# ops a mask's positions pass through on their way to the comparison that builds it
_TO_COMPARISON = frozenset({"Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Expand", "Transpose", "Flatten",
                            "Slice", "Concat", "Tile", "Add", "Sub", "Mul", "Div", "Neg"})
_COMPARISONS = frozenset({"Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal"})


def compared_by(node: Node, depth: int = 8) -> Node | None:
    """The first comparison (Greater, Less, Equal ...) that reads the node's output within depth hops through moves,
    casts and arithmetic, breadth first: positions compared to build a mask (a causal mask's i > j)."""
    frontier, seen = [node], {id(node)}
    for _ in range(depth):
        step = []
        for current in frontier:
            for user in (u for out in current.outputs for u in out.consumers):
                if user.op_type in _COMPARISONS:
                    return user
                if user.op_type in _TO_COMPARISON and id(user) not in seen:
                    seen.add(id(user))
                    step.append(user)
        frontier = step
    return None
