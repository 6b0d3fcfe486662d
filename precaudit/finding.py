"""A finding: what a rule says about one site, in the words and numbers a report prints."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Finding", "SEVERITIES", "severity_rank"]

SEVERITIES = ("error", "warning", "info")


def severity_rank(severity: str) -> int:
    """Higher is worse: error 3, warning 2, info 1."""
    return {"error": 3, "warning": 2, "info": 1}.get(severity, 0)


@dataclass
class Finding:
    """One rule firing at one site."""

    rule_id: str
    rule_name: str
    severity: str
    message: str
    fix: str
    model: str
    node_name: str
    op_type: str
    scope: str | None = None
    source_file: str | None = None
    source_line: int | None = None
    values: dict[str, Any] = field(default_factory=dict)  # eps, eps_rounded, compute_dtype, compute_reason, ...
    references: list[str] = field(default_factory=list)

    @property
    def fingerprint(self) -> str:
        """Stable across re-exports: rule, model path and where (scope or node name), never a node index."""
        where = self.scope or self.node_name
        key = "|".join([self.rule_id, self.model.replace("\\", "/"), where, str(self.values.get("eps"))])
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["fingerprint"] = self.fingerprint
        return data
