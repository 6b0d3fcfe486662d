"""The JSON report: schema_version, tool, settings, results, errors and a summary (see schemas/).

Names are data here: node and initializer names, scopes, paths and messages are carried as the model spells
them, control characters and all (json.dumps escapes those), so a script can match them exactly. Whoever
prints them to a terminal escapes them (precaudit.escape.printable does it for the text reports).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict

from ..escape import encodable
from ..finding import SEVERITIES
from ..version import __version__
from .outcome import Outcome

__all__ = ["SCHEMA_VERSION", "render_json", "report_document"]

SCHEMA_VERSION = "1.0"


def report_document(outcome: Outcome) -> dict:
    """The report as plain data; render_json serializes it."""
    result = outcome.result
    counts = {s: sum(1 for f in result.findings if f.severity == s) for s in SEVERITIES}
    doc = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "precaudit", "version": __version__},
        "settings": outcome.settings,
        "models": result.models,
        "results": [f.to_dict() for f in result.findings],
        "errors": [{"file": e.file, "line": e.line, "message": e.problem} for e in result.errors],
        "summary": {"models": len(result.models), "findings": len(result.findings), **counts,
                    "exit_code": outcome.exit_code},
    }
    if result.quantized:
        doc["quantized"] = [{"model": model, **q.record()} for model, q in result.quantized.items()]
    if result.traces:
        doc["trace"] = [{"model": model, **run.record()} for model, run in result.traces.items()]
    if outcome.baseline is not None:
        match = outcome.baseline
        doc["baseline"] = {"file": match.file, "matched": match.matched, "stale": [asdict(e) for e in match.stale]}
    return doc


def render_json(outcome: Outcome) -> str:
    return json.dumps(_strict(report_document(outcome)), indent=2, allow_nan=False) + "\n"


def strict_json(value):
    """The value as plain JSON takes it (_strict): what every JSON precaudit writes goes through."""
    return _strict(value)


def _strict(value):
    """Plain JSON: inf and nan (an eps that overflowed) become the strings "inf", "-inf", "nan", and a lone
    surrogate (a path with bytes that are not UTF-8) is written as the visible text \\udcxx, not as a JSON escape
    that strict parsers and I-JSON reject.
    """
    if isinstance(value, str):  # the most common value first: this walks every value of every finding
        return encodable(value)
    if isinstance(value, dict):
        return {_strict(k): _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
