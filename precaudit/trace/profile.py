"""What a traced run measured, in graph order, kept for the HTML report's charts: the same numbers the sites hold."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..analysis.constants import is_constant
from ..analysis.sites.base import Site
from ..ir import Graph
from .stats import ValueStats

__all__ = ["NormPoint", "TraceProfile", "ValuePoint", "build_profile"]


@dataclass(frozen=True, slots=True)
class ValuePoint:
    """One float value a node made: its range in the float reference, and what the emulated run made of it."""

    order: int  # its node's position in the graph
    node: str
    op: str
    scope: str | None
    value: str
    dtype: str  # the format it is held in: the target's, or fp32 in an island or a --keep-fp32 block
    elements: int
    absmax: float
    min_nonzero: float | None  # None when every element is 0
    overflow: int
    underflow: int
    subnormal: int
    nonfinite: int  # inf/NaN in the emulated run
    ref_nonfinite: int  # inf/NaN in the float reference too (log(0) that the model masks away)


@dataclass(frozen=True, slots=True)
class NormPoint:
    """A norm whose per-row statistic the run observed: the rows' variance (mean square) against its eps."""

    order: int
    node: str
    op: str
    scope: str | None
    compute_dtype: str
    eps: float | None
    eps_rounded: float | None
    rows: int
    min_variance: float
    median_variance: float
    rows_below_eps: int
    zero_variance_rows: int  # variance exactly 0.0 in the emulated run


@dataclass
class TraceProfile:
    """Every measured value and norm of one traced run, and where it first turned non-finite."""

    values: list[ValuePoint] = field(default_factory=list)
    norms: list[NormPoint] = field(default_factory=list)
    first_nonfinite: str | None = None  # where the run first turns inf/NaN on a path to an output (PA906's node)


def build_profile(graph: Graph, stats: dict[int, ValueStats], sites: list[Site]) -> TraceProfile:
    """The value stats in node order (constants left out, as the traced sites leave them), the norm and first
    non-finite sites' facts."""
    order = {id(node): i for i, node in enumerate(graph.nodes)}
    profile = TraceProfile()
    for i, node in enumerate(graph.nodes):
        for value in node.outputs:
            s = stats.get(id(value))
            if s is None or s.elements == 0 or is_constant(value):
                continue
            profile.values.append(ValuePoint(
                i, node.name, node.op_type, node.scope, value.name, s.fmt.name, s.elements, s.absmax,
                s.min_nonzero if math.isfinite(s.min_nonzero) else None, s.overflow, s.underflow, s.subnormal,
                s.nonfinite, s.ref_nonfinite))
    for site in sites:
        f = site.facts
        if site.kind == "traced_norm":
            profile.norms.append(NormPoint(
                order[id(site.node)], site.node.name, site.node.op_type, site.node.scope, f["compute_dtype"],
                f.get("eps"), f.get("eps_rounded"), f["rows"], f["min_variance"], f["median_variance"],
                f["rows_below_eps"], f["zero_variance_rows"]))
        elif site.kind == "traced_first_nonfinite" and f["reaches_output"]:
            profile.first_nonfinite = site.node.name
    return profile
