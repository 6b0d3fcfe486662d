"""Float values that carry integers: positions, counts and indices made by a Range, a CumSum or a Cast from an
integer tensor, and how large they can get when the shapes or constants say.

float16 holds every integer exactly only up to 2048 (bfloat16: 256); beyond, a position 2049 is 2048. And an angle
made from a position (position x frequency, RoPE's and a timestep embedding's) is as coarse as the format is at
its size: float16's spacing is 1.0 at 1024, so the sine of a float16 angle past 1,000 rad is noise.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import COMPUTED
from ..ir import Node, Value
from .canonical import producer, through_shape
from .constants import resolve_scalar
from .sites.reduction import reduction_length

__all__ = ["IntegerSource", "integer_source", "angle_source", "Angle"]

_FLOATS = COMPUTED
_INTS = ("int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64")


@dataclass(frozen=True)
class IntegerSource:
    """Where a float's integer values come from, and the largest |value| the graph fixes (None: not fixed)."""

    node: Node  # the Range, CumSum or Cast that makes them
    kind: str  # "Range", "CumSum", "Cast of an integer input" ...
    bound: float | None
    sized_by: tuple[str, ...] = ()  # the --dim sizes the bound rests on ("seq=4096"), where it does


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
            return IntegerSource(cast, f"Cast of the integer input '{value.name}'", None)
        return None
    is_float = value.dtype in _FLOATS
    if cast is None and not is_float:
        return None
    if node.op_type == "Range":
        used: list[str] = []
        start, limit = _scalar_bound(node.input(0), dims or {}, used), _scalar_bound(node.input(1), dims or {}, used)
        bound = max(start, limit) if start is not None and limit is not None else None
        return IntegerSource(cast or node, "Range" if cast is None else "Cast of an integer Range", bound,
                             tuple(dict.fromkeys(used)) if bound is not None else ())
    if node.op_type == "CumSum" and (resolve_scalar(node.input(0)) is not None or _all_ones(node.input(0))):
        return IntegerSource(cast or node, "CumSum of ones" if cast is None else "Cast of a CumSum of ones",
                             _length(node))
    return None


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


_SCALAR_MOVES = ("Cast", "Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten")


def _scalar_bound(value: Value | None, dims: dict[str, int], used: list[str]) -> float | None:
    """The largest |x| a Range's start or limit can be: a constant; a dim read from a shape (Shape -> Gather of a
    fixed dim, or of a symbolic one the user sized with --dim); a sum or product of such (a cache's length plus
    the sequence's). None: the graph does not fix it. Iterative over a bounded expression (a Range's limit is a
    few nodes deep; deeper is not bounded here). used collects the --dim sizes the bound rests on."""
    total, todo = 0.0, [(value, 1.0)]  # terms of a sum, each with the product of factors above it
    for _ in range(16):
        if not todo:
            return total
        value, scale = todo.pop()
        constant = resolve_scalar(value)
        if constant is not None:
            total += scale * abs(float(constant.value))
            continue
        node = producer(value)
        while node is not None and node.op_type in _SCALAR_MOVES:
            value = node.input(0)
            node = producer(value)
        if node is None:
            return None
        if node.op_type == "Add" and len(node.inputs) == 2:
            todo += [(node.input(0), scale), (node.input(1), scale)]
        elif node.op_type == "Mul" and len(node.inputs) == 2:
            factor = resolve_scalar(node.input(1))
            other = node.input(0)
            if factor is None:
                factor, other = resolve_scalar(node.input(0)), node.input(1)
            if factor is None:
                return None
            todo.append((other, scale * abs(float(factor.value))))
        elif node.op_type in ("Gather", "Shape"):
            dim = _shape_dim(node, dims, used)
            if dim is None:
                return None
            total += scale * dim
        else:
            return None
    return None


def _shape_dim(node: Node, dims: dict[str, int], used: list[str]) -> float | None:
    """One dim of a shape: Shape -> Gather(index), or a Shape(start, end) of one dim (the dynamo exporter's
    sym_size): its size where fixed, or the user's --dim size for a symbolic one."""
    shape_node, index = node, 0
    if node.op_type != "Shape":
        made_by, scalar = producer(node.input(0)), resolve_scalar(node.input(1))
        if made_by is None or made_by.op_type != "Shape" or scalar is None:
            return None
        shape_node, index = made_by, int(scalar.value)
    shaped = shape_node.input(0)
    shape = shaped.shape if shaped is not None else None
    if shape is None:
        return None
    end = shape_node.attrs.get("end")
    sliced = list(range(len(shape)))[int(shape_node.attrs.get("start", 0)):None if end is None else int(end)]
    if node.op_type == "Shape" and len(sliced) != 1:
        return None  # a whole shape, not one dim
    if not -len(sliced) <= index < len(sliced):
        return None
    dim = shape[sliced[index]]
    if isinstance(dim, int) and dim > 0:
        return float(dim)
    if isinstance(dim, str) and dim in dims:
        used.append(f"{dim}={dims[dim]}")
        return float(dims[dim])
    return None


@dataclass(frozen=True)
class Angle:
    """An angle made from integers: position x frequency. bound: the largest |angle| the graph fixes, or None."""

    positions: IntegerSource
    frequency: float | None  # the largest |frequency| the positions are multiplied by (a constant)
    bound: float | None


# what RoPE puts between position x frequency and its Cos: the transposed product, concatenated with itself
_MOVES = ("Transpose", "Concat", "Slice", "Unsqueeze", "Squeeze", "Reshape", "Expand", "Cast", "Identity", "Tile")


def angle_source(value: Value | None, dims: dict[str, int] | None = None) -> Angle | None:
    """The angle a Sin or Cos reads, when it is integers times constant frequencies (Mul or MatMul), else None.
    dims: the user's --dim sizes (integer_source)."""
    node = producer(value)
    for _ in range(8):
        if node is None or node.op_type not in _MOVES:
            break
        value = node.input(0)
        node = producer(value)
    if node is None:
        return None
    if node.op_type in ("Mul", "MatMul", "Div") and len(node.inputs) == 2:
        for i in (0, 1):
            positions = integer_source(node.input(i), dims)
            if positions is None:
                continue
            if node.op_type == "Div" and i != 0:
                continue  # frequency / position is no angle that grows with the position
            frequency = _largest(node.input(1 - i))
            if frequency is None:
                return None  # times another activation: no angle made from positions
            if node.op_type == "Div":
                frequency = 1 / frequency if frequency else None
            bound = positions.bound * frequency if positions.bound is not None and frequency is not None else None
            return Angle(positions, frequency, bound)
    positions = integer_source(value, dims)
    return Angle(positions, 1.0, positions.bound) if positions is not None else None


def _largest(value: Value | None) -> float | None:
    """The largest |x| of a small constant tensor (a frequency table), through shape ops; None otherwise."""
    value = through_shape(value)
    if value is None or not value.is_const or (value.const_size or 0) > 1 << 16:
        return None
    data = value.const()
    if data is None or data.size == 0 or data.dtype.kind != "f":
        return None
    import numpy as np

    return float(np.max(np.abs(data)))
