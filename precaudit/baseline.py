"""Baselines: the findings a project has accepted, keyed by fingerprint, so CI fails only on new ones."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__
from .errors import InputError
from .finding import Finding

__all__ = ["BaselineEntry", "BaselineMatch", "write_baseline", "read_baseline", "apply_baseline"]

_FORMAT = "precaudit-baseline/1"


@dataclass(frozen=True)
class BaselineEntry:
    """One accepted finding; everything but the fingerprint is there for the person reading the file."""

    fingerprint: str
    rule_id: str
    model: str
    node_name: str
    message: str

    @classmethod
    def of(cls, f: Finding) -> "BaselineEntry":
        return cls(f.fingerprint, f.rule_id, f.model.replace("\\", "/"), f.node_name, f.message)


@dataclass
class BaselineMatch:
    """The findings a baseline does not cover, how many it covered, and its entries nothing matched any more."""

    file: str
    new: list[Finding]
    matched: int = 0
    stale: list[BaselineEntry] = field(default_factory=list)


def write_baseline(path: str, findings: list[Finding]) -> None:
    """Write every finding as accepted, sorted so the file diffs cleanly in review."""
    entries = sorted((BaselineEntry.of(f) for f in findings), key=lambda e: (e.model, e.rule_id, e.node_name, e.fingerprint))
    doc = {"format": _FORMAT, "tool_version": __version__, "findings": [vars(e) for e in entries]}
    try:
        Path(path).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise InputError(path, f"cannot write the baseline: {exc.strerror or exc}") from None


def read_baseline(path: str) -> list[BaselineEntry]:
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(path, "no such baseline file (create it with --write-baseline)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, f"cannot read the baseline: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(path, f"not a precaudit baseline: invalid JSON: {exc.msg}", exc.lineno) from None
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT or not isinstance(doc.get("findings"), list):
        raise InputError(path, f"not a precaudit baseline (expected \"format\": \"{_FORMAT}\" and a \"findings\" list)")
    try:
        return [BaselineEntry(**entry) for entry in doc["findings"]]
    except TypeError:
        raise InputError(path, "not a precaudit baseline: each finding needs fingerprint, rule_id, model, "
                               "node_name and message") from None


def apply_baseline(path: str, findings: list[Finding], audited_models: list[str]) -> BaselineMatch:
    """Each entry covers one finding with its fingerprint; entries for models audited now that matched nothing are stale."""
    entries = read_baseline(path)
    budget = Counter(e.fingerprint for e in entries)
    match = BaselineMatch(file=path, new=[])
    for f in findings:
        if budget[f.fingerprint] > 0:
            budget[f.fingerprint] -= 1
            match.matched += 1
        else:
            match.new.append(f)
    # A pre-commit run audits only the changed models: entries for the others are not stale, just not looked at.
    audited = {m.replace("\\", "/") for m in audited_models}
    for entry in entries:
        if budget[entry.fingerprint] > 0 and entry.model in audited:
            budget[entry.fingerprint] -= 1
            match.stale.append(entry)
    return match
