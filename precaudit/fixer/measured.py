"""What the audit reports beyond its static pass, for fix to count: the traced findings (--trace) and the weight
rules' (--trace or --check-weights). fix repairs none of them, so a run that was given them must not say the audit
finds nothing, nor exit 0 while one of them is an error."""

from __future__ import annotations

from ..analysis.compute_dtype import DtypeResolver
from ..analysis.sites.weight import find_weight_sites
from ..collector import collector_paused
from ..finding import Finding, measured_on
from ..ir import Graph
from ..options import TraceOptions
from ..rules.engine import apply_rules
from ..rules.loader import Rule

__all__ = ["beyond_static"]


def beyond_static(path: str, graph: Graph, resolver: DtypeResolver, rules: list[Rule], trace: TraceOptions | None,
                  weights: bool) -> list[Finding]:
    """The traced findings on trace's inputs (each saying what it was measured on: on synthesized inputs an error
    is a warning, as `precaudit check` says it) and, where weights are read (traced, or asked), the weight rules'."""
    found: list[Finding] = []
    if trace is not None:
        from ..trace import traced_sites  # numpy emulation loads only in traced mode

        sites, run = traced_sites(graph, resolver, trace)
        with collector_paused():
            found += [measured_on(f, run.source) for f in apply_rules(rules, sites, path)]
    if (trace is not None or weights) and any(kind in rule.sites for rule in rules
                                                for kind in ("weight", "block_weight")):
        found += apply_rules(rules, find_weight_sites(graph, resolver), path)
    return found
