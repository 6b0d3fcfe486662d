"""Interval bounds of values made from integers and constants: positions (a Range, a CumSum of ones, an integer
input) and dims read from shapes, carried through the arithmetic a graph puts between them and a Sin or a mask
(Add, Sub, Mul, Div, MatMul, Exp, Pow by constants or by each other) and through the ops that only move data
(Unsqueeze, Reshape, Transpose, Gather, Concat, ...).

Sound: every op's interval holds every value the op can make from operands in theirs (in exact arithmetic), and
where an op's result cannot be bounded (a division by an interval holding 0, an unsized symbolic dim) the interval
is unbounded, never guessed. A value that reads an activation (a float input, or any op not listed) has no
bounds: it is not made from integers and constants. Iterative over the graph (an explicit stack, no recursion) and
bounded: at most _MAX_NODES nodes are looked at per question, and a question about a deeper value has no answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from ..ir import UNKNOWN, Node, Value

__all__ = ["UNBOUNDED", "Bounded", "Interval", "Positions", "bounds_of"]

_MAX_NODES = 200  # a RoPE chain is 10 to 30 nodes, a dim's arithmetic a few; deeper is no position arithmetic
_MAX_CONST = 1 << 16  # a constant read for its range (a frequency table); larger ones are weights
_INTS = ("int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64")
_FLOATS = ("fp64", "fp32", "fp16", "bf16")


class Interval(NamedTuple):
    """Every value lies in [lo, hi]; either end may be infinite (not bounded). (Named tuples: a walk makes a few of
    these per node, and a frozen dataclass costs several times as much to make.)"""

    lo: float
    hi: float

    @property
    def magnitude(self) -> float:
        """The largest |x| in the interval (inf where unbounded)."""
        return max(abs(self.lo), abs(self.hi))


UNBOUNDED = Interval(-math.inf, math.inf)


@dataclass(frozen=True)
class Positions:
    """Where a float's integers come from: the node that makes them a float (a float Range or CumSum, the Cast of
    integers), how it is described, and the interval of the integers there."""

    node: Node | None  # None: integers not yet a float (an integer input, before its Cast)
    kind: str  # "Range", "CumSum of ones", "Cast of an integer Range", "Cast of the integer input 't'"
    interval: Interval
    made: bool  # already a float (an integer Range or input is made one by a Cast later)


class Bounded(NamedTuple):
    """A value made from integers and constants: its interval, the positions it carries (None: constants and dims
    only), the float ops between those positions and it (steps: the op types that compute; chain: every node, for
    a keep-list), the --dim sizes the bounds rest on, and what left it unbounded (a symbolic dim, an input)."""

    interval: Interval
    positions: Positions | None = None
    steps: tuple[str, ...] = ()
    chain: tuple[Node, ...] = ()
    sized_by: tuple[str, ...] = ()
    open: str = ""


_PENDING = object()  # a value whose bounds need its operands'
# ops whose output holds values of their first input (or a hull of them)
_MOVES = frozenset({"Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Transpose", "Expand", "Tile", "Slice",
                    "Gather", "GatherElements", "GatherND", "Split", "ReduceMax", "ReduceMin", "ReduceMean",
                    "Cast", "CastLike", "Concat", "Where", "Max", "Min"})
_BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "MatMul"})
_ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Abs", "Reciprocal", "Exp", "Pow", "MatMul", "Floor",
                         "Ceil", "Round", "Clip", "CumSum", "Range"})


def bounds_of(value: Value | None, dims: dict[str, int] | None = None) -> Bounded | None:
    """The bounds of a value made from integers and constants; None where it reads an activation, or lies more than
    _MAX_NODES nodes from its sources (or from values already bounded). dims: the user's sizes of symbolic dims
    (--dim). Each value's bounds are worked out once for the same dims (a Cos and a Sin share their angle, every
    layer its positions) and kept on the value."""
    if value is None:
        return None
    key = tuple(sorted(dims.items())) if dims else ()
    known = _known(value, key)
    if known is not _PENDING:
        return known  # type: ignore[return-value]
    found = _evaluate(value, dims or {}, key)
    value._bounds = (key, found)
    return found


def _known(value: Value, key: tuple) -> object:
    """The bounds kept on a value for these dims, or _PENDING."""
    kept = value._bounds
    return kept[1] if kept is not UNKNOWN and kept[0] == key else _PENDING


def _evaluate(value: Value, dims: dict[str, int], key: tuple) -> Bounded | None:
    """bounds_of's walk: an explicit stack, each value's bounds once its operands' are known; every value bounded on
    the way is kept on it."""
    memo: dict[int, Bounded] = {}
    expanded: set[int] = set()
    stack = [value]
    while stack:
        current = stack[-1]
        if id(current) in memo:
            stack.pop()
            continue
        found = _known(current, key)
        if found is _PENDING:
            found = _leaf(current, dims)
            if found is not _PENDING:
                current._bounds = (key, found)
        if found is None:
            return None  # an activation: every op here is strict in what it reads, so the value reads it too
        if found is not _PENDING:
            memo[id(current)] = found  # type: ignore[assignment]
            stack.pop()
            continue
        node = current.producer
        assert node is not None  # a value with no producer is a leaf
        operands = _operands(node)
        todo = [v for v in operands if id(v) not in memo]
        if todo:
            if id(current) in expanded or len(expanded) >= _MAX_NODES:
                return None  # a cycle (a hostile graph), or too deep to be position arithmetic
            expanded.add(id(current))
            stack += todo
            continue
        combined = _combine(node, current, [memo[id(v)] for v in operands])
        if combined is None:
            return None
        memo[id(current)] = combined
        current._bounds = (key, combined)
        stack.pop()
    return memo[id(value)]


def _operands(node: Node) -> list[Value]:
    """The inputs whose values the node's output is made of (not an index, a shape or a condition)."""
    op = node.op_type
    if op == "Where":
        picked = node.inputs[1:3]
    elif op == "Range":
        picked = node.inputs[:2]  # every value lies between start and limit, whatever the delta
    elif op in ("Concat", "Add", "Sub", "Mul", "Div", "MatMul", "Max", "Min", "Pow", "Clip"):
        picked = node.inputs
    else:
        picked = node.inputs[:1]
    return [v for v in picked if v is not None]


def _leaf(value: Value, dims: dict[str, int]) -> object:
    """A value's bounds where they need no operand: a constant, an integer input, a dim; None for an activation;
    _PENDING for an op whose operands decide them."""
    if value.is_const:
        return Bounded(_constant(value))
    node = value.producer
    if node is None:  # a graph input (or a value from outside a body)
        if value.dtype in _INTS:
            where = f"the input '{value.name}'"
            return Bounded(Interval(0, math.inf) if value.dtype.startswith("u") else UNBOUNDED,
                           Positions(None, f"the integer input '{value.name}'", UNBOUNDED, False),
                           open=where)
        return None
    op = node.op_type
    if node.domain not in ("", "ai.onnx"):
        return None
    if op in ("Shape", "Size"):
        return _dims(node, None, dims)
    data = node.input(0)
    if op == "Gather" and data is not None and data.producer is not None and data.producer.op_type == "Shape":
        return _dims(data.producer, node.input(1), dims)
    if op == "ConstantOfShape":
        return Bounded(_fill(node))
    if op in _MOVES or op in _ARITHMETIC:
        return _PENDING
    return None


def _constant(value: Value) -> Interval:
    """A constant's least and greatest values (a large one, or one holding NaN, is unbounded)."""
    import numpy as np

    if value.const_size is not None and value.const_size > _MAX_CONST:
        return UNBOUNDED
    data = value.const()
    if data is None or data.size == 0 or data.dtype.kind not in "fiub":
        return UNBOUNDED
    data = np.asarray(data, dtype=np.float64)
    if np.isnan(data).any():
        return UNBOUNDED
    return Interval(float(data.min()), float(data.max()))


def _fill(node: Node) -> Interval:
    fill = node.attrs.get("value")
    if fill is None:
        return Interval(0.0, 0.0)
    try:
        import numpy as np
        from onnx import numpy_helper

        data = np.asarray(numpy_helper.to_array(fill), dtype=np.float64)
    except Exception:
        return UNBOUNDED
    if data.size == 0 or np.isnan(data).any():
        return UNBOUNDED
    return Interval(float(data.min()), float(data.max()))


def _dims(shape_node: Node, index: Value | None, dims: dict[str, int]) -> Bounded:
    """The dims a Shape (sliced by its start and end) makes, those a constant index picks of them, or their product
    (Size): each fixed, sized by --dim, or at least 0 and unbounded."""
    shaped = shape_node.input(0)
    shape = shaped.shape if shaped is not None else None
    if shape is None:
        return Bounded(Interval(0, math.inf), open="a shape the graph does not fix")
    picked = list(shape)
    if shape_node.op_type == "Shape":
        end = shape_node.attrs.get("end")
        picked = picked[int(shape_node.attrs.get("start", 0)):None if end is None else int(end)]
        if index is not None:
            at = _constant(index) if index.is_const else UNBOUNDED
            if at.lo != at.hi or not -len(picked) <= at.lo < len(picked):
                return Bounded(Interval(0, math.inf), open="a dim the graph does not pick")
            picked = [picked[int(at.lo)]]
    sizes, used, open_ = [], [], ""
    for dim in picked:
        if isinstance(dim, int) and dim >= 0:
            sizes.append(float(dim))
        elif isinstance(dim, str) and dim in dims:
            sizes.append(float(dims[dim]))
            used.append(f"{dim}={dims[dim]}")
        else:
            sizes.append(math.inf)
            open_ = open_ or (f"the symbolic dim '{dim}'" if isinstance(dim, str) else "a dim the graph does not fix")
    if shape_node.op_type == "Size":
        product = math.prod(sizes) if sizes else 1.0
        return Bounded(Interval(0 if math.isinf(product) else product, product), sized_by=tuple(used), open=open_)
    if not sizes:
        return Bounded(Interval(0.0, 0.0))
    finite = [s for s in sizes if not math.isinf(s)]
    return Bounded(Interval(min(finite) if len(finite) == len(sizes) else 0.0, max(sizes)), sized_by=tuple(used),
                   open=open_)


def _combine(node: Node, value: Value, operands: list[Bounded]) -> Bounded | None:
    """A node's bounds from its operands': the interval its op makes, and the positions it carries on (those with
    the fewest steps: the timestep, not the Range a frequency table is made from)."""
    interval = _interval(node, [b.interval for b in operands], value.dtype)
    if interval is None:
        return None
    op = node.op_type
    if len(operands) == 1 and op in _MOVES and op not in ("Cast", "CastLike"):  # most steps: the value moves on
        b = operands[0]
        made = b.positions is not None and b.positions.made
        return Bounded(interval, b.positions, b.steps, (*b.chain, node) if made else b.chain, b.sized_by, b.open)
    sized_by = tuple(dict.fromkeys(s for b in operands for s in b.sized_by))
    open_ = next((b.open for b in operands if b.open), "")
    if not open_ and math.isinf(interval.magnitude):
        open_ = f"{node.op_type} '{node.name}'"  # bounded operands, an unbounded result (a division by 0)
    carriers = [b for b in operands if b.positions is not None]
    base = min(carriers, key=lambda b: len(b.steps)) if carriers else None
    positions, steps = (base.positions, base.steps) if base is not None else (None, ())
    chain = tuple(dict.fromkeys(n for b in carriers for n in b.chain))
    is_float = value.dtype in _FLOATS
    if op == "Range" or (op == "CumSum" and not carriers and operands and operands[0].interval.lo == \
            operands[0].interval.hi):
        kind = "Range" if op == "Range" else "CumSum of ones"
        positions = Positions(node if is_float else None, kind if is_float else f"an integer {kind}", interval,
                              is_float)
        steps, chain = (), (node,) if is_float else ()
    elif positions is not None and is_float and not positions.made:  # the Cast that makes the integers floats
        positions = Positions(node, f"Cast of {positions.kind}", interval, True)
        steps, chain = (), (node,)
    elif positions is not None and is_float:
        chain += (node,)
        if op in _ARITHMETIC:
            steps += (op,)
    return Bounded(interval, positions, steps, chain, sized_by, open_)


def _make(lo: float, hi: float) -> Interval:
    """An interval, unbounded where an end came out NaN (inf - inf)."""
    return UNBOUNDED if math.isnan(lo) or math.isnan(hi) else Interval(min(lo, hi), max(lo, hi))


def _times(a: float, b: float) -> float:
    return 0.0 if a == 0 or b == 0 else a * b  # the values are finite: 0 times any of them is 0


def _product(a: Interval, b: Interval) -> Interval:
    corners = [_times(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
    return _make(min(corners), max(corners))


def _inverse(b: Interval) -> Interval | None:
    """1/b, where b cannot be 0."""
    if b.lo > 0 or b.hi < 0:
        return _make(1 / b.hi if b.hi else 0.0, 1 / b.lo if b.lo else 0.0)
    return None


def _exp(x: float) -> float:
    return math.inf if x > 709 else math.exp(x)


def _hull(ivs: list[Interval]) -> Interval:
    return Interval(min(i.lo for i in ivs), max(i.hi for i in ivs))


def _interval(node: Node, ivs: list[Interval], to: str | None) -> Interval | None:
    """The interval of the values a node makes from operands in ivs (those _operands picks), its output of dtype
    to; None where the op's values are none this module bounds (a Cast to a string, a malformed node)."""
    op = node.op_type
    if not ivs or (op in _BINARY and len(ivs) < 2):
        return None
    a = ivs[0]
    if op in ("Concat", "Where", "Range"):
        return _hull(ivs)
    if op in ("Max", "Min"):
        pick = max if op == "Max" else min
        return Interval(pick(i.lo for i in ivs), pick(i.hi for i in ivs))
    if op in ("Cast", "CastLike"):
        return _cast(a, to)
    if op in _MOVES:
        return a
    if op in ("Add", "Sub", "Mul", "Div", "Pow"):
        return _arithmetic(op, a, ivs[1])
    if op in ("Reciprocal", "Neg", "Abs", "Floor", "Ceil", "Round", "Exp"):
        return _elementwise(op, a)
    if op == "MatMul":
        return _matmul(node, a, ivs[1])
    if op == "Clip":
        return _clip(node, ivs)
    if op == "CumSum":
        return _cumsum(node, a)
    return None


def _arithmetic(op: str, a: Interval, b: Interval) -> Interval:
    """a op b for the binary arithmetic ops: Add, Sub, Mul, Div and Pow."""
    if op == "Add":
        return _make(a.lo + b.lo, a.hi + b.hi)
    if op == "Sub":
        return _make(a.lo - b.hi, a.hi - b.lo)
    if op == "Mul":
        return _product(a, b)
    if op == "Div":
        inverse = _inverse(b)
        return UNBOUNDED if inverse is None else _product(a, inverse)
    return _power(a, b)


def _elementwise(op: str, a: Interval) -> Interval:
    """op(a) for the one-operand ops: Reciprocal, Neg, Abs, Floor, Ceil, Round and Exp."""
    if op == "Reciprocal":
        inverse = _inverse(a)
        return UNBOUNDED if inverse is None else inverse
    if op == "Neg":
        return Interval(-a.hi, -a.lo)
    if op == "Abs":
        return Interval(0.0 if a.lo <= 0 <= a.hi else min(abs(a.lo), abs(a.hi)), a.magnitude)
    if op == "Exp":
        return Interval(_exp(a.lo) if a.lo > -math.inf else 0.0, _exp(a.hi))
    return _make(math.floor(a.lo) if math.isfinite(a.lo) else a.lo, math.ceil(a.hi) if math.isfinite(a.hi) else a.hi)


def _cast(a: Interval, to: str | None) -> Interval | None:
    """A Cast (or CastLike) to a float keeps the values; to an integer type truncates them (within [floor, ceil]),
    or wraps those its type cannot hold (unbounded then); to bool makes 0 or 1. to: the output's dtype name."""
    import numpy as np

    if to in _FLOATS:
        return a
    if to == "bool":
        return Interval(0.0, 1.0)
    if to not in _INTS:
        return None
    info = np.iinfo(to)
    lo = math.floor(a.lo) if math.isfinite(a.lo) else a.lo
    hi = math.ceil(a.hi) if math.isfinite(a.hi) else a.hi
    # an unbounded end stays so (the type's limit is no bound the graph fixes); a finite one past it wraps
    wraps = (math.isfinite(lo) and lo < info.min) or (math.isfinite(hi) and hi > info.max)
    return UNBOUNDED if wraps else Interval(lo, hi)


def _power(base: Interval, exponent: Interval) -> Interval:
    """base ** exponent: monotone in each for a positive base (the extremes are at the corners); an integer
    exponent of any base; else unbounded (a negative base to a fraction is NaN)."""
    def power(b: float, e: float) -> float:
        try:
            return math.pow(b, e)
        except (OverflowError, ValueError, ZeroDivisionError):
            return math.inf

    if base.lo > 0:
        corners = [power(b, e) for b in (base.lo, base.hi) for e in (exponent.lo, exponent.hi)]
        return _make(min(corners), max(corners))
    e = exponent.lo
    if e != exponent.hi or not math.isfinite(e) or e != int(e) or e < 0 or not math.isfinite(base.magnitude):
        return UNBOUNDED
    ends = [power(base.lo, e), power(base.hi, e)]
    low = 0.0 if e % 2 == 0 and base.lo <= 0 <= base.hi else min(ends)
    return _make(low, max(ends))


def _matmul(node: Node, a: Interval, b: Interval) -> Interval:
    """Each output sums K products, K the inner dim: K times the products' hull; unbounded where K is not fixed."""
    left = node.input(0)
    shape = left.shape if left is not None else None
    inner = shape[-1] if shape else None
    corners = _product(a, b)
    if corners.lo == corners.hi == 0:
        return corners
    if not isinstance(inner, int):
        return UNBOUNDED
    return _make(_times(inner, corners.lo), _times(inner, corners.hi))


def _clip(node: Node, ivs: list[Interval]) -> Interval:
    """min(max(x, low), high): low and high inputs (opset 11 on; either may be omitted) or attributes (before)."""
    rest = iter(ivs[1:])
    ends = []
    for i, attr, default in ((1, "min", -math.inf), (2, "max", math.inf)):
        if node.input(i) is not None:
            ends.append(next(rest))
        else:
            given = float(node.attrs.get(attr, default))
            ends.append(Interval(given, given))
    low, high, a = ends[0], ends[1], ivs[0]
    return _make(min(max(a.lo, low.lo), high.lo), min(max(a.hi, low.hi), high.hi))


def _cumsum(node: Node, a: Interval) -> Interval:
    """Partial sums of up to L terms in a (0 among them, for exclusive and reverse sums): L times a's ends, and 0;
    unbounded on a side a's terms push toward where L is not fixed."""
    length = _summed_length(node)
    if length:
        lo, hi = min(0.0, a.lo, _times(length, a.lo)), max(0.0, a.hi, _times(length, a.hi))
    else:
        lo, hi = (min(0.0, a.lo) if a.lo >= 0 else -math.inf), (max(0.0, a.hi) if a.hi <= 0 else math.inf)
    return _make(lo, hi)


def _summed_length(cumsum: Node) -> int | None:
    """The length of the axis a CumSum adds along, where the input's shape and the axis fix it."""
    data, axis = cumsum.input(0), cumsum.input(1)
    shape = data.shape if data is not None else None
    if shape is None or axis is None or not axis.is_const:
        return None
    at = _constant(axis)
    if at.lo != at.hi or not -len(shape) <= at.lo < len(shape):
        return None
    dim = shape[int(at.lo)]
    return dim if isinstance(dim, int) and dim >= 0 else None
