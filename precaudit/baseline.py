"""Baselines: the findings a project has accepted, keyed by fingerprint, so CI fails only on new ones."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field, fields

from .errors import InputError
from .files import MiB, read_text, write_new
from .finding import Finding
from .version import __version__

__all__ = ["BaselineEntry", "BaselineMatch", "apply_baseline", "read_baseline", "write_baseline"]

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
    def of(cls, f: Finding) -> BaselineEntry:
        return cls(f.fingerprint, f.rule_id, f.model.replace("\\", "/"), f.node_name, f.message)


@dataclass
class BaselineMatch:
    """The findings a baseline does not cover, how many it covered, and its entries nothing matched any more."""

    file: str
    new: list[Finding]
    matched: int = 0
    stale: list[BaselineEntry] = field(default_factory=list)


def write_baseline(path: str, findings: list[Finding], may_replace: tuple[str, ...] = ()) -> None:
    """Write every finding as accepted, sorted so the file diffs cleanly in review."""
    entries = sorted((BaselineEntry.of(f) for f in findings), key=lambda e: (e.model, e.rule_id, e.node_name, e.fingerprint))
    from .escape import encodable

    # a name from a file system that is not UTF-8 holds lone surrogates, which json.dumps writes as \udcxx escapes
    # strict parsers reject: written as visible text instead (the fingerprint, which matching uses, is ASCII)
    doc = {"format": _FORMAT, "tool_version": __version__,
           "findings": [{k: encodable(v) for k, v in vars(e).items()} for e in entries]}
    # Refreshing the baseline in place is allowed (the CLI passes it as may_replace); any other input is not.
    write_new(path, json.dumps(doc, indent=2) + "\n", may_replace, what="the baseline")


# 64 MiB: about 230,000 findings, which parse into some 4x their size (measured: 265 MB for a 76 MB file)
_MAX_BASELINE_BYTES = 64 * MiB
# A finding takes some 300 bytes and one {}; a file of bare [] or {} would parse into 27x its size (an empty list or
# dict is 56-64 bytes of Python for 3 of JSON): refused before parsing
_MAX_BRACKET_DENSITY = 16  # at most one bracket per this many bytes


def _small_int(path: str, digits: str) -> int:
    """A baseline holds strings only; an integer is refused before Python converts it (a 5,000-digit one passes
    the interpreter's digit limit and raised ValueError), but read when short, so the error below names the key."""
    if len(digits) > 20:
        raise InputError(path, f"not a precaudit baseline: an integer of {len(digits)} digits")
    return int(digits)


def read_baseline(path: str) -> list[BaselineEntry]:
    if not os.path.lexists(path):
        raise InputError(path, "no such baseline file (create it with --write-baseline)")
    text = read_text(path, _MAX_BASELINE_BYTES, what="the baseline")
    brackets = text.count("[") + text.count("{")
    if brackets > 16 + len(text) // _MAX_BRACKET_DENSITY:
        raise InputError(path, f"not a precaudit baseline: {brackets} brackets in {len(text)} characters (a finding "
                               f"is some 300 characters with one)")
    try:
        doc = json.loads(text, parse_int=lambda digits: _small_int(path, digits))
    except json.JSONDecodeError as exc:
        raise InputError(path, f"not a precaudit baseline: invalid JSON: {exc.msg}", exc.lineno) from None
    except RecursionError:
        raise InputError(path, "not a precaudit baseline: JSON nested too deep") from None
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT or not isinstance(doc.get("findings"), list):
        raise InputError(path, f"not a precaudit baseline (expected \"format\": \"{_FORMAT}\" and a \"findings\" list)")
    keys = {f.name for f in fields(BaselineEntry)}
    for i, entry in enumerate(doc["findings"]):
        if not isinstance(entry, dict) or set(entry) != keys or not all(isinstance(v, str) for v in entry.values()):
            raise InputError(path, f"not a precaudit baseline: finding {i} needs exactly the strings "
                                   f"{', '.join(sorted(keys))}")
    return [BaselineEntry(**entry) for entry in doc["findings"]]


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
    from .escape import encodable

    audited = {encodable(m.replace("\\", "/")) for m in audited_models}  # as written, surrogates visible
    for entry in entries:
        if budget[entry.fingerprint] > 0 and encodable(entry.model) in audited:
            budget[entry.fingerprint] -= 1
            match.stale.append(entry)
    return match
