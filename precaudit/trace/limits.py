"""What traced mode refuses to run: a Loop with too many trips, a node that would make too large a tensor."""

from __future__ import annotations

import math

import numpy as np

from ..analysis.constants import resolve_scalar
from ..errors import InputError
from ..ir import Graph, Node

__all__ = ["MAX_LOOP_TRIPS", "MAX_TENSOR_ELEMENTS", "check_loop_trips", "check_made_size", "made_elements"]


# The largest tensor a node whose output size comes from its inputs' values may make in traced mode, checked
# before it is allocated: 2**28 elements, 1 GiB of float32 (as for a synthesized input, trace/inputs.py)
MAX_TENSOR_ELEMENTS = 1 << 28


# A Loop that runs a fixed trip count (no condition input: ONNX then ignores the body's condition output) more often
# than this is refused before anything runs: onnxruntime takes microseconds a trip at best, so 10**7 trips is minutes
# of a single node, and a count like 10**15 would hold a -j worker until --timeout (30 minutes by default).
MAX_LOOP_TRIPS = 10**7


def check_loop_trips(graph: Graph) -> None:
    """Refuse a Loop whose constant trip count, with no condition to end it early, is beyond MAX_LOOP_TRIPS."""
    for node in graph.by_op("Loop"):
        trips, cond = node.input(0), node.input(1)
        if trips is None or cond is not None:
            continue
        count = resolve_scalar(trips)
        if count is not None and count.value > MAX_LOOP_TRIPS:
            raise InputError(graph.path, f"traced mode: Loop '{node.name}' runs {int(count.value):,} times (a "
                                         f"constant trip count and no condition), above traced mode's "
                                         f"{MAX_LOOP_TRIPS:,}: audit it without --trace")


def made_elements(node: Node, args: list) -> float | None:
    """How many elements a node whose output size depends on its inputs' values will make (ConstantOfShape,
    Expand, Tile, Range, OneHot, Pad), from those values; None for any other node or inputs that do not say."""
    op = node.op_type
    try:
        if op == "ConstantOfShape" and args and args[0] is not None:
            return int(np.prod([int(d) for d in np.asarray(args[0]).reshape(-1)], dtype=object))
        if op == "Expand" and len(args) == 2 and args[1] is not None:
            dims = [int(d) for d in np.asarray(args[1]).reshape(-1)]
            shape = list(np.shape(args[0]))
            width = max(len(dims), len(shape))
            dims, shape = [1] * (width - len(dims)) + dims, [1] * (width - len(shape)) + shape
            return int(np.prod([max(a, b) for a, b in zip(dims, shape)], dtype=object))
        if op == "Tile" and len(args) == 2 and args[1] is not None:
            repeats = [int(r) for r in np.asarray(args[1]).reshape(-1)]
            return int(np.prod([int(d) * r for d, r in zip(np.shape(args[0]), repeats)], dtype=object))
        if op == "Range" and len(args) == 3 and all(a is not None for a in args):
            start, limit, delta = (float(np.asarray(a).reshape(-1)[0]) for a in args)
            count = (limit - start) / delta if delta else math.nan
            if math.isinf(count):
                return math.inf  # a limit that overflowed the narrow format: no Range can run to it
            return max(0, int(np.ceil(count))) if math.isfinite(count) else None
        if op == "OneHot" and len(args) >= 2 and args[1] is not None:
            return int(np.size(args[0])) * int(np.asarray(args[1]).reshape(-1)[0])
        if op == "Pad" and len(args) >= 2 and args[1] is not None:
            pads = [int(p) for p in np.asarray(args[1]).reshape(-1)]
            shape = list(np.shape(args[0]))
            if len(pads) != 2 * len(shape):
                return None  # axes given: the kernel knows
            return int(np.prod([d + pads[i] + pads[i + len(shape)] for i, d in enumerate(shape)], dtype=object))
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    return None


def check_made_size(graph: Graph, node: Node, args: list) -> None:
    """Refuse, before it allocates, a node that would make a tensor beyond MAX_TENSOR_ELEMENTS from these inputs."""
    made = made_elements(node, args)
    if made is not None and made > MAX_TENSOR_ELEMENTS:
        size = "an unbounded number of" if made == math.inf else f"{made:,}"
        raise InputError(graph.path, f"traced mode: node '{node.name}' ({node.op_type}) would make a tensor "
                                     f"of {size} elements from these inputs, above traced mode's "
                                     f"{MAX_TENSOR_ELEMENTS:,} per tensor (1 GiB of float32): give smaller "
                                     f"inputs (--inputs, --dim)")
