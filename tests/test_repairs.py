"""Rules declare their repair: `repair:` names a kind fix knows (or none, and why), fix dispatches by it, `rules`
and `explain` say it, and a user's own rule reuses a kind."""

from __future__ import annotations

import json

import pytest

from fixtures import fix_models
from fixtures.onnx_builders import chain_model, save
from precaudit.cli import main
from precaudit.fixer import planner
from precaudit.repairs import NORM_KINDS, REPAIR_KINDS
from precaudit.rules.loader import load_rules


def test_every_kind_has_its_code_and_every_shipped_rule_says_what_fix_does():
    assert set(REPAIR_KINDS) == {*planner._REPAIRS, *NORM_KINDS, "guard"}
    for rule in load_rules():
        assert (rule.repair is None) != (rule.no_repair is None), rule.id
    by_id = {r.id: r for r in load_rules()}
    assert by_id["PA203"].repair == "max-shift" and by_id["PA301"].repair == "guard"
    assert by_id["PA212"].no_repair.startswith("a weight beyond the target's range") and by_id["PA212"].keep_instead


_USER_RULE = """id: ORG203
name: org-naive-softmax
severity: error
summary: Our own naive-softmax rule, repaired as the built-in one is.
pattern:
  op: Div
  inputs:
    - op: Exp
      inputs:
        - not: {op: Sub, inputs: [_, {op: ReduceMax}]}
    - op: ReduceSum
      inputs:
        - op: Exp
condition: "True"
message: softmax without the max shift
fix: subtract the max
repair: %s
"""


def test_a_users_rule_reuses_a_repair_kind(tmp_path, capsys):
    model = fix_models.hot_softmax(tmp_path / "hot.onnx")
    rule = tmp_path / "org.yaml"
    rule.write_text(_USER_RULE % "max-shift")
    code = main(["fix", str(model), "--dry-run", "--rules", str(rule), "--select", "ORG203", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and [(r["kind"], r["rules"], r["node"]) for r in report["repairs"]] == \
        [("max-shift", ["ORG203"], "softmax")]
    # the same rule with no repair key: left, and fix says so
    rule.write_text((_USER_RULE % "x").replace("repair: x\n", ""))
    main(["fix", str(model), "--dry-run", "--rules", str(rule), "--select", "ORG203", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert report["repairs"] == [] and report["left"][0]["reason"] == "fix has no repair for ORG203"
    # a kind that does not fit the node: left, and why
    rule.write_text(_USER_RULE % "log-sigmoid")
    main(["fix", str(model), "--dry-run", "--rules", str(rule), "--select", "ORG203", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert report["repairs"] == [] and report["left"][0]["reason"] == "no Sigmoid found under the Log"


@pytest.mark.parametrize("value,says", [
    ("bogus", "unknown repair kind 'bogus'; choose from eps-raise"),
    ("{none: 3}", "'repair' must be a repair kind or {none: \"why not\"}"),
    ("{none: why, extra: 1}", "'repair' must be a repair kind or {none: \"why not\"}"),
])
def test_a_bad_repair_key_is_one_line_naming_the_file(tmp_path, capsys, value, says):
    rule = tmp_path / "org.yaml"
    rule.write_text(_USER_RULE % value)
    model = save(chain_model([("Relu", ["x"], "r")]), tmp_path / "m.onnx")
    assert main([str(model), "--rules", str(rule)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(rule) in err and says in err


def test_rules_and_explain_say_what_fix_does(capsys):
    main(["rules"])
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines["PA203"].split()[4] == "max-shift" and lines["PA212"].split()[4] == "keep-list"
    assert lines["PA103"].split()[4] == "no"
    main(["explain", "PA206"])
    out = capsys.readouterr().out
    assert "precaudit fix:\n  leaves it: ONNX has no Log1p op" in out
    main(["rules", "--format", "json"])
    [pa301] = [r for r in json.loads(capsys.readouterr().out) if r["id"] == "PA301"]
    assert pa301["repair"] == "guard" and pa301["no_repair"] is None
