"""What `precaudit test` prints: a line per rule (ok, or FAIL with its problems indented under it) and a summary, or
the same as JSON. Problems quote node names and paths from a stranger's model and rule files: each text line is
escaped for the terminal and a CI log."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..escape import log_line, printable

if TYPE_CHECKING:
    from .run import RuleResult

__all__ = ["render_json", "render_rule_text", "render_summary"]


def render_rule_text(result: RuleResult) -> str:
    """ok PA101 eps-underflow (54 examples), or FAIL and each problem indented under it."""
    head = f"{'ok' if result.ok else 'FAIL'} {result.rule.id} {result.rule.name} ({_count(result.examples, 'example')})"
    return "".join(log_line(printable(line)) + "\n" for line in [head, *(f"  {p}" for p in result.problems)])


def render_summary(results: list[RuleResult]) -> str:
    failed = sum(not result.ok for result in results)
    examples = sum(result.examples for result in results)
    return f"{_count(len(results), 'rule')}, {_count(examples, 'example')}: {len(results) - failed} ok, {failed} failed\n"


def render_json(results: list[RuleResult]) -> str:
    failed = sum(not result.ok for result in results)
    return json.dumps({
        "rules": [{"id": r.rule.id, "name": r.rule.name, "source": r.rule.source, "ok": r.ok, "examples": r.examples,
                   "problems": r.problems} for r in results],
        "summary": {"rules": len(results), "examples": sum(r.examples for r in results),
                    "ok": len(results) - failed, "failed": failed},
    }, indent=2) + "\n"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"
