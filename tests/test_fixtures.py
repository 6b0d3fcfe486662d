"""Every fixture case: the exact findings (rule, node) and their numbers; every rule has a firing and a clean case.

Each case runs through the engine of `precaudit test rules --fixtures fixtures --allow-code` (precaudit/ruletest),
one pytest item per case and engine: no error, the findings exactly, the values asked for, the exit code, and a
report that follows the schema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from precaudit.cli.grammar import parse, run
from precaudit.rules.loader import builtin_rules_dir, load_rules
from precaudit.ruletest.fixtures import fixture_examples, module_of
from precaudit.ruletest.run import REPORT, Commands, coverage_problems, run_example
from tests.helpers import SCHEMA

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MODULES = sorted(p.stem for p in FIXTURES.glob("PA*.py"))
RULES = load_rules()
# Traced cases run on both engines: onnxruntime (the default where installed) and the numpy kernels.
RUNS = {rule.id: fixture_examples(rule, FIXTURES) for rule in RULES}
EXAMPLES = [example for runs in RUNS.values() for example in runs]
COMMANDS = Commands(run, parse)


def test_fixture_files_were_found():
    assert len(MODULES) >= 6 and len({(e.module, e.case.name) for e in EXAMPLES}) >= 40
    assert sorted(module_of(rule) for rule in RULES) == MODULES  # every module is a rule's: none left unrun




def _tiered(runs: dict[str, list]) -> list:
    """Every example, the default tier keeping each training rule's first firing and first quiet case (each is a
    real training step, seconds long): the rest of those run in the slow tier."""
    params = []
    for examples in runs.values():
        kept = set()
        for e in examples:
            if e.case.command == "train" and e.fires in kept:
                params.append(pytest.param(e, marks=pytest.mark.slow))
                continue
            if e.case.command == "train":
                kept.add(e.fires)
            params.append(e)
    return params


@pytest.mark.parametrize("example", _tiered(RUNS),
                         ids=[f"{e.module}:{e.case.name}" + (f":{e.engine}" if e.engine else "") for e in EXAMPLES])
def test_case(example, tmp_path):
    assert run_example(example, COMMANDS, tmp_path) == []
    report = json.loads((tmp_path / REPORT).read_text())  # the report it read follows the schema
    jsonschema.Draft7Validator(SCHEMA).validate(report)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.id)
def test_every_rule_has_a_firing_case_and_a_clean_twin(rule):
    assert module_of(rule) in MODULES, f"fixtures/{module_of(rule)}.py is missing"
    assert coverage_problems(RUNS[rule.id]) == []


def test_rule_files_are_named_after_their_rule():
    for rule in RULES:
        assert Path(rule.source).name == f"{rule.id}-{rule.name}.yaml"
        assert Path(rule.source).parent == builtin_rules_dir()
