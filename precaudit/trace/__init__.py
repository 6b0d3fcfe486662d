"""Traced mode: run the model on inputs, emulate the target dtype op by op, and turn what happens into sites."""

from __future__ import annotations

from ..analysis.compute_dtype import DtypeResolver
from ..analysis.sites import Site
from ..errors import InputError
from ..ir import Graph
from ..options import TraceOptions

__all__ = ["traced_sites"]


def traced_sites(graph: Graph, resolver: DtypeResolver, options: TraceOptions) -> list[Site]:
    raise InputError(graph.path, "traced mode is being built (issue 5)")
