"""Run a rule folder's examples: which rules, their examples (all checked before the first runs), each run through
the command line in this process into a folder of its own, and what is wrong with each rule."""

from __future__ import annotations

import io
import json
import os
import tempfile
import warnings
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import InputError

if TYPE_CHECKING:
    from ..cli.given import Given
    from ..rules.loader import Rule

__all__ = ["Commands", "Example", "RuleResult", "coverage_problems", "plan_tests", "run_example", "run_rule"]

REPORT = "precaudit-test-report.json"  # each example's JSON report, in its own folder


@dataclass(frozen=True)
class Commands:
    """The command line, handed in by the grammar (which nothing imports): run(argv) runs a precaudit command line
    and returns its exit code; parse(command, args) parses one command's options as it would, without running it,
    into the Given its module would get and the options typed (each by its first name)."""

    run: Callable[[list[str]], int]
    parse: Callable[[str, list[str]], tuple[Given, list[str]]]


class Example(Protocol):
    """A YAML example (examples.py) or a fixture case's run (fixtures.py)."""

    @property
    def label(self) -> str: ...

    @property
    def fires(self) -> bool: ...  # whether the rule must fire somewhere in it (False: a quiet twin)

    def command_line(self, folder: Path) -> list[str]: ...

    def problems(self, code: int, report: dict[str, Any]) -> list[str]: ...


@dataclass
class RuleResult:
    rule: Rule
    examples: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def plan_tests(rules_dir: str, select: list[str], fixtures: str | None,
               commands: Commands) -> list[tuple[Rule, list[Example]]]:
    """Every rule of the folder (--select: those it names) with its examples, every one checked: one InputError for
    the first bad rule file, example or fixture module, before anything runs."""
    from ..rules.loader import builtin_rules_dir, load_rules
    from ..selection import check_selectors, selects
    from .examples import yaml_examples
    from .fixtures import fixture_examples

    root = _folder(rules_dir, "")
    builtin = root == os.path.realpath(builtin_rules_dir())
    rules_args = () if builtin else ("--rules", root)
    mine = [rule for rule in load_rules([] if builtin else [rules_dir])
            if os.path.realpath(Path(rule.source).parent) == root]
    if select:
        check_selectors(select, mine, None, "--select")
        mine = [rule for rule in mine if any(selects(s, rule) for s in select)]
    fixture_folder = Path(_folder(fixtures, "--fixtures: ")) if fixtures is not None else None
    planned: list[tuple[Rule, list[Example]]] = []
    for rule in mine:
        examples: list[Example] = [*yaml_examples(rule, root, commands, rules_args)]
        if fixture_folder is not None:
            examples += fixture_examples(rule, fixture_folder, rules_args)
        planned.append((rule, examples))
    return planned


def _folder(path: str, said: str) -> str:
    if not os.path.isdir(path):
        raise InputError(path, f"{said}no such folder" if not os.path.lexists(path) else f"{said}is not a folder")
    return os.path.realpath(path)


def run_rule(rule: Rule, examples: list[Example], commands: Commands) -> RuleResult:
    """Every example of the rule run, each in a temporary folder of its own; what is wrong, the coverage first."""
    problems = coverage_problems(examples)
    for example in examples:
        with tempfile.TemporaryDirectory(prefix="precaudit-test-") as folder:
            problems += run_example(example, commands, Path(folder))
    return RuleResult(rule, len(examples), problems)


def coverage_problems(examples: list[Example]) -> list[str]:
    """A rule needs an example where it fires and one where it stays quiet (a near-twin, ideally)."""
    said = []
    if not any(example.fires for example in examples):
        said.append("no example where it must fire")
    if all(example.fires for example in examples):
        said.append("no example where it must stay quiet")
    return said


def run_example(example: Example, commands: Commands, folder: Path) -> list[str]:
    """Run one example (its model built in folder, its JSON report written there), as main() runs a command line:
    warnings silenced, the run's record of its input files new; what its report shows wrong ([]: it holds)."""
    from ..files import start_run

    out = folder / REPORT
    said = io.StringIO()  # what the command says on stdout and stderr: the reason when it writes no report
    start_run()
    try:
        with redirect_stdout(said), redirect_stderr(said), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            code = commands.run([*example.command_line(folder), "--isolated", "--format", "json", "-o", str(out)])
    except (Exception, SystemExit) as exc:  # a usage error, a bad input, a fixture's build failing: one line
        return [f"{example.label}: {_one_line(exc)}"]
    if not out.is_file():
        lines = [line for line in said.getvalue().splitlines() if line.strip()]
        return [f"{example.label}: exit code {code} and no report ({lines[-1] if lines else 'nothing said'})"]
    return example.problems(code, json.loads(out.read_text(encoding="utf-8")))


def _one_line(exc: BaseException) -> str:
    from ..cli.given import UsageError

    text = str(exc) if isinstance(exc, (InputError, UsageError)) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())
