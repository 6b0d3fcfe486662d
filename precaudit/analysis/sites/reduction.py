"""Reduction sites: how many elements a sum (or mean, or CumSum) adds up, in which dtype, and whether it sums
exponentials."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...dtypes import Format
from ...ir import Node, Value
from ..bounds import bounds_of
from ..canonical import producer
from ..compute_dtype import DtypeResolver
from ..constants import is_constant
from .base import Site
from .facts import dtype_facts
from .walks import feeding_op, scalar_of

__all__ = ["REDUCTIONS", "reduction_length", "reduction_site"]


# Ops that add up elements along axes; the site says how many each output sums.
REDUCTIONS = {"ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum",
              "ReduceLogSumExp", "CumSum"}


def reduction_site(node: Node, resolver: DtypeResolver) -> Site | None:
    dtype = resolver.of_node(node)
    if dtype is None:
        return None
    length, axes = reduction_length(node)
    fmt = dtype.fmt
    facts = {"op": node.op_type, "input_op": feeding_op(node.input(0)), "in_norm_chain": False,
             "reduction_length": length, "reduction_axes": axes,
             # with p significant bits (ulp at 1 = 2**(1-p)) a running sum that reaches 2**p times a term no longer
             # changes when that term is added: it is half an ulp, and the tie goes to the even sum
             "swamp_length": round(2 / fmt.ulp_at_1),
             "overflow_term": fmt.max / length if length else None, **_exp_sum_facts(node, length, fmt, resolver),
             **dtype_facts(dtype, resolver)}
    summed = _summed_exp(node.input(0)) if facts["exp_input"] else None
    return Site("reduction", node, facts, span=[summed[0], *summed[2], node] if summed is not None else [])


# ops an Exp's terms pass through on their way into a sum, changed only in layout or copies (a Tile or an Expand
# repeats them: the sum's length counts the copies)
_TERM_MOVES = frozenset({"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Expand", "Tile", "Transpose",
                         "Flatten"})


def _summed_exp(value: Value | None) -> tuple[Node, float, list[Node]] | None:
    """The Exp whose terms a value holds, through moves and products with constants (a Performer's normalizer:
    Exp, Mul by 0.5, Reshape), the largest factor those scale a term by, and the nodes between (last first)."""
    scale, path = 1.0, []  # type: float, list[Node]
    for _ in range(12):
        node = value.producer if value is not None else None
        if node is None:
            return None
        if node.op_type == "Exp":
            return node, scale, path
        if node.op_type in _TERM_MOVES:
            value = node.input(0)
        elif node.op_type in ("Mul", "Div") and len(node.inputs) == 2:
            found = _constant_factor(node)
            if found is None:
                return None  # a product with an activation: no sum of exponentials this site can bound
            value, factor = found
            scale *= factor
        else:
            return None
        path.append(node)
    return None


def _constant_factor(node: Node) -> tuple[Value | None, float] | None:
    """A Mul or Div by a constant: the term it scales, and the largest factor it scales it by (inf for a division by
    a constant that holds 0)."""
    for term, other in ((0, 1), (1, 0)) if node.op_type == "Mul" else ((0, 1),):
        factor = bounds_of(node.input(other)) if is_constant(node.input(other)) else None
        if factor is None or not math.isfinite(factor.interval.magnitude):
            continue
        span = factor.interval
        if node.op_type == "Mul":
            return node.input(term), span.magnitude
        return node.input(term), 1 / min(abs(span.lo), abs(span.hi)) if span.lo > 0 or span.hi < 0 else math.inf
    return None


def _exp_sum_facts(node: Node, length: int | None, fmt: Format, resolver: DtypeResolver) -> dict[str, Any]:
    """A sum (or mean) of exponentials: whether its Exp reads x - max(x), and what reads the sum. A softmax
    (a Div of the same Exp by the sum, or by sum + eps) and a log-sum-exp (a Log of the sum) have rules of their
    own; any other sum of n exponentials overflows once one term passes exp_overflow - ln n. The terms may be
    moved, tiled and scaled by constants on the way (exp(x) * c overflows the sum once x passes exp_overflow -
    ln n - ln c). The Exp may run in a narrower dtype than the sum (the dynamo exporter's float16 exp, cast to
    float32 for the sum): a term then overflows at the Exp's own threshold, whatever the sum holds."""
    summed = _summed_exp(node.input(0)) if node.op_type in ("ReduceSum", "ReduceMean") else None
    if summed is None:
        return {"exp_input": False, "exp_shifted": None, "exp_node": None, "exp_path": None, "sum_use": None,
                "exp_sum_overflow": None, "exp_terms": None, "exp_dtype": None, "exp_overflow": None}
    exp, scale, path = summed
    exp_dtype = resolver.of_node(exp)
    exp_overflow = exp_dtype.fmt.exp_overflow if exp_dtype is not None else fmt.exp_overflow
    summed_at = fmt.exp_overflow - (math.log(length) if length else 0.0) - (math.log(scale) if scale > 0 else -math.inf)
    through = f", through {', '.join(n.op_type for n in reversed(path))}" if path else ""
    if scale != 1.0:
        through += f" (terms times up to {scale:.3g})"
    return {"exp_input": True, "exp_shifted": _max_shifted(exp), "exp_node": exp.name, "exp_path": through,
            "sum_use": _sum_use(node, exp), "exp_sum_overflow": min(summed_at, exp_overflow),
            "exp_overflow": exp_overflow, "exp_dtype": exp_dtype.fmt.long_name if exp_dtype is not None else None,
            "exp_terms": f"{length} terms" if length else "terms whose number the shapes do not fix"}


def _max_shifted(exp: Node) -> bool:
    """exp(x - max(x)): a Sub whose subtrahend comes from a ReduceMax (or Max), through shape ops and Casts."""
    sub = producer(exp.input(0))
    if sub is None or sub.op_type != "Sub" or sub.input(1) is None:
        return False
    top = producer(sub.input(1))
    return top is not None and top.op_type in ("ReduceMax", "Max", "ArgMax")


def _sum_use(total: Node, exp: Node) -> str:
    """softmax: a Div of the same exponentials reads the sum (directly, through Casts and moves, or plus an eps) as
    its divisor; logsumexp: a Log reads it; other: anything else (a partition function, an energy, a
    linear-attention normalizer's sum, which divides other values)."""
    frontier = [total]
    for _ in range(3):  # the sum, an Add of an eps to it, and Casts between
        step = []
        for current in frontier:
            for out in current.outputs:
                for user in out.consumers:
                    if user.op_type == "Log":
                        return "logsumexp"
                    if user.op_type == "Div" and user.input(1) is out:
                        numerator = _summed_exp(user.input(0))
                        if numerator is not None and numerator[0] is exp:
                            return "softmax"
                    if user.op_type in ("Add", "Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Expand",
                                        "Tile"):
                        step.append(user)
        frontier = step
    return "other"


def reduction_length(node: Node) -> tuple[int | None, str]:
    """How many elements each output of a reduction (or CumSum) adds up, and the axes as written.

    The product of the reduced dims of the input's static shape; None when a dim is symbolic, the shape is
    unknown, or the axes are an input computed at run time.
    """
    x = node.input(0)
    shape = x.shape if x is not None else None
    if node.op_type == "CumSum":
        axis = scalar_of(node.input(1))
        axes = None if axis is None else [int(axis)]
    elif "axes" in node.attrs:  # before opset 13 (ReduceSum) or 18 (the others)
        # None: the ATen lowering's x.mean() with no dim, which reduces every axis as absent axes do
        axes = [int(a) for a in node.attrs["axes"] or ()]
    elif (axes_input := node.input(1)) is not None:
        axes = _small_ints(axes_input)
    else:
        axes = []
    if axes is None:
        return None, "computed at run time"
    if not axes and node.attr("noop_with_empty_axes", 0):
        return 1, "none (noop_with_empty_axes)"
    shown = str(axes) if axes else "all"
    if shape is None:
        return None, shown
    rank = len(shape)
    picked = sorted({a + rank if a < 0 else a for a in axes}) if axes else list(range(rank))
    if any(not 0 <= a < rank for a in picked):
        return None, shown
    dims = [shape[a] for a in picked]
    if not all(isinstance(d, int) for d in dims):
        return None, shown
    return math.prod(dims), shown


def _small_ints(value: Value, max_size: int = 64) -> list[int] | None:
    """A small constant integer vector (Reduce* axes as an input), else None."""
    if not value.is_const or value.const_size is None or value.const_size > max_size:
        return None
    data = value.const()
    if data is None or data.dtype.kind not in "iu":
        return None
    return [int(v) for v in np.asarray(data).reshape(-1)]
