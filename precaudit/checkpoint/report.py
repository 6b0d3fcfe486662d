"""A scan's result, and how it reads as text and JSON (SARIF: sarif.py).

JSON carries names raw, as the checkpoint spells them (json.dumps escapes control characters; precaudit's
strict_json the lone surrogates strict parsers refuse); the text report escapes every name, path and message with
escape.printable, since a tensor name from a stranger's header can hold a newline or a terminal escape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..collector import collector_paused
from ..escape import printable
from ..version import __version__
from .findings import RULES, ScaleFinding, ScaleTensor

__all__ = ["SCHEMA_VERSION", "ScanReport"]

SCHEMA_VERSION = "1.0"
TEXT_FINDINGS_PER_RULE = 20  # the text report's lines per check; JSON and SARIF carry every finding
TEXT_TABLE_ROWS = 40
_RANK = {"error": 0, "warning": 1}


@dataclass
class ScanReport:
    """One checkpoint scanned: its scale tensors' counts, the findings, and the bytes it took."""

    checkpoint: str
    files: list[tuple[str, int]]
    config_file: str | None
    index: str | None
    method: str | None
    layouts: list[dict[str, Any]]
    tensors: list[ScaleTensor]
    findings: list[ScaleFinding]
    notes: list[str] = field(default_factory=list)
    bytes_read: int = 0
    bytes_total: int = 0
    seconds: float = 0.0

    def __post_init__(self) -> None:
        self.findings = sorted(self.findings, key=lambda f: (_RANK.get(f.severity, 2), f.rule, f.file, f.tensor))

    @property
    def errors(self) -> list[ScaleFinding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[ScaleFinding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def exit_code(self) -> int:
        """1 when any finding is an error, else 0 (bad input never makes a report: it raises InputError)."""
        return 1 if self.errors else 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "precaudit", "version": __version__},
            "checkpoint": self.checkpoint,
            "files": [{"path": p, "size": s} for p, s in self.files],
            "index": self.index,
            "config": {"file": self.config_file, "quant_method": self.method} if self.config_file else None,
            "layouts": self.layouts,
            "tensors": [t.to_dict() for t in self.tensors],
            "findings": [f.to_dict() for f in self.findings],
            "notes": self.notes,
            "summary": {"scale_tensors": len(self.tensors), "errors": len(self.errors),
                        "warnings": len(self.warnings), "bytes_read": self.bytes_read,
                        "bytes_total": self.bytes_total, "seconds": round(self.seconds, 3),
                        "exit_code": self.exit_code},
        }

    def to_json(self) -> str:
        """The report as JSON: the document indented, each tensor and finding on a line of its own (a checkpoint
        may have 100,000 scale tensors: readable with grep, and written by json's C encoder)."""
        from ..escape import strict_json  # precaudit's own: inf and nan as strings, no lone surrogate

        with collector_paused():
            return _json_text(strict_json(self.to_dict()))

    def to_sarif(self) -> str:
        from .sarif import render_sarif

        with collector_paused():
            return render_sarif(self)

    def to_text(self) -> str:
        return "\n".join(_text_lines(self)) + "\n"


def _json_text(document: dict[str, Any]) -> str:
    parts = []
    for key, value in document.items():
        if isinstance(value, list) and value:
            items = ",\n".join("    " + json.dumps(v, allow_nan=False) for v in value)
            parts.append(f"  {json.dumps(key)}: [\n{items}\n  ]")
        else:
            parts.append(f"  {json.dumps(key)}: {json.dumps(value, allow_nan=False)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _text_lines(report: ScanReport) -> list[str]:
    files = len(report.files)
    config = f"; quantization config: {printable(report.config_file)} ({printable(report.method or '?')})" \
        if report.config_file else "; no quantization config"
    lines = [f"{printable(report.checkpoint)}  ({files} file{'s' * (files != 1)}, {_size(report.bytes_total)}"
             f"{config})"]
    for entry in report.layouts:
        lines.append(f"  layout {entry['layout']}: {entry['weights']:,} weight{'s' * (entry['weights'] != 1)} "
                     f"({entry['evidence']})")
    if not report.layouts:
        lines.append("  no quantized layout recognised")
    lines.extend(f"  note: {printable(n)}" for n in report.notes)
    lines.extend(_finding_lines(report.findings))
    lines.extend(_table_lines(report.tensors))
    share = 100 * report.bytes_read / report.bytes_total if report.bytes_total else 0.0
    lines.append(f"  read {report.bytes_read:,} of {report.bytes_total:,} bytes ({share:.3g}%) in "
                 f"{report.seconds:.2f} s: {len(report.tensors):,} scale tensors")
    errors, warnings = len(report.errors), len(report.warnings)
    lines.append(f"  {errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}")
    return lines


def _finding_lines(findings: list[ScaleFinding]) -> list[str]:
    lines: list[str] = []
    shown: dict[str, int] = {}
    for f in findings:
        shown[f.rule] = shown.get(f.rule, 0) + 1
        if shown[f.rule] > TEXT_FINDINGS_PER_RULE:
            continue
        file = printable(f.file.rsplit("/", 1)[-1])
        lines.append(f"  {f.severity:<7} {f.rule} {RULES[f.rule][0]}  {printable(f.tensor)}  ({file})")
        lines.append(f"          {printable(f.message)}")
    for rule, n in shown.items():
        if n > TEXT_FINDINGS_PER_RULE:
            lines.append(f"  ... and {n - TEXT_FINDINGS_PER_RULE:,} more {rule} {RULES[rule][0]} findings "
                         "(--format json lists every one)")
    return lines


def _table_lines(tensors: list[ScaleTensor]) -> list[str]:
    """The scale tensors with any NaN, inf, zero, subnormal or negative entry, with their exact counts."""
    rows = [t for t in tensors if t.counts and any(getattr(t.counts, k) for k in t.counts.KINDS)]
    if not rows:
        return []
    width = min(max(len(printable(t.tensor.name)) for t in rows), 70)
    lines = ["  scale tensors with NaN, inf, zero, subnormal or negative entries:",
             f"    {'tensor':<{width}}  {'read as':<8} {'entries':>11} {'nan':>7} {'inf':>7} {'zero':>9} "
             f"{'subnormal':>9} {'negative':>8}"]
    for t in rows[:TEXT_TABLE_ROWS]:
        c = t.counts
        assert c is not None
        lines.append(f"    {printable(t.tensor.name):<{width}}  {t.decode:<8} {c.count:>11,} {c.nan:>7,} {c.inf:>7,} "
                     f"{c.zero:>9,} {c.subnormal:>9,} {c.negative:>8,}")
    if len(rows) > TEXT_TABLE_ROWS:
        lines.append(f"    ... and {len(rows) - TEXT_TABLE_ROWS:,} more (--format json lists every scale tensor)")
    return lines
