"""The traced findings fix counts (--trace): it repairs none of them, so a run that was given them must not say the
audit finds nothing, nor exit 0 while one of them is an error."""

from __future__ import annotations

from ..analysis.compute_dtype import DtypeResolver
from ..collector import collector_paused
from ..finding import Finding, measured_on
from ..ir import Graph
from ..options import TraceOptions
from ..rules.engine import apply_rules
from ..rules.loader import Rule

__all__ = ["traced_findings"]


def traced_findings(path: str, graph: Graph, resolver: DtypeResolver, rules: list[Rule],
                    trace: TraceOptions) -> list[Finding]:
    """The traced findings on trace's inputs, each saying what it was measured on (on synthesized inputs an error
    is a warning, as `precaudit check` says it)."""
    from ..trace import traced_sites  # numpy emulation loads only in traced mode

    sites, run = traced_sites(graph, resolver, trace)
    with collector_paused():
        return [measured_on(f, run.source) for f in apply_rules(rules, sites, path)]
