"""Baselines: accept today's findings, fail CI only on new ones, and report entries that no longer match."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import onnx
import pytest
from onnx import helper as h

from fixtures.onnx_builders import const, model, save, tensor
from precaudit.cli import main
from tests.helpers import run_json

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "precaudit/schemas/report.schema.json").read_text())


def two_norms(eps1: float, eps2: float, extra_node: bool = False) -> onnx.ModelProto:
    """Two fp16 LayerNorms (stash_type=0, so each eps meets float16) in the scopes attn_norm and mlp_norm."""
    nodes = [h.make_node("LayerNormalization", ["x", "s"], ["a"], name="/attn_norm/LayerNormalization",
                         epsilon=eps1, stash_type=0),
             h.make_node("LayerNormalization", ["a", "s"], ["y"], name="/mlp_norm/LayerNormalization",
                         epsilon=eps2, stash_type=0)]
    if extra_node:  # a re-export that adds a node in front: indices shift, names and scopes do not
        nodes.insert(0, h.make_node("Identity", ["x"], ["unused"], name="/prologue/Identity"))
    return model(nodes, [tensor("x", "fp16")], [tensor("y", "fp16")], [const("s", [1.0] * 8, "fp16")])


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save(two_norms(1e-12, 1e-3), tmp_path / "m.onnx")
    return tmp_path


def test_round_trip_write_rerun_then_one_new_hazard(project, capsys):
    assert main(["m.onnx"]) == 1
    assert main(["m.onnx", "--write-baseline", "baseline.json"]) == 0
    assert "wrote 1 finding to the baseline baseline.json" in capsys.readouterr().err
    entries = json.loads((project / "baseline.json").read_text())["findings"]
    assert [(e["rule_id"], e["model"], e["node_name"]) for e in entries] == [
        ("PA101", "m.onnx", "/attn_norm/LayerNormalization")]

    assert main(["m.onnx", "--baseline", "baseline.json"]) == 0
    out = capsys.readouterr().out
    assert "Found 0 findings in 1 model" in out and "1 finding already in the baseline baseline.json." in out

    save(two_norms(1e-12, 1e-3, extra_node=True), project / "m.onnx")  # re-export: nothing new
    assert main(["m.onnx", "--baseline", "baseline.json"]) == 0

    save(two_norms(1e-12, 1e-12), project / "m.onnx")  # a second eps that underflows
    code, report = run_json(["m.onnx"], "--baseline", "baseline.json", out_dir=project)
    assert code == 1
    assert [(r["rule_id"], r["node_name"]) for r in report["results"]] == [("PA101", "/mlp_norm/LayerNormalization")]
    assert report["baseline"] == {"file": "baseline.json", "matched": 1, "stale": []}
    jsonschema.Draft7Validator(SCHEMA).validate(report)


def test_stale_entries_are_reported_in_text_and_json(project, capsys):
    main(["m.onnx", "--write-baseline", "baseline.json"])
    fingerprint = json.loads((project / "baseline.json").read_text())["findings"][0]["fingerprint"]
    save(two_norms(1e-3, 1e-3), project / "m.onnx")  # the hazard is fixed
    capsys.readouterr()
    assert main(["m.onnx", "--baseline", "baseline.json"]) == 0
    assert ("stale baseline entry: PA101 at m.onnx node '/attn_norm/LayerNormalization' no longer found; "
            "rewrite the baseline with --write-baseline baseline.json") in capsys.readouterr().out.splitlines()
    _, report = run_json(["m.onnx"], "--baseline", "baseline.json", out_dir=project)
    jsonschema.Draft7Validator(SCHEMA).validate(report)
    assert report["baseline"]["matched"] == 0
    assert [(s["fingerprint"], s["rule_id"], s["node_name"]) for s in report["baseline"]["stale"]] == [
        (fingerprint, "PA101", "/attn_norm/LayerNormalization")]


def test_entries_for_models_not_audited_this_run_are_not_stale(project, capsys):
    save(two_norms(1e-12, 1e-3), project / "other.onnx")
    main(["m.onnx", "other.onnx", "--write-baseline", "baseline.json"])
    capsys.readouterr()
    assert main(["m.onnx", "--baseline", "baseline.json"]) == 0  # as pre-commit runs: only the changed model
    assert "stale" not in capsys.readouterr().out


def test_baseline_from_pyproject_is_relative_to_it(project, monkeypatch, capsys):
    (project / "pyproject.toml").write_text('[tool.precaudit]\nbaseline = "ci/baseline.json"\n')
    (project / "ci").mkdir()
    assert main(["m.onnx", "--write-baseline", "ci/baseline.json"]) == 0
    assert main(["m.onnx"]) == 0
    assert "1 finding already in the baseline ci/baseline.json." in capsys.readouterr().out


@pytest.mark.parametrize("content,problem", [
    (None, "baseline.json: no such baseline file (create it with --write-baseline)"),
    ("{not json", "baseline.json:1: not a precaudit baseline: invalid JSON"),
    ('{"findings": []}', 'baseline.json: not a precaudit baseline (expected "format": "precaudit-baseline/1"'),
    # past Python's 4,300-digit limit for int(): refused before it converts
    ('{"format": "precaudit-baseline/1", "findings": [{"count": ' + "9" * 5000 + '}]}',
     "baseline.json: not a precaudit baseline: an integer of 5000 digits"),
    # bare {} or [] parse into 27x their size: refused by their count before parsing
    ('{"format": "precaudit-baseline/1", "findings": [' + ",".join(["[]"] * 100_000) + ']}',
     "baseline.json: not a precaudit baseline: 100002 brackets in 300049 characters"),
    ('{"format": "precaudit-baseline/1", "findings": [' + ",".join(["{}"] * 100_000) + ']}',
     "baseline.json: not a precaudit baseline: 100002 brackets in 300049 characters"),
])
def test_unreadable_baseline_is_exit_2(project, capsys, content, problem):
    if content is not None:
        (project / "baseline.json").write_text(content)
    assert main(["m.onnx", "--baseline", "baseline.json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"precaudit: {problem}") and "\n" not in err


def test_a_findings_json_record_is_every_field_in_order_then_its_fingerprint():
    """to_dict is written out by hand for speed; it must stay what dataclasses.asdict gives, field for field."""
    from dataclasses import asdict, fields

    from precaudit.finding import Finding

    finding = Finding(**{f.name: f"{f.name}-value" for f in fields(Finding)
                         if f.name not in ("source_line", "values", "references", "related_locations")},
                      source_line=7, values={"eps": 1e-12, "note": None}, references=["https://x"],
                      related_locations=[{"file": "m.py", "line": 3, "message": "call"}])
    record = finding.to_dict()
    assert record == {**asdict(finding), "fingerprint": finding.fingerprint}
    assert list(record) == [f.name for f in fields(Finding)] + ["fingerprint"]
    record["values"]["eps"] = 1.0
    record["related_locations"][0]["line"] = 4
    assert finding.values["eps"] == 1e-12 and finding.related_locations[0]["line"] == 3  # a copy, as asdict's is
