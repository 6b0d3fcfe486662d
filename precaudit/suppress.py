"""Inline suppressions: `# precaudit: ignore[PA201]` (or a bare `ignore`) on the Python line a finding points at."""

from __future__ import annotations

import linecache
import re

from .finding import Finding

__all__ = ["drop_suppressed"]

_COMMENT = re.compile(r"#\s*precaudit:\s*ignore(?:\[(?P<rules>[^\]]*)\])?")


def drop_suppressed(findings: list[Finding]) -> list[Finding]:
    """The findings whose source line does not silence them, by rule id or name."""
    return [f for f in findings if not _silenced(f)]


def _silenced(finding: Finding) -> bool:
    if not finding.source_file or not finding.source_line:
        return False
    match = _COMMENT.search(linecache.getline(finding.source_file, finding.source_line))
    if match is None:
        return False
    rules = match.group("rules")
    if rules is None:
        return True
    named = {r.strip() for r in rules.split(",")}
    return finding.rule_id in named or finding.rule_name in named
