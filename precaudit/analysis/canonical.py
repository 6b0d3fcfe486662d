"""What a value is, whichever ops an exporter wrote it with: one canonical reading for every recognizer.

torch.onnx, tf2onnx, jax2onnx and paddle2onnx write the same statistics with different ops:

- a mean: ReduceMean; GlobalAveragePool (tf2onnx's global_pool_optimizer turns a ReduceMean over the axes 2.. into
  one); ReduceSum · (1/n), (1/n) · ReduceSum or ReduceSum / n (jnp.mean is a sum divided by the count; TF's grappler
  turns x / n into x * (1/n)); and a mean of squares as ReduceSumSquare / n (jax2onnx). A sum scaled by anything
  but 1/n, with n the number of elements it reduces, is no mean.
- a square: Mul(x, x) (tf2onnx's SquaredDifference, jax2onnx's lax.square) or Pow(x, 2).
- a variance clamped at zero: max(0, E[x²] − E[x]²) (flax's fast variance, tf.maximum(var, 0.)) is that variance.
- shape-only ops (Cast, Identity, Reshape, Expand, Squeeze, Unsqueeze) between any two steps (jax2onnx broadcasts
  every statistic back with Reshape → Expand; paddle2onnx puts an Identity after every op), and a multiplication
  by exactly 1 (paddle2onnx's paddle.scale with a scale tensor).

The reading is pure: it never adds, removes or rewires a node, so every other analysis sees the graph as the file
holds it. The pattern matcher's alternatives (`views`) are new Node objects that no Value lists as a consumer.
Each question looks at a bounded number of nodes (shape-only hops are capped at _MAX_HOPS), so asking it of every
value of a graph costs linear time and no recursion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..dtypes import FORMATS, round_to_format
from ..ir import Node, Value
from .constants import resolve_scalar

__all__ = [
    "SHAPE_ONLY",
    "STATISTICS",
    "Reduction",
    "clamped_difference",
    "is_centred",
    "producer",
    "reduced_count",
    "reduction",
    "square_base",
    "through_shape",
    "views",
]

SHAPE_ONLY = frozenset({"Cast", "Identity", "Expand", "Reshape", "Unsqueeze", "Squeeze"})
_MAX_HOPS = 8  # shape-only ops between two steps of a statistic: exporters write one to three
_REDUCTIONS = {"ReduceMean": ("mean", False), "GlobalAveragePool": ("mean", False), "ReduceSum": ("sum", False),
               "ReduceSumSquare": ("sum", True), "ReduceL2": ("l2", True),
               # ReduceVar is the torch frontend's name for aten.var / var_mean / std: not an ONNX op, a statistic
               "ReduceVar": ("var", False)}
STATISTICS = frozenset(_REDUCTIONS)  # the reductions a norm's statistic is made with (keep-list's chains use them)
# The formats a constant 1/n or n may be stored in: it must be exactly what one of them holds.
_STORED = tuple(FORMATS[name] for name in ("fp64", "fp32", "fp16", "bf16"))
_MAX_AXES = 64


@dataclass(frozen=True)
class Reduction:
    """A statistic over some axes, as the graph computes it.

    kind: mean, sum, l2 (a norm) or var. squares: the op squares its input itself (ReduceSumSquare, ReduceL2), so
    there is no square node to judge. node: the reduction op; scale: the Mul/Div that turns its sum into a mean.
    """

    kind: str
    node: Node
    data: Value | None
    squares: bool = False
    scale: Node | None = None
    count: int | None = None

    @property
    def last(self) -> Node:
        """The node whose output is the statistic."""
        return self.scale or self.node


def through_shape(value: Value | None) -> Value | None:
    """The value a chain of shape-only ops (and casts, and multiplications by exactly 1) started from, within
    _MAX_HOPS hops."""
    for _ in range(_MAX_HOPS):
        node = value.producer if value is not None else None
        if node is None:
            return value
        if node.op_type in SHAPE_ONLY:
            value = node.input(0)
        elif node.op_type in ("Mul", "Div") and len(node.inputs) == 2 and (kept := _times_one(node)) is not None:
            value = node.input(kept)
        else:
            return value
    return value


def _times_one(node: Node) -> int | None:
    """The input a Mul(x, 1) or Div(x, 1) passes through unchanged (paddle2onnx writes paddle.scale with a scale
    tensor of 1 as a Mul), or None."""
    for x_i, c_i in ((0, 1), (1, 0)) if node.op_type == "Mul" else ((0, 1),):
        const = resolve_scalar(node.input(c_i))
        if const is not None and const.value == 1.0 and resolve_scalar(node.input(x_i)) is None:
            return x_i
    return None


def producer(value: Value | None) -> Node | None:
    value = through_shape(value)
    return value.producer if value is not None else None


def square_base(value: Value | None) -> tuple[Node, Value | None] | None:
    """(the squaring node, the value squared) if value is x*x or x**2; else None."""
    node = producer(value)
    if node is None:
        return None
    if node.op_type == "Mul" and node.input(0) is not None and \
            through_shape(node.input(0)) is through_shape(node.input(1)):
        return node, node.input(0)
    if node.op_type == "Pow":
        exponent = resolve_scalar(node.input(1))
        if exponent is not None and exponent.value == 2.0:
            return node, node.input(0)
    return None


def reduction(value: Value | None) -> Reduction | None:
    """The statistic a value is: a reduction, or a sum scaled by 1/n into a mean; None for anything else."""
    node = producer(value)
    if node is None:
        return None
    raw = _raw_reduction(node)
    if raw is not None:
        return raw
    if node.op_type not in ("Mul", "Div") or len(node.inputs) != 2:
        return None
    orders = ((0, 1), (1, 0)) if node.op_type == "Mul" else ((0, 1),)
    for s_i, c_i in orders:
        summed = _raw_reduction(producer(node.input(s_i)))
        const = resolve_scalar(node.input(c_i))
        if summed is None or summed.kind != "sum" or const is None:
            continue
        count = reduced_count(summed.node)
        if _scales_to_mean(const.value, count, divides=node.op_type == "Div"):
            return Reduction("mean", summed.node, summed.data, summed.squares, node, count)
    return None


def _raw_reduction(node: Node | None) -> Reduction | None:
    if node is None or node.op_type not in _REDUCTIONS:
        return None
    kind, squares = _REDUCTIONS[node.op_type]
    return Reduction(kind, node, node.input(0), squares, None, reduced_count(node) if kind == "mean" else None)


def _scales_to_mean(c: float, count: int | None, divides: bool) -> bool:
    """Whether multiplying by c (or dividing by c) turns a sum of `count` elements into their mean: c must be
    exactly what a float format stores for 1/n (or n). With the count unknown, n is the nearest integer (>= 2)."""
    if not math.isfinite(c) or c <= 0:
        return False
    n = count if count is not None else round(c if divides else 1.0 / c)
    if n < 1 or (count is None and n < 2):
        return False
    target = float(n) if divides else 1.0 / n
    return any(round_to_format(target, fmt) == c for fmt in _STORED)


def reduced_count(node: Node) -> int | None:
    """How many elements a reduction combines per output, from its input's static shape; None when unknown."""
    data = node.input(0)
    shape = data.shape if data is not None else None
    if shape is None:
        return None
    rank = len(shape)
    axes: list[int] | None
    if node.op_type == "GlobalAveragePool":
        axes = list(range(2, rank))
    else:
        axes = node.attrs.get("axes")
        if axes is None and (axes_input := node.input(1)) is not None:
            axes = _int_constant(axes_input)
            if axes is None:
                return None  # axes computed at run time
        if not axes:
            if node.attrs.get("noop_with_empty_axes", 0):
                return 1
            axes = list(range(rank))
    n = 1
    for given in axes:
        axis = int(given) + rank if int(given) < 0 else int(given)
        if not 0 <= axis < rank:
            return None
        dim = shape[axis]
        if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool) or dim <= 0:
            return None
        n *= int(dim)
    return n


def _int_constant(value: Value) -> list[int] | None:
    if not value.is_const or (value.const_size or 0) > _MAX_AXES:
        return None
    data = value.const()
    if data is None or data.dtype.kind not in "iu":
        return None
    return [int(v) for v in np.asarray(data).ravel()]


def clamped_difference(value: Value | None) -> Value | None:
    """If value is a difference clamped at zero — Max(d, 0), Max(0, d), Clip(d, min=0), Relu(d) for a Sub d
    (flax's max(0, E[x²] − E[x]²)) — the difference d; else None. A clamp at 0 makes a variance non-negative; it
    is no eps (it keeps a zero variance zero)."""
    node = producer(value)
    if node is None:
        return None
    inner = None
    if node.op_type == "Relu":
        inner = node.input(0)
    elif node.op_type == "Clip":
        low = resolve_scalar(node.input(1)) if node.input(1) is not None else None
        low_value = low.value if low is not None else node.attrs.get("min")
        if low_value is not None and float(low_value) == 0.0 and (node.input(2) is None and "max" not in node.attrs):
            inner = node.input(0)
    elif node.op_type == "Max" and len(node.inputs) == 2:
        for x_i, c_i in ((0, 1), (1, 0)):
            const = resolve_scalar(node.input(c_i))
            if const is not None and const.value == 0.0 and resolve_scalar(node.input(x_i)) is None:
                inner = node.input(x_i)
                break
    diff = producer(inner)
    return inner if diff is not None and diff.op_type == "Sub" else None


def is_centred(value: Value | None) -> bool:
    """Whether a value is x minus something (x − E[x]), looking through shape-only ops and a Where that zeroes
    some rows (jax2onnx's exact zeros for constant rows: Where(constant_row, 0, x − mean))."""
    node = producer(value)
    if node is not None and node.op_type == "Where" and len(node.inputs) == 3:
        for keep, zero in ((2, 1), (1, 2)):
            const = resolve_scalar(node.input(zero))
            if const is not None and const.value == 0.0:
                node = producer(node.input(keep))
                break
    return node is not None and node.op_type == "Sub"


def views(value: Value | None) -> list[Node]:
    """Other readings of the node that makes value, for the pattern matcher: the producer beyond shape-only ops,
    and a ReduceMean for a mean written another way (its input a Mul(x, x) for ReduceSumSquare / n). Made fresh on
    each call, linked to the graph only through their inputs."""
    found: list[Node] = []
    beyond = producer(value)
    if beyond is not None and beyond is not (value.producer if value is not None else None):
        found.append(beyond)
    stat = reduction(value)
    if stat is not None and stat.kind == "mean" and stat.node.op_type != "ReduceMean":
        data = stat.data
        if stat.squares and data is not None:
            square = Node(f"{stat.node.name} (its square)", "Mul", inputs=[data, data], scope=stat.node.scope)
            data = Value(f"{data.name}²", dtype=data.dtype, shape=data.shape, producer=square)
            square.outputs.append(data)
        last = stat.last
        mean = Node(last.name, "ReduceMean", inputs=[data], scope=last.scope, source_file=last.source_file,
                    source_line=last.source_line, opset=last.opset)
        mean.outputs.append(Value(f"{last.name} (mean)", producer=mean))
        found.append(mean)
    return found
