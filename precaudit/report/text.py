"""Readable text: findings grouped by model, each with its location, numbers and fix, then a summary."""

from __future__ import annotations

from ..audit import AuditResult
from ..finding import SEVERITIES

__all__ = ["render_text", "summary_line"]

_COLORS = {"error": "31", "warning": "33", "info": "36"}


def render_text(result: AuditResult, settings: dict, color: bool = False) -> str:
    """The report a person reads in a terminal or a CI log."""
    def paint(text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if color else text

    lines: list[str] = []
    for model in _models_in_order(result):
        findings = [f for f in result.findings if f.model == model]
        if not findings:
            continue
        lines.append(paint(f"{model}", "1") + f"  (--dtype {settings['dtype']})")
        for f in findings:
            where = f"node '{f.node_name}' ({f.op_type})"
            if f.scope:
                where += f" in {f.scope}"
            if f.source_file:
                where = f"{f.source_file}:{f.source_line}  " + where
            lines.append(f"  {paint(f'{f.severity:<8}', _COLORS[f.severity])}{f.rule_id} {f.rule_name}  {where}")
            lines.append(f"          {f.message}")
            if f.values.get("compute_reason"):
                lines.append(f"          why {f.values['compute_dtype']}: {f.values['compute_reason']}")
            lines.append(f"          fix: {f.fix}")
        lines.append("")
    lines.append(summary_line(result))
    return "\n".join(lines) + "\n"


def summary_line(result: AuditResult) -> str:
    counts = {s: sum(1 for f in result.findings if f.severity == s) for s in SEVERITIES}
    n_models = len(result.models)
    total = len(result.findings)
    text = (f"Found {total} finding{'s' * (total != 1)} in {n_models} model{'s' * (n_models != 1)}: "
            + ", ".join(f"{counts[s]} {s}{'s' * (counts[s] != 1 and s != 'info')}" for s in SEVERITIES))
    if result.errors:
        text += f"; {len(result.errors)} model{'s' * (len(result.errors) != 1)} could not be audited"
    return text + "."


def _models_in_order(result: AuditResult) -> list[str]:
    seen: dict[str, None] = dict.fromkeys(result.models)
    seen.update(dict.fromkeys(f.model for f in result.findings))
    return list(seen)
