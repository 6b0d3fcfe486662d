"""The JSON report: schema_version, tool, settings, results, errors and a summary (see schemas/)."""

from __future__ import annotations

import json
import math

from .. import __version__
from ..audit import AuditResult
from ..finding import SEVERITIES

__all__ = ["SCHEMA_VERSION", "render_json", "report_document"]

SCHEMA_VERSION = "1.0"


def report_document(result: AuditResult, settings: dict, exit_code: int) -> dict:
    """The report as plain data; render_json serializes it."""
    counts = {s: sum(1 for f in result.findings if f.severity == s) for s in SEVERITIES}
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "precaudit", "version": __version__},
        "settings": settings,
        "models": result.models,
        "results": [f.to_dict() for f in result.findings],
        "errors": [{"file": e.file, "line": e.line, "message": e.problem} for e in result.errors],
        "summary": {"models": len(result.models), "findings": len(result.findings), **counts,
                    "exit_code": exit_code},
    }


def render_json(result: AuditResult, settings: dict, exit_code: int) -> str:
    return json.dumps(_strict(report_document(result, settings, exit_code)), indent=2, allow_nan=False) + "\n"


def _strict(value):
    """Plain JSON: inf and nan (an eps that overflowed) become the strings "inf", "-inf", "nan"."""
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strict(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
