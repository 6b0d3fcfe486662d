"""Angle sites: a Sin or Cos of an angle made from integers (position x frequency, or any arithmetic on positions
by constants), against the spacing of the format at its size."""

from __future__ import annotations

import math

from ...dtypes import Format
from ...ir import Node
from ..canonical import producer
from ..compute_dtype import DtypeResolver
from ..integers import angle_source
from .base import Site
from .facts import dtype_facts
from .integer_float import sized_by

__all__ = ["angle_site"]


def _spacing(bound: float, fmt: Format) -> float:
    """The distance between neighbouring values of the format at |x| = bound (normal range)."""
    return 2.0 ** math.floor(math.log2(bound)) * fmt.ulp_at_1 if bound > 0 else 0.0


def angle_site(node: Node, resolver: DtypeResolver) -> Site | None:
    """A Sin or Cos of an angle made from integers and constants, with the bound the graph fixes."""
    angle = angle_source(node.input(0), resolver.graph.dim_sizes)
    if angle is None:
        return None
    maker = producer(node.input(0)) or node
    dtype = resolver.of_node(maker)
    if dtype is None:
        return None
    fmt = dtype.fmt
    if angle.bound is not None:
        text = f"at most {angle.bound:.6g} rad{sized_by(angle.positions.sized_by)}"
    else:
        text = f"with no bound the graph fixes (it follows {angle.positions.open or 'values the graph does not bound'})"
    facts = {"op": node.op_type, "angle_from": angle.positions.kind, "angle_made": angle.made,
             "position_bound": angle.positions.bound, "max_frequency": angle.frequency, "angle_bound": angle.bound,
             "angle_bound_text": text, "angle_spacing": _spacing(angle.bound, fmt) if angle.bound else None,
             # from this |angle| on, neighbouring values are 1/8 rad apart or more
             "coarse_from": 0.125 / fmt.ulp_at_1, **dtype_facts(dtype, resolver)}
    return Site("angle", node, facts, span=[*angle.chain, node])
