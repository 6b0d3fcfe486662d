"""Inline suppressions: `# precaudit: ignore[PA201]` (or a bare `ignore`) on the Python line a finding points at, or,
for an exported ONNX model, on the line the exporter recorded for its node (shown as related when it is here)."""

from __future__ import annotations

import linecache
import os
import re

from .finding import RECORDED, Finding

__all__ = ["drop_suppressed"]

_COMMENT = re.compile(r"#\s*precaudit:\s*ignore(?:\[(?P<rules>[^\]]*)\])?")


def drop_suppressed(findings: list[Finding]) -> list[Finding]:
    """The findings whose source line does not silence them, by rule id or name."""
    return [f for f in findings if not _silenced(f)]


def _silenced(finding: Finding) -> bool:
    lines = [(finding.source_file, finding.source_line)]
    lines += [(loc["file"], loc["line"]) for loc in finding.related_locations if loc["message"] == RECORDED]
    return any(_silenced_at(finding, file, line) for file, line in lines if file and line)


def _silenced_at(finding: Finding, file: str, line: int) -> bool:
    # absolute: linecache keeps a file's lines by the name asked for, and a relative name means another file in
    # another working directory; checked: a notebook's next audit reads the comment just added (the API's caller may
    # chdir or edit between audits)
    path = os.path.abspath(file)
    linecache.checkcache(path)
    match = _COMMENT.search(linecache.getline(path, line))
    if match is None:
        return False
    rules = match.group("rules")
    if rules is None:
        return True
    named = {r.strip() for r in rules.split(",")}
    return finding.rule_id in named or finding.rule_name in named
