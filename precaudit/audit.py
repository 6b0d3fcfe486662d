"""The pipeline, one way: load → IR → sites → findings, for each model the user names."""

from __future__ import annotations

from dataclasses import dataclass, field

from .analysis.compute_dtype import DtypeResolver
from .analysis.decomposed import find_decomposed_norms
from .analysis.sites import Site, find_sites
from .dtypes import Format
from .errors import InputError
from .finding import Finding
from .frontends.onnx import load_onnx
from .ir import Graph
from .rules.engine import apply_rules
from .rules.loader import Rule

__all__ = ["AuditResult", "audit_models", "collect_sites", "load_graph"]


@dataclass
class AuditResult:
    """Findings across all models, and the models that could not be audited."""

    findings: list[Finding] = field(default_factory=list)
    errors: list[InputError] = field(default_factory=list)
    models: list[str] = field(default_factory=list)  # every model audited successfully


def load_graph(path: str) -> Graph:
    """Pick the frontend by file type."""
    if path.lower().endswith(".onnx"):
        return load_onnx(path)
    raise InputError(path, "unsupported model type: precaudit reads .onnx files")


def collect_sites(graph: Graph, resolver: DtypeResolver) -> list[Site]:
    """Fused-op sites and recognized chains, in graph order."""
    order = {id(node): i for i, node in enumerate(graph.nodes)}
    sites = find_sites(graph, resolver) + find_decomposed_norms(graph, resolver)
    return sorted(sites, key=lambda s: order[id(s.node)])


def audit_models(paths: list[str], target: Format, rules: list[Rule], keep_fp32: list[str]) -> AuditResult:
    """Audit each model; a model that fails to load is recorded as an error and the rest go on."""
    result = AuditResult()
    for path in paths:
        try:
            graph = load_graph(path)
            resolver = DtypeResolver(graph, target, keep_fp32)
            result.findings.extend(apply_rules(rules, collect_sites(graph, resolver), path))
        except InputError as exc:
            result.errors.append(exc)
            continue
        result.models.append(path)
    return result
