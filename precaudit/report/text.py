"""Readable text: findings grouped by model, each with its location, numbers and fix, then a summary."""

from __future__ import annotations

from collections import Counter

from ..audit import AuditResult
from ..escape import printable
from ..finding import SEVERITIES
from .locations import node_phrase, shown
from .outcome import Outcome

__all__ = ["render_text", "render_statistics", "summary_line"]

_COLORS = {"error": "31", "warning": "33", "info": "36"}


def render_text(outcome: Outcome, color: bool = False) -> str:
    """The report a person reads in a terminal or a CI log.

    Every string from a model or a path is escaped (escape.printable) before it is painted or joined, so each
    line below is one line, and the only escape sequences are the colors painted here.
    """
    def paint(text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if color else text

    result = outcome.result
    lines: list[str] = []
    for model in _models_in_order(result):
        findings = [f for f in result.findings if f.model == model]
        if not findings:
            continue
        lines.append(paint(printable(model), "1") + f"  (--dtype {outcome.settings['dtype']})")
        for f in map(shown, findings):
            where = node_phrase(f)
            if f.source_file:
                where = f"{f.source_file}:{f.source_line}  " + where
            lines.append(f"  {paint(f'{f.severity:<8}', _COLORS[f.severity])}{f.rule_id} {f.rule_name}  {where}")
            lines.append(f"          {f.message}")
            if f.values.get("compute_reason"):
                lines.append(f"          why {f.values['compute_dtype']}: {f.values['compute_reason']}")
            lines.append(f"          fix: {f.fix}")
        lines.append("")
    lines.extend(_trace_lines(result))
    lines.append(summary_line(result))
    lines.extend(_hidden_lines(outcome))
    return "\n".join(lines) + "\n"


def render_statistics(outcome: Outcome) -> str:
    """--statistics: one line per rule with its count, most frequent first, then the summary."""
    counts = Counter((f.rule_id, f.rule_name, f.severity) for f in outcome.result.findings)
    rows = sorted(counts.items(), key=lambda item: (-item[1], item[0][0]))
    width = max((len(printable(name)) for (_, name, _), _ in rows), default=0)
    lines = [f"{n:>5}  {rule_id:<6} {printable(name):<{width}}  {severity}" for (rule_id, name, severity), n in rows]
    return "\n".join([*lines, *_trace_lines(outcome.result), summary_line(outcome.result),
                      *_hidden_lines(outcome)]) + "\n"


def summary_line(result: AuditResult) -> str:
    counts = {s: sum(1 for f in result.findings if f.severity == s) for s in SEVERITIES}
    n_models = len(result.models)
    total = len(result.findings)
    text = (f"Found {total} finding{'s' * (total != 1)} in {n_models} model{'s' * (n_models != 1)}: "
            + ", ".join(f"{counts[s]} {s}{'s' * (counts[s] != 1 and s != 'info')}" for s in SEVERITIES))
    if result.errors:
        text += f"; {len(result.errors)} model{'s' * (len(result.errors) != 1)} could not be audited"
    return text + "."


def _hidden_lines(outcome: Outcome) -> list[str]:
    """Say what ignores and the baseline hid, and which baseline entries no longer match anything."""
    lines = []
    if outcome.ignored:
        lines.append(f"{_count(outcome.ignored, 'finding')} ignored by per-model or per-node ignores.")
    match = outcome.baseline
    if match is not None:
        lines.append(f"{_count(match.matched, 'finding')} already in the baseline {match.file}.")
        for e in match.stale:
            lines.append(f"stale baseline entry: {e.rule_id} at {e.model} node '{e.node_name}' no longer found; "
                         f"rewrite the baseline with --write-baseline {match.file}")
    return [printable(line) for line in lines]  # the baseline file's path and entries: as hostile as a model


def _trace_lines(result: AuditResult) -> list[str]:
    """What each traced run was fed and what ran it: traced findings hold for these inputs only."""
    # the model's path, the inputs files' paths and the model's input names
    return [printable(f"traced {model}: {run.describe()}") for model, run in result.traces.items()]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _models_in_order(result: AuditResult) -> list[str]:
    seen: dict[str, None] = dict.fromkeys(result.models)
    seen.update(dict.fromkeys(f.model for f in result.findings))
    return list(seen)
