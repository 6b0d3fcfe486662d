"""A rule's Python fixture cases (--fixtures DIR --allow-code): the CASES of DIR/ID_name.py, each run as the
project's tests run them and compared exactly: every finding (rule, node) of the report, the values asked for, no
error, and the exit code its findings make. Importing the module runs its code: the command refuses --fixtures
without --allow-code, and nothing here is imported otherwise."""

from __future__ import annotations

import importlib
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from .case import Case
from .examples import error_line

if TYPE_CHECKING:
    from ..rules.loader import Rule

__all__ = ["FixtureExample", "fixture_examples", "module_of"]

# pytest.approx's defaults, which the project's fixture tests compared float values with
_REL, _ABS = 1e-6, 1e-12


@dataclass(frozen=True)
class FixtureExample:
    """One run of one fixture case (a traced check case runs on both engines: one example each)."""

    rule_id: str
    module: str
    case: Case
    engine: str                # "onnxruntime" or "numpy" for a traced check case, else ""
    rules: tuple[str, ...]     # --rules RULES_DIR (none for the built-in folder)

    @property
    def label(self) -> str:
        return f"case {self.case.name}" + (f" on {self.engine}" if self.engine else "")

    @property
    def fires(self) -> bool:
        return any(rule_id == self.rule_id for rule_id, _ in self.case.expect)

    def command_line(self, folder: Path) -> list[str]:
        """The command line the case runs, its model (or a training factory's spec) built in folder."""
        model = str(self.case.build(folder))
        if self.case.command == "train":  # precaudit train takes --regime, not --dtype
            return ["train", model, *self.case.args, *self.rules]
        engine = ("--trace-engine", self.engine) if self.engine else ()
        return [model, "--dtype", self.case.dtype, *self.case.args, *engine, *self.rules]

    def problems(self, code: int, report: dict[str, Any]) -> list[str]:
        results = report["results"]
        said = [f"{self.label}: {error_line(e)}" for e in report["errors"]]
        got = {(r["rule_id"], r["node_name"]) for r in results}
        said += [f"{self.label}: no {rule_id} at '{node}'" for rule_id, node in sorted(self.case.expect - got)]
        said += [f"{self.label}: {rule_id} at '{node}', not expected" for rule_id, node in sorted(got - self.case.expect)]
        said += [f"{self.label}: {problem}" for problem in _value_problems(self.case.values, results)]
        for (rule_id, node), message in sorted(self.case.messages.items()):
            said_there = [r["message"] for r in results if (r["rule_id"], r["node_name"]) == (rule_id, node)]
            if said_there != [message]:
                said.append(f"{self.label}: {rule_id} at '{node}' says {said_there!r}, expected {message!r}")
        wanted = 1 if any(r["severity"] == "error" for r in results) else 0
        if code != wanted:
            said.append(f"{self.label}: exit code {code}, where its findings make {wanted}")
        return said


def _value_problems(expected: dict[str, dict[str, Any]], results: list[dict[str, Any]]) -> list[str]:
    """The values of each rule's first finding against the case's: exact, ("contains", text), or a float as close
    as pytest.approx asks."""
    said = []
    for rule_id, wanted in expected.items():
        values = next((r["values"] for r in results if r["rule_id"] == rule_id), None)
        if values is None:
            said.append(f"no {rule_id} finding to read its values from")
            continue
        for key, want in wanted.items():
            if key not in values:
                said.append(f"{rule_id} has no value {key!r}")
            elif not _matches(values[key], want):
                said.append(f"{rule_id} {key} = {values[key]!r}, expected {want!r}")
    return said


def _matches(got: Any, want: Any) -> bool:
    if isinstance(want, tuple) and want[0] == "contains":
        return isinstance(got, (str, list)) and want[1] in got
    if isinstance(want, float):
        if got == want:
            return True
        if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isfinite(want):
            return False
        return abs(got - want) <= max(_REL * abs(want), _ABS)
    return bool(got == want)


def module_of(rule: Rule) -> str:
    """The fixture module of a rule: PA101 eps-underflow is PA101_eps_underflow."""
    return f"{rule.id}_{rule.name.replace('-', '_')}"


def fixture_examples(rule: Rule, folder: Path, rules: tuple[str, ...] = ()) -> list[FixtureExample]:
    """The runs of the rule's fixture cases (none when folder has no module of the rule); importing it runs it."""
    name = module_of(rule)
    file = folder / f"{name}.py"
    if not os.path.lexists(file):
        return []
    cases = getattr(_imported(folder, name), "CASES", None)
    if not isinstance(cases, (list, tuple)):
        raise InputError(str(file), "has no CASES list (the rule's fixture cases)")
    for i, case in enumerate(cases):
        if not isinstance(case, Case):
            raise InputError(str(file), f"CASES[{i}] is no Case (precaudit.ruletest.case.Case), got {type(case).__name__}")
    return [FixtureExample(rule.id, name, case, engine, rules) for case in cases
            for engine in (("onnxruntime", "numpy") if "--trace" in case.args and case.command == "check" else ("",))]


def _imported(folder: Path, name: str) -> ModuleType:
    """folder/name.py imported: as a module of the folder's package when the folder is one (its package imports
    then work: `from fixtures.case import Case`), else as a module of its own, with the folder on sys.path."""
    real = folder.resolve()
    package = (real / "__init__.py").is_file()
    base, dotted = (real.parent, f"{real.name}.{name}") if package else (real, name)
    if str(base) not in sys.path:
        sys.path.insert(0, str(base))
    shown = str(folder / f"{name}.py")
    try:
        module = importlib.import_module(dotted)
    except (Exception, SystemExit) as exc:  # the user's code, under --allow-code: whatever it raises is one line
        raise InputError(shown, f"importing it failed: {type(exc).__name__}: {exc}") from None
    loaded = getattr(module, "__file__", None)
    if loaded is None or Path(loaded).resolve() != real / f"{name}.py":
        raise InputError(shown, f"imports as {dotted} from {loaded}, another module of that name")
    return module
