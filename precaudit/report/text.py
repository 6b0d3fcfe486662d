"""Readable text: findings by model, alike findings in one block, each with its location, numbers and fix."""

from __future__ import annotations

from collections import Counter

from ..escape import printable
from ..finding import SEVERITIES, Finding
from ..result import AuditResult
from .folding import fold_names, fold_set, fold_texts, shape_of
from .locations import node_phrase, recorded, shown
from .outcome import Outcome

__all__ = ["group_findings", "render_concise", "render_statistics", "render_text", "summary_line"]

_COLORS = {"error": "31", "warning": "33", "info": "36"}


def render_text(outcome: Outcome, color: bool = False, group: bool = True) -> str:
    """The report a person reads in a terminal or a CI log; alike findings share one block unless group=False.

    Every string from a model or a path is escaped (escape.printable) before it is painted or joined, so each
    line below is one line, and the only escape sequences are the colors painted here.
    """
    def paint(text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if color else text

    result = outcome.result
    lines: list[str] = []
    blocks = 0
    for model in _models_in_order(result):
        findings = [shown(f) for f in result.findings if f.model == model]
        if not findings:
            continue
        lines.append(paint(printable(model), "1") + f"  ({_run_flags(outcome.settings)})")
        groups = group_findings(findings) if group else [[f] for f in findings]
        blocks += len(groups)
        for members in groups:
            first = members[0]
            head = f"  {paint(f'{first.severity:<8}', _COLORS[first.severity])}{first.rule_id} {first.rule_name}  "
            lines.extend(_block(members, head))
        lines.append("")
    lines.extend(_trace_lines(result))
    if isinstance(outcome.settings.get("checked"), dict):  # precaudit train: what was checked, clean or not
        lines.append(printable(f"checked: {outcome.settings['checked']['text']}"))
    lines.append(summary_line(result))
    if blocks < len(result.findings):
        lines.append(f"{_count(len(result.findings), 'finding')} shown in {_count(blocks, 'block')} of alike "
                     "findings; --no-group or --format concise lists each one.")
    lines.extend(_hidden_lines(outcome))
    return "\n".join(lines) + "\n"


def group_findings(findings: list[Finding]) -> list[list[Finding]]:
    """Findings that say the same thing about different nodes, in order of their first member.

    Alike: same model, rule, severity, compute dtype and eps, and a message, reason and fix that differ only in
    the indices inside names (block.3 for block.4) and, in the message, in measured numbers. Pass the escaped
    copies (locations.shown): their folded names are printed as they are.
    """
    groups: dict[tuple, list[Finding]] = {}
    for f in findings:
        key = (f.model, f.rule_id, f.severity, f.values.get("compute_dtype"), repr(f.values.get("eps")),
               shape_of(f.message), shape_of(f.values.get("compute_reason") or "", quantities=False),
               shape_of(f.fix, quantities=False))
        groups.setdefault(key, []).append(f)
    return list(groups.values())


def _block(members: list[Finding], head: str) -> list[str]:
    """One finding as four lines; several alike ones as the same four lines with their names folded."""
    first = members[0]
    if len(members) == 1:
        where = node_phrase(first)
        message, reason, fix = first.message, first.values.get("compute_reason"), first.fix
    else:
        where = f"×{len(members)}  " + _nodes_phrase(members)
        message, fix = fold_texts([f.message for f in members]), fold_texts([f.fix for f in members])
        reason = first.values.get("compute_reason") and fold_texts([f.values["compute_reason"] for f in members])
    sources = _sources_phrase(members)
    measured = f"  [traced on {first.inputs} inputs]" if first.inputs else ""
    lines = [head + (f"{sources}  " if sources else "") + where + _recorded_phrase(members) + measured,
             f"          {message}"]
    if reason:
        lines.append(f"          why {first.values['compute_dtype']}: {reason}")
    lines.append(f"          fix: {fix}")
    return lines


def _nodes_phrase(members: list[Finding]) -> str:
    """nodes '/block.{0..23}/Add' (Add) in block.{0..23}: every name, folded."""
    names = ", ".join(f"'{n}'" for n in fold_names(f.node_name for f in members))
    ops = ", ".join(dict.fromkeys(f.op_type for f in members))
    scopes = fold_names(f.scope for f in members if f.scope)
    return f"nodes {names} ({ops})" + (f" in {', '.join(scopes)}" if scopes else "")


def _sources_phrase(members: list[Finding]) -> str:
    """The Python lines the findings come from: hazards.py:19, or hazards.py:{19,27} for a group."""
    lines: dict[str, list[str]] = {}
    for f in members:
        if f.source_file:
            lines.setdefault(f.source_file, []).append(str(f.source_line))
    return ", ".join(f"{file}:{fold_set(numbers)}" for file, numbers in lines.items())


def _recorded_phrase(members: list[Finding]) -> str:
    """', recorded at model.py:{9,12}': the Python lines an exporter recorded for the nodes of an ONNX model."""
    lines: dict[str, list[str]] = {}
    for f in members:
        for file, line in recorded(f):
            lines.setdefault(file, []).append(str(line))
    return "".join(f", recorded at {file}:{fold_set(numbers)}" for file, numbers in lines.items())


def render_concise(outcome: Outcome) -> str:
    """--format concise: one line per finding (as Ruff's concise output), then the summary.

    The location comes first: the Python file and line of a PyTorch model, else the model and the node (and at the
    end the line an exporter recorded for it).
    """
    lines = []
    for f in map(shown, outcome.result.findings):
        where = f"{f.source_file}:{f.source_line}" if f.source_file else f"{f.model}:{f.node_name}"
        note = "".join(f" (recorded at {file}:{line})" for file, line in recorded(f))
        lines.append(f"{where}: {f.rule_id} [{f.severity}] {f.message}{note}")
    return "\n".join([*lines, *_trace_lines(outcome.result), summary_line(outcome.result),
                      *_hidden_lines(outcome)]) + "\n"


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
    named = f" ({printable(result.models[0])})" if n_models == 1 else ""
    text = (f"Found {total} finding{'s' * (total != 1)} in {n_models} model{'s' * (n_models != 1)}{named}: "
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
    """What each traced run was fed and what ran it: traced findings hold for these inputs only. And which models
    are quantized, and what of them the audit judges."""
    # the model's path, the inputs files' paths and the model's input names
    lines = [printable(f"{model}: {q.describe()}") for model, q in result.quantized.items()]
    for model, run in result.traces.items():
        lines.append(printable(f"traced {model}: {run.describe()}"))
        if run.synthesized:
            lines.append("  these inputs are synthesized, not your data: each traced finding above holds for them "
                         "only (no silence, padding or real ranges); give yours with --inputs FILE.npz")
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _models_in_order(result: AuditResult) -> list[str]:
    seen: dict[str, None] = dict.fromkeys(result.models)
    seen.update(dict.fromkeys(f.model for f in result.findings))
    return list(seen)


def _run_flags(settings: dict) -> str:
    """The flags that decide which dtype applies where: the target, and how the model is converted or run."""
    flags = [f"--dtype {settings['dtype']}"]
    if settings.get("autocast"):
        flags.append(f"--autocast {settings['autocast']}")
    if settings.get("converter") not in (None, "plain"):
        flags.append(f"--converter {settings['converter']}")
    if settings.get("runtime"):
        flags.append(f"--runtime {settings['runtime']}")
    return " ".join(flags)
