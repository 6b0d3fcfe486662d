"""Every fixture case: the exact findings (rule, node) and their numbers; every rule has a firing and a clean case."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from precaudit.rules.loader import builtin_rules_dir, load_rules
from tests.helpers import run_json

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MODULES = sorted(p.stem for p in FIXTURES.glob("PA*.py"))
CASES = [(mod, case) for mod in MODULES for case in importlib.import_module(f"fixtures.{mod}").CASES]
# Traced cases run on both engines: onnxruntime (the default where installed) and the numpy kernels.
RUNS = [(mod, case, engine) for mod, case in CASES
        for engine in (("onnxruntime", "numpy") if "--trace" in case.args and case.command == "check" else ("",))]


def test_fixture_files_were_found():
    assert len(MODULES) >= 6 and len(CASES) >= 40


@pytest.mark.parametrize("module,case,engine", RUNS,
                         ids=[f"{m}:{c.name}" + (f":{e}" if e else "") for m, c, e in RUNS])
def test_case(module, case, engine, tmp_path):
    model = case.build(tmp_path)
    engine_args = ("--trace-engine", engine) if engine else ()
    if case.command == "train":  # a training factory: precaudit train takes --regime, not --dtype
        code, report = run_json(["train", model], *case.args, out_dir=tmp_path)
    else:
        code, report = run_json([model], "--dtype", case.dtype, *case.args, *engine_args, out_dir=tmp_path)
    assert report["errors"] == []
    got = {(r["rule_id"], r["node_name"]) for r in report["results"]}
    assert got == case.expect
    for rule_id, expected in case.values.items():
        values = next(r["values"] for r in report["results"] if r["rule_id"] == rule_id)
        for key, want in expected.items():
            if isinstance(want, tuple) and want[0] == "contains":
                assert want[1] in values[key], (key, values[key])
            else:
                assert values[key] == pytest.approx(want) if isinstance(want, float) else values[key] == want, key
    for (rule_id, node), message in case.messages.items():
        assert [r["message"] for r in report["results"] if (r["rule_id"], r["node_name"]) == (rule_id, node)] == \
            [message]
    has_error = any(r["severity"] == "error" for r in report["results"])
    assert code == (1 if has_error else 0)


@pytest.mark.parametrize("rule", load_rules(), ids=lambda r: r.id)
def test_every_rule_has_a_firing_case_and_a_clean_twin(rule):
    module = f"{rule.id}_{rule.name.replace('-', '_')}"
    assert module in MODULES, f"fixtures/{module}.py is missing"
    cases = importlib.import_module(f"fixtures.{module}").CASES
    assert any(rule.id in {r for r, _ in c.expect} for c in cases), "no case where the rule must fire"
    assert any(rule.id not in {r for r, _ in c.expect} for c in cases), "no twin where the rule must stay quiet"


def test_rule_files_are_named_after_their_rule():
    for rule in load_rules():
        assert Path(rule.source).name == f"{rule.id}-{rule.name}.yaml"
        assert Path(rule.source).parent == builtin_rules_dir()
