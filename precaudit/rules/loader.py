"""Load rule YAML files safely, validate them, and merge a user's overrides onto the built-in rules."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..analysis.pattern import OpP, PatternError, compile_pattern, pattern_names, root_ops
from ..analysis.sites import FACT_NAMES, PATTERN_FACTS
from ..errors import InputError
from ..finding import SEVERITIES
from .condition import Condition, ConditionError, parse_condition, template_names

__all__ = ["Rule", "load_rules", "builtin_rules_dir"]

_ID = re.compile(r"^[A-Z]{2,}[0-9]{3}$")
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_REQUIRED = ("id", "name", "severity", "summary", "condition", "message", "fix")
_OPTIONAL = ("sites", "pattern", "description", "ops", "params", "references", "example", "preview")
# What a user file may say about a built-in rule it overrides (same id, no name).
_OVERRIDABLE = ("severity", "params", "preview", "message", "fix", "condition", "ops", "references")
# (a user's override may not change sites or pattern: what a rule looks at is part of its identity)


@dataclass
class Rule:
    """One validated rule, ready to run against sites."""

    id: str
    name: str
    severity: str
    summary: str
    sites: list[str]
    condition: Condition
    message: str
    fix: str
    description: str = ""
    ops: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    references: list[str] = field(default_factory=list)
    example: str = ""
    preview: bool = False
    source: str = ""  # the file the rule (or its last override) came from
    pattern: OpP | None = None  # an op pattern that makes the rule's own sites, instead of site kinds


def builtin_rules_dir() -> Path:
    """The shipped rules: inside the wheel, or at the top of a source checkout."""
    packaged = Path(__file__).resolve().parent.parent / "_rules"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parent.parent.parent / "rules"


def load_rules(extra: list[str] | tuple[str, ...] = ()) -> list[Rule]:
    """The built-in rules, then each of the user's rule files or folders in order; sorted by id."""
    raw: dict[str, tuple[dict, Path, dict]] = {}
    for path in _rule_files(builtin_rules_dir()):
        data, lines = _read(path)
        _add(raw, data, path, lines, allow_override=False)
    for item in extra:
        p = Path(item)
        if not p.exists():
            raise InputError(item, "no such rule file or folder")
        for path in _rule_files(p):
            data, lines = _read(path)
            _add(raw, data, path, lines, allow_override=True)
    rules = [_build(data, path, lines) for data, path, lines in raw.values()]
    names: dict[str, Rule] = {}
    for rule in rules:
        if rule.name in names and names[rule.name].id != rule.id:
            raise InputError(rule.source, f"rule name '{rule.name}' is already used by {names[rule.name].id}")
        names[rule.name] = rule
    return sorted(rules, key=lambda r: r.id)


def _rule_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted([*path.glob("*.yaml"), *path.glob("*.yml")])


def _read(path: Path) -> tuple[dict, dict[str, int]]:
    """The YAML mapping and the line of each top-level key (for errors)."""
    try:
        text = path.read_text(encoding="utf-8")
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(str(path), f"invalid YAML: {problem}", mark.line + 1 if mark else None) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(str(path), f"cannot read rule file: {exc}") from None
    if not isinstance(data, dict) or not isinstance(node, yaml.MappingNode):
        raise InputError(str(path), "a rule file must hold one YAML mapping (id, name, severity, ...)", 1)
    lines = {k.value: k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}
    return data, lines


def _add(raw: dict, data: dict, path: Path, lines: dict[str, int], allow_override: bool) -> None:
    rule_id = data.get("id")
    if not isinstance(rule_id, str) or not _ID.match(rule_id):
        raise InputError(str(path), f"'id' must look like PA101 (capital letters then three digits), got {rule_id!r}",
                         lines.get("id", 1))
    if rule_id not in raw:
        raw[rule_id] = (data, path, lines)
        return
    base, base_path, _ = raw[rule_id]
    if not allow_override or "name" in data and data["name"] != base.get("name"):
        raise InputError(str(path), f"rule id {rule_id} is already defined in {base_path}", lines.get("id", 1))
    for key in data:
        if key not in ("id", "name", *_OVERRIDABLE):
            raise InputError(str(path), f"an override of {rule_id} may not change '{key}'; "
                             f"it may set {', '.join(_OVERRIDABLE)}", lines.get(key, 1))
    merged = {**base, **{k: v for k, v in data.items() if k != "params"}}
    merged["params"] = {**(base.get("params") or {}), **(data.get("params") or {})}
    raw[rule_id] = (merged, path, {**{k: 1 for k in merged}, **lines})


def _build(data: dict, path: Path, lines: dict[str, int]) -> Rule:
    def fail(key: str, problem: str) -> InputError:
        return InputError(str(path), f"rule {data.get('id')}: {problem}", lines.get(key, 1))

    for key in _REQUIRED:
        if key not in data:
            raise fail("id", f"missing required key '{key}'")
    for key in data:
        if key not in _REQUIRED and key not in _OPTIONAL:
            raise fail(key, f"unknown key '{key}' (allowed: {', '.join(_REQUIRED + _OPTIONAL)})")
    if not isinstance(data["name"], str) or not _NAME.match(data["name"]):
        raise fail("name", f"'name' must be kebab-case, like eps-underflow; got {data['name']!r}")
    if data["severity"] not in SEVERITIES:
        raise fail("severity", f"'severity' must be one of {', '.join(SEVERITIES)}; got {data['severity']!r}")
    if ("sites" in data) == ("pattern" in data):
        raise fail("id", "a rule needs exactly one of 'sites' (site kinds) or 'pattern' (an op pattern)")
    params = data.get("params") or {}
    if not isinstance(params, dict) or not all(isinstance(v, (int, float, str, bool)) for v in params.values()):
        raise fail("params", "'params' must map names to numbers, strings or booleans")
    pattern = None
    if "pattern" in data:
        try:
            pattern = compile_pattern(data["pattern"])
            root_ops(pattern)
        except PatternError as exc:
            raise fail("pattern", str(exc)) from None
        sites = ["pattern"]
        known = PATTERN_FACTS | pattern_names(pattern) | set(params)
    else:
        sites = data["sites"] if isinstance(data["sites"], list) else [data["sites"]]
        unknown = [s for s in sites if s not in FACT_NAMES]
        if unknown or not sites:
            raise fail("sites", f"unknown site kind {unknown[0] if unknown else '(none)'}; "
                                f"choose from {', '.join(sorted(FACT_NAMES))}")
        known = set.intersection(*(FACT_NAMES[s] for s in sites)) | set(params)
    try:
        condition = parse_condition(data["condition"])
    except ConditionError as exc:
        raise fail("condition", str(exc)) from None
    for key, names in (("condition", condition.names), ("message", _template(data, "message", fail)),
                       ("fix", _template(data, "fix", fail))):
        missing = sorted(names - known)
        if missing:
            raise fail(key, f"unknown name '{missing[0]}' in {key}; sites {', '.join(sites)} offer: {', '.join(sorted(known))}")
    return Rule(id=data["id"], name=data["name"], severity=data["severity"], summary=str(data["summary"]).strip(),
                sites=sites, condition=condition, message=str(data["message"]).strip(), fix=str(data["fix"]).strip(),
                description=str(data.get("description") or "").strip(), ops=list(data.get("ops") or []),
                params=params, references=list(data.get("references") or []),
                example=str(data.get("example") or "").strip(), preview=bool(data.get("preview", False)),
                source=str(path), pattern=pattern)


def _template(data: dict, key: str, fail) -> set[str]:
    if not isinstance(data[key], str):
        raise fail(key, f"'{key}' must be a string")
    return template_names(data[key])
