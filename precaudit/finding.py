"""A finding: what a rule says about one site, in the words and numbers a report prints."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, fields, replace
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

__all__ = ["RECORDED", "SEVERITIES", "Finding", "measured_on", "model_key", "severity_rank"]

SEVERITIES = ("error", "warning", "info")
# The message of the related location an ONNX node's recorded Python line is (the dynamo exporter's stack trace)
RECORDED = "the Python line the exporter recorded for this node"


def severity_rank(severity: str) -> int:
    """Higher is worse: error 3, warning 2, info 1."""
    return {"error": 3, "warning": 2, "info": 1}.get(severity, 0)


def model_key(path: str) -> str:
    """The model's path relative to its repository (found from the file, not the working directory).

    So a baseline written from the repo root still matches when CI runs from a subfolder; outside any
    repository the file name stands in.
    """
    return _key_of_resolved(_resolved(os.getcwd(), path))  # resolved first: a relative path means another file


@lru_cache(maxsize=256)
def _resolved(cwd: str, path: str) -> Path:
    """Path(path).resolve() from cwd, once per run and model (every finding's fingerprint asks)."""
    return (Path(cwd) / path).resolve()


@cache
def _key_of_resolved(resolved: Path) -> str:
    for folder in resolved.parents:
        if (folder / ".git").exists():
            return resolved.relative_to(folder).as_posix()
    return resolved.name


@dataclass(frozen=True)
class Finding:
    """One rule firing at one site (frozen: a report, a baseline and the Python API share them).

    Names, paths and messages are raw, as the model spells them (JSON and SARIF carry them so); a report for
    people prints report.locations.shown(finding), the copy with every string escaped by escape.printable.
    """

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
    # other places that explain this one: [{"file", "line", "message"}], e.g. the user's call into a library module
    related_locations: list[dict[str, Any]] = field(default_factory=list)
    # traced findings: what the run measured them on, "user" (the --inputs files) or "synthesized"; None: static
    inputs: str | None = None

    @property
    def fingerprint(self) -> str:
        """Stable across re-exports: rule, model path and where (scope or node name), never a node index.

        Names are hashed as the model spells them, raw: surrogatepass lets a lone surrogate (a path with bytes that
        are not UTF-8) hash too, and changes no other string's bytes.
        """
        where = self.scope or self.node_name
        key = "|".join([self.rule_id, model_key(self.model), where, str(self.values.get("eps"))])
        return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """The fields in order (as dataclasses.asdict gives them), then the fingerprint.

        Built by hand: asdict deep-copies every value through a generic walk, a tenth of a second per thousand
        findings; the values here are plain (scalars, strings, lists of strings, dicts of scalars).
        """
        data = {}
        for name in _FIELDS:
            value = getattr(self, name)
            if name == "values":
                value = dict(value)
            elif name == "references":
                value = list(value)
            elif name == "related_locations":
                value = [dict(location) for location in value]
            data[name] = value
        data["fingerprint"] = self.fingerprint
        return data


_FIELDS = tuple(f.name for f in fields(Finding))


_SYNTHESIZED_NOTE = " [on synthesized inputs only: a warning until your own --inputs show it]"


def measured_on(finding: Finding, source: str | None) -> Finding:
    """A traced finding says what it was measured on; one that rests on synthesized inputs alone is at most a
    warning (they have no real ranges, ids, masks or lengths: an error there may be of their making)."""
    if source == "synthesized" and finding.severity == "error":
        return replace(finding, inputs=source, severity="warning", message=finding.message + _SYNTHESIZED_NOTE)
    return replace(finding, inputs=source)
