"""What an audit run found, as every report reads it: the findings, the models and their errors, and what the
traced runs, the dtype map and the quantization summary recorded per model. Plain data: reports import this and
no pipeline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import InputError
from .finding import Finding

if TYPE_CHECKING:
    from .analysis.quantized import Quantization
    from .report.dtype_map import NodeDtype
    from .trace import TraceRun
    from .train.profile import GradientProfile

__all__ = ["AuditResult"]


@dataclass
class AuditResult:
    """Findings across all models, and the models that could not be audited."""

    findings: list[Finding] = field(default_factory=list)
    errors: list[InputError] = field(default_factory=list)
    models: list[str] = field(default_factory=list)  # every model audited successfully
    traces: dict[str, TraceRun] = field(default_factory=dict)  # per model, with --trace: its inputs and engines
    dtype_maps: dict[str, list[NodeDtype]] = field(default_factory=dict)  # per model, for the HTML report
    quantized: dict[str, Quantization] = field(default_factory=dict)  # per model with QDQ or integer ops
    gradients: dict[str, GradientProfile] = field(default_factory=dict)  # per training factory, traced
