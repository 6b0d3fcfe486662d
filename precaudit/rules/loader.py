"""Load rule YAML files safely, validate them, and merge a user's overrides onto the built-in rules.

A rule file passed with --rules (or named in the pyproject) may come from a pull request, so it is read like
code from a stranger: only regular UTF-8 files of at most RULE_FILE_LIMIT bytes (precaudit.files), at most
MAX_RULE_FILES files and MAX_RULE_BYTES bytes in all; YAML without aliases or anchors, nested at most
MAX_YAML_DEPTH deep, with at most MAX_YAML_VALUES values and no number longer than MAX_NUMBER_CHARS; every key
of the type it must have; a pattern at most MAX_PATTERN_DEPTH deep with at most MAX_PATTERN_PARTS parts. The
condition language bounds itself (condition.py), and so do message templates (template.py). Whatever is wrong is
one InputError naming the file and line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..analysis.pattern import OpP, PatternError, compile_pattern, pattern_names, root_ops
from ..analysis.sites.base import FACT_NAMES, PATTERN_FACTS
from ..errors import InputError
from ..files import MiB, read_text
from ..finding import SEVERITIES
from .condition import Condition, ConditionError, kind_of, parse_condition
from .template import check_template

__all__ = [
    "MAX_NUMBER_CHARS",
    "MAX_PARAM_CHARS",
    "MAX_PATTERN_DEPTH",
    "MAX_PATTERN_PARTS",
    "MAX_RULE_BYTES",
    "MAX_RULE_FILES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_VALUES",
    "RULE_FILE_LIMIT",
    "Rule",
    "builtin_rules_dir",
    "load_rules",
]

RULE_FILE_LIMIT = 1 * MiB   # one rule file (the shipped ones are at most 2 KiB)
MAX_RULE_FILES = 500        # rule files from --rules and the pyproject, in all
MAX_RULE_BYTES = 8 * MiB    # and their bytes together (PyYAML takes 0.5 to 2 s per MiB)
MAX_YAML_DEPTH = 64         # nesting of YAML mappings and lists (a shipped rule reaches 11)
MAX_YAML_VALUES = 5000      # scalars, mappings and lists in one file (a shipped rule has at most 70)
MAX_NUMBER_CHARS = 100      # characters of one YAML int or float
MAX_PATTERN_DEPTH = 10      # levels of an op pattern (the shipped ones reach 6); matching may cost 2**depth
MAX_PATTERN_PARTS = 100     # patterns inside one rule's pattern (the shipped ones have at most 13)
MAX_PARAM_CHARS = 1000      # a string param (a message may print it many times)
_PARAM_INT = 1 << 63        # an int param is a 64-bit integer; write a float for anything larger

_ID = re.compile(r"^[A-Z]{2,}[0-9]{3}\Z")  # \Z: $ would accept "PA999\n"
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*\Z")
_REQUIRED = ("id", "name", "severity", "summary", "condition", "message", "fix")
_OPTIONAL = ("sites", "pattern", "description", "ops", "params", "references", "example", "preview", "repair", "tests")
# What a user file may say about a built-in rule it overrides (same id, no name).
_OVERRIDABLE = ("severity", "params", "preview", "message", "fix", "condition", "ops", "references", "tests")
# (a user's override may not change sites or pattern: what a rule looks at is part of its identity)
_TEXT = ("summary", "condition", "message", "fix", "description", "example")


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
    # how `precaudit fix` answers the rule's findings: a repair kind (precaudit/repairs.py), or None with the reason
    # it has none (repair: {none: "why"}); neither: fix says it has no repair for the rule
    repair: str | None = None
    no_repair: str | None = None
    keep_instead: bool = False  # with no_repair: keeping the node in float32 is the answer (keep-list)
    where: dict[str, tuple[str, int]] = field(default_factory=dict)  # key -> (file, line) it was last set in
    # the rule's own examples as written (tests:), for `precaudit test`, which checks them; the audit never reads them
    tests: Any = None

    def located(self, key: str, problem: str) -> InputError:
        """An error about one of the rule's keys, naming the file and line that set it."""
        file, line = self.where.get(key, (self.source, None))
        return InputError(file, f"rule {self.id}: {problem}", line)


def builtin_rules_dir() -> Path:
    """The shipped rules: inside the wheel, or at the top of a source checkout."""
    packaged = Path(__file__).resolve().parent.parent / "_rules"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parent.parent.parent / "rules"


def load_rules(extra: list[str] | tuple[str, ...] = ()) -> list[Rule]:
    """The built-in rules, then each of the user's rule files or folders in order; sorted by id."""
    raw: dict[str, tuple[dict, Path, dict]] = {}
    for path in _rule_files(builtin_rules_dir()):
        data, lines = _read(path, trusted=True)
        _add(raw, data, path, lines, allow_override=False)
    budget = _Budget()
    for item in extra:
        if not os.path.lexists(item):
            raise InputError(item, "no such rule file or folder")
        for path in _rule_files(Path(item), budget):
            data, lines = _read(path, budget)
            _add(raw, data, path, lines, allow_override=True)
    rules = [_build(data, path, where) for data, path, where in raw.values()]
    names: dict[str, Rule] = {}
    for rule in rules:
        if rule.name in names and names[rule.name].id != rule.id:
            raise rule.located("name", f"rule name '{rule.name}' is already used by {names[rule.name].id}")
        names[rule.name] = rule
    return sorted(rules, key=lambda r: r.id)


class _Budget:
    """How many rule files, and bytes, the user's --rules (and pyproject) have made precaudit read so far."""

    def __init__(self) -> None:
        self.files = 0
        self.bytes = 0

    def count_file(self, shown: str) -> None:
        self.files += 1
        if self.files > MAX_RULE_FILES:
            raise InputError(shown, f"more than {MAX_RULE_FILES} rule files in all; precaudit reads no more")

    def count_bytes(self, shown: str, size: int) -> None:
        self.bytes += size
        if self.bytes > MAX_RULE_BYTES:
            limit = f"{MAX_RULE_BYTES // MiB} MiB" if MiB <= MAX_RULE_BYTES else f"{MAX_RULE_BYTES} bytes"
            raise InputError(shown, f"the rule files hold more than {limit} in all; precaudit reads no more")


def _rule_files(path: Path, budget: _Budget | None = None) -> list[Path]:
    """A folder's *.yaml and *.yml files, sorted; anything else is read as one rule file (and refused unless regular).

    A folder that holds no rule file is an error, like a rule file that holds no rule: the user asked for rules.
    """
    shown = str(path)
    if not os.path.isdir(path):  # a file, or a FIFO, device or socket that read_text refuses without blocking on it
        if budget is not None:
            budget.count_file(shown)
        return [path]
    files = []
    try:
        with os.scandir(path) as entries:
            for entry in entries:  # (not glob: stop at the limit without listing a huge folder first)
                if entry.name.endswith((".yaml", ".yml")):
                    if budget is not None:
                        budget.count_file(str(path / entry.name))
                    files.append(path / entry.name)
    except OSError as exc:
        raise InputError(shown, f"cannot list the rule folder: {exc.strerror or exc}") from None
    if not files:
        raise InputError(shown, "holds no rule file (*.yaml or *.yml)")
    return sorted(files)


class _Refused(Exception):
    """Something the rule-file YAML dialect does not allow, at a place in the file."""

    def __init__(self, problem: str, mark: Any):
        super().__init__(problem)
        self.problem = problem
        self.line = mark.line + 1 if mark is not None else None


class _RuleLoader(yaml.SafeLoader):
    """SafeLoader without aliases or anchors, with bounded nesting, size and number literals.

    PyYAML's composer recurses once per level, and an alias repeats a whole subtree without costing bytes
    ("billion laughs"): both are checked here, event by event, before a node is composed.
    """

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self._count = 0
        self.last_mark = None  # where the value being constructed starts, for errors that carry no place

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _Refused("YAML aliases are not allowed in rule files", event.start_mark)
        if getattr(event, "anchor", None) is not None:
            raise _Refused("YAML anchors and aliases are not allowed in rule files", event.start_mark)
        self._count += 1
        if self._count > MAX_YAML_VALUES:
            raise _Refused(f"more than {MAX_YAML_VALUES} YAML values in one rule file", event.start_mark)
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            raise _Refused(f"YAML nests more than {MAX_YAML_DEPTH} levels deep", event.start_mark)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        self.last_mark = node.start_mark
        return super().construct_object(node, deep)

    def construct_number(self, node: Any) -> Any:
        """An int or float no longer than MAX_NUMBER_CHARS: YAML's base-60 ints (1:2:3) take quadratic time."""
        if isinstance(node.value, str) and len(node.value) > MAX_NUMBER_CHARS:
            raise _Refused(f"a number written with more than {MAX_NUMBER_CHARS} characters", node.start_mark)
        if node.tag.endswith(":int"):
            return self.construct_yaml_int(node)
        return self.construct_yaml_float(node)


_RuleLoader.add_constructor("tag:yaml.org,2002:int", _RuleLoader.construct_number)
_RuleLoader.add_constructor("tag:yaml.org,2002:float", _RuleLoader.construct_number)
_STR_TAG = "tag:yaml.org,2002:str"


def _read(path: Path, budget: _Budget | None = None, trusted: bool = False) -> tuple[dict, dict[str, int]]:
    """The YAML mapping and the line of each top-level key (for errors).

    trusted: a built-in rule file, shipped with precaudit: parsed by libyaml where PyYAML has it (CSafeLoader, the
    same safe constructors: 3 ms for all of them, where the pure-Python parser the hardened loader builds on takes
    60 ms). A user's rule file is never trusted: it always goes through _RuleLoader's checks.
    """
    shown = str(path)
    text = read_text(path, RULE_FILE_LIMIT, shown, "rule file")
    if budget is not None:
        budget.count_bytes(shown, len(text.encode("utf-8")))
    loader = None
    try:
        c_loader = getattr(yaml, "CSafeLoader", None) if trusted else None
        loader = c_loader(text) if c_loader is not None else _RuleLoader(text)
        node = loader.get_single_node()
        if node is None:
            raise InputError(shown, "holds no rule (the file has no YAML in it)", 1)
        if not isinstance(node, yaml.MappingNode):
            raise InputError(shown, "a rule file must hold one YAML mapping (id, name, severity, ...)",
                             node.start_mark.line + 1)
        lines: dict[str, int] = {}
        for key, _ in node.value:
            if not isinstance(key, yaml.ScalarNode) or key.tag != _STR_TAG:
                raise _Refused("the keys of a rule are names like id, severity or condition", key.start_mark)
            if key.value in lines:
                raise _Refused(f"key '{_brief(key.value)}' appears twice (first on line {lines[key.value]})",
                               key.start_mark)
            lines[key.value] = key.start_mark.line + 1
        data = loader.construct_document(node)
    except _Refused as exc:
        raise InputError(shown, exc.problem, exc.line) from None
    except yaml.YAMLError as exc:
        raise InputError(shown, f"invalid YAML: {_yaml_problem(exc)}", _yaml_line(exc, text)) from None
    except InputError:
        raise
    except (RecursionError, MemoryError) as exc:
        raise InputError(shown, f"invalid YAML: too complex ({type(exc).__name__})") from None
    except Exception as exc:  # PyYAML's constructors: `!!int ''` is an IndexError, `!!bool x` a KeyError, ...
        mark = getattr(loader, "last_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise InputError(shown, f"invalid YAML value: {type(exc).__name__}: {_brief(str(exc))}", line) from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, lines


def _yaml_problem(exc: yaml.YAMLError) -> str:
    problem = "; ".join(str(part) for part in (getattr(exc, "context", None), getattr(exc, "problem", None)) if part)
    problem = problem or str(getattr(exc, "reason", None) or "")
    if not problem:
        text = str(exc).strip()
        problem = text.splitlines()[0] if text else type(exc).__name__
    return _brief(problem, 200)


def _yaml_line(exc: yaml.YAMLError, text: str) -> int | None:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        return mark.line + 1
    position = getattr(exc, "position", None)  # a ReaderError (a character YAML does not allow) has only this
    if isinstance(position, int):
        return text.count("\n", 0, position) + 1
    return None


def _brief(text: str, limit: int = 60) -> str:
    """A value quoted in an error: one line, and short (a rule file may hold a megabyte in one key)."""
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _add(raw: dict, data: dict, path: Path, lines: dict[str, int], allow_override: bool) -> None:
    where = {key: (str(path), line) for key, line in lines.items()}
    _check_types(data, path, lines)
    rule_id = data.get("id")
    if not isinstance(rule_id, str) or not _ID.match(rule_id):
        raise InputError(str(path), f"'id' must look like PA101 (capital letters then three digits), got "
                                    f"{_brief(repr(rule_id))}", lines.get("id", 1))
    if rule_id not in raw:
        raw[rule_id] = (data, path, where)
        return
    base, base_path, base_where = raw[rule_id]
    if not allow_override or ("name" in data and data["name"] != base.get("name")):
        raise InputError(str(path), f"rule id {rule_id} is already defined in {base_path}", lines.get("id", 1))
    for key in data:
        if key not in ("id", "name", *_OVERRIDABLE):
            raise InputError(str(path), f"an override of {rule_id} may not change '{key}'; "
                             f"it may set {', '.join(_OVERRIDABLE)}", lines.get(key, 1))
    merged = {**base, **{k: v for k, v in data.items() if k != "params"}}
    merged["params"] = {**(base.get("params") or {}), **(data.get("params") or {})}
    raw[rule_id] = (merged, path, {**base_where, **where})


def _check_types(data: dict, path: Path, lines: dict[str, int]) -> None:
    """Every key present has the type it must have (before anything merges, hashes or iterates it)."""
    def fail(key: str, problem: str) -> InputError:
        return InputError(str(path), f"rule {_brief(str(data.get('id')))}: {problem}", lines.get(key, 1))

    for key, value in data.items():
        if key in _TEXT and not isinstance(value, str) and not (value is None and key in _OPTIONAL):
            raise fail(key, f"'{key}' must be a string, got {kind_of(value)}")
        if key in ("sites", "ops", "references") and value is not None and not _strings(value, key != "references"):
            raise fail(key, f"'{key}' must be a list of strings, got {kind_of(value)}")
        if key == "preview" and not isinstance(value, bool):
            raise fail(key, f"'preview' must be true or false, got {kind_of(value)}")
        if key == "repair":
            _check_repair(value, lambda problem: fail(key, problem))
        if key == "severity" and not (isinstance(value, str) and value in SEVERITIES):
            raise fail(key, f"'severity' must be one of {', '.join(SEVERITIES)}; got {_brief(repr(value))}")
        if key == "params" and value is not None:
            _check_params(value, lambda problem: fail("params", problem))
        if key == "pattern":
            _check_pattern_shape(value, lambda problem: fail("pattern", problem))


def _strings(value: Any, single_allowed: bool) -> bool:
    items = [value] if single_allowed and isinstance(value, str) else value
    return isinstance(items, list) and all(isinstance(v, str) and v for v in items)


def _check_repair(value: Any, fail) -> None:
    """repair: a kind fix knows, or {none: "why there is none"}."""
    from ..repairs import REPAIR_KINDS

    if isinstance(value, str):
        if value not in REPAIR_KINDS:
            raise fail(f"unknown repair kind {_brief(repr(value))}; choose from {', '.join(REPAIR_KINDS)}, or "
                       "{none: \"why not\"}")
        return
    if (isinstance(value, dict) and "none" in value and set(value) <= {"none", "keep-fp32"}
            and isinstance(value["none"], str) and value["none"].strip()
            and isinstance(value.get("keep-fp32", False), bool)):
        if len(value["none"]) > MAX_PARAM_CHARS:
            raise fail(f"the repair's reason is {len(value['none'])} characters; at most {MAX_PARAM_CHARS}")
        return
    raise fail(f"'repair' must be a repair kind or {{none: \"why not\"}} (with keep-fp32: true where keeping the "
               f"node in float32 is the answer), got {kind_of(value)}")


def _check_params(params: Any, fail) -> None:
    if not isinstance(params, dict):
        raise fail(f"'params' must map names to numbers, strings or booleans, got {kind_of(params)}")
    for name, value in params.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise fail(f"param name {_brief(repr(name))} is not a name (letters, digits and _)")
        if isinstance(value, str):
            if len(value) > MAX_PARAM_CHARS:
                raise fail(f"param '{name}' is a string of {len(value)} characters; at most {MAX_PARAM_CHARS}")
        elif isinstance(value, (bool, float)):
            pass
        elif isinstance(value, int):
            if not -_PARAM_INT <= value < _PARAM_INT:
                raise fail(f"param '{name}' does not fit in 64 bits; write it as a float (1.0e30)")
        else:
            raise fail(f"param '{name}' must be a number, a string or a boolean, got {kind_of(value)}")


def _check_pattern_shape(pattern: Any, fail) -> None:
    """At most MAX_PATTERN_DEPTH levels and MAX_PATTERN_PARTS parts, measured without recursion, so that
    compile_pattern (which recurses) and the matcher (which may try both orders of a commutative op at every
    level) only ever see a small pattern."""
    stack = [(pattern, 1)]
    parts = 0
    while stack:
        item, level = stack.pop()
        if isinstance(item, list):  # op: [A, B], inputs: [...] and any_of: [...]: the items are one level down
            stack.extend((x, level) for x in item)
            continue
        if not isinstance(item, dict):
            continue
        parts += 1
        if parts > MAX_PATTERN_PARTS:
            raise fail(f"the pattern has more than {MAX_PATTERN_PARTS} parts")
        if level > MAX_PATTERN_DEPTH:
            raise fail(f"the pattern nests more than {MAX_PATTERN_DEPTH} levels deep")
        stack.extend((v, level + 1) for v in item.values())


def _build(data: dict, path: Path, where: dict[str, tuple[str, int]]) -> Rule:
    def fail(key: str, problem: str) -> InputError:
        file, line = where.get(key, where.get("id", (str(path), 1)))
        return InputError(file, f"rule {data.get('id')}: {problem}", line)

    for key in _REQUIRED:
        if key not in data:
            raise fail("id", f"missing required key '{key}'")
    for key in data:
        if key not in _REQUIRED and key not in _OPTIONAL:
            raise fail(key, f"unknown key '{_brief(key)}' (allowed: {', '.join(_REQUIRED + _OPTIONAL)})")
    if not isinstance(data["name"], str) or not _NAME.match(data["name"]):
        raise fail("name", f"'name' must be kebab-case, like eps-underflow; got {_brief(repr(data['name']))}")
    if ("sites" in data) == ("pattern" in data):
        raise fail("id", "a rule needs exactly one of 'sites' (site kinds) or 'pattern' (an op pattern)")
    params = data.get("params") or {}
    pattern: OpP | None = None
    if "pattern" in data:
        try:
            compiled = compile_pattern(data["pattern"])
            root_ops(compiled)  # the top is an op, or this raises
        except PatternError as exc:
            raise fail("pattern", _brief(str(exc), 300)) from None
        assert isinstance(compiled, OpP)
        pattern = compiled
        sites = ["pattern"]
        known = PATTERN_FACTS | pattern_names(pattern) | set(params)
    else:
        sites = [data["sites"]] if isinstance(data["sites"], str) else list(data["sites"] or [])
        unknown = [s for s in sites if s not in FACT_NAMES]
        if unknown or not sites:
            raise fail("sites", f"unknown site kind {_brief(repr(unknown[0])) if unknown else '(none)'}; "
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
    ops = data.get("ops") or []
    return Rule(id=data["id"], name=data["name"], severity=data["severity"], summary=data["summary"].strip(),
                sites=sites, condition=condition, message=data["message"].strip(), fix=data["fix"].strip(),
                description=(data.get("description") or "").strip(), ops=[ops] if isinstance(ops, str) else list(ops),
                params=params, references=list(data.get("references") or []),
                example=(data.get("example") or "").strip(), preview=data.get("preview", False),
                source=str(path), pattern=pattern, where=where,
                repair=data["repair"] if isinstance(data.get("repair"), str) else None,
                no_repair=data["repair"]["none"].strip() if isinstance(data.get("repair"), dict) else None,
                keep_instead=isinstance(data.get("repair"), dict) and data["repair"].get("keep-fp32", False),
                tests=data.get("tests"))


def _template(data: dict, key: str, fail) -> set[str]:
    try:
        return check_template(data[key], f"'{key}'")
    except ConditionError as exc:
        raise fail(key, str(exc)) from None
