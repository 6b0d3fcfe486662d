"""The pipeline, one way: load → IR → sites → findings, for each model the user names."""

from __future__ import annotations

from dataclasses import dataclass, field

from .analysis.compute_dtype import DtypeResolver
from .analysis.collect import collect_sites
from .dtypes import Format
from .errors import InputError
from .finding import Finding
from .frontends.onnx import load_onnx
from .ir import Graph
from .rules.engine import apply_rules
from .rules.loader import Rule

__all__ = ["AuditResult", "audit_models", "load_graph"]


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


def audit_models(paths: list[str], target: Format, rules: list[Rule], keep_fp32: list[str]) -> AuditResult:
    """Audit each model; a model that fails to load is recorded as an error and the rest go on."""
    result = AuditResult()
    for path in paths:
        try:
            graph = load_graph(path)
            resolver = DtypeResolver(graph, target, keep_fp32)
            patterns = {rule.id: rule.pattern for rule in rules if rule.pattern is not None}
            result.findings.extend(apply_rules(rules, collect_sites(graph, resolver, patterns), path))
        except InputError as exc:
            result.errors.append(exc)
            continue
        result.models.append(path)
    return result
