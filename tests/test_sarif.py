"""--format sarif: valid SARIF 2.1.0 that GitHub code scanning accepts, with the finding's node, numbers and fix."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from fixtures.onnx_builders import fused_norm, save
from precaudit.audit_models import AuditResult
from precaudit.cli import main
from precaudit.finding import Finding
from precaudit.report.outcome import Outcome
from precaudit.report.sarif import sarif_document
from precaudit.rules.loader import load_rules

SARIF_SCHEMA = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())
MESSAGE = "eps 1e-12 (attribute epsilon) rounds to 0.0 in float16: the guard against dividing by a zero statistic is gone"
FIX = ("Raise eps to at least 6.104e-05, the smallest normal float16, or keep this node in float32 "
       "(--keep-fp32 LayerNormalization; the same entry in your converter's op block list).")


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A repository with two fp16 models under models/: eps 1e-12 (PA101, error) and eps 1e-5 (PA102, warning)."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "models").mkdir()
    save(fused_norm("LayerNormalization", epsilon=1e-12, stash_type=0, name="/encoder/layer.0/LayerNorm/ln"),
         tmp_path / "models" / "under.onnx")
    save(fused_norm("LayerNormalization", epsilon=1e-5, stash_type=0, name="/head/ln"), tmp_path / "models" / "sub.onnx")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_sarif(*args: str) -> tuple[int, dict]:
    code = main([*args, "--format", "sarif", "-o", "out.sarif"])
    return code, json.loads(Path("out.sarif").read_text())


def test_sarif_validates_against_the_2_1_0_schema(repo):
    code, log = run_sarif("models/under.onnx", "models/sub.onnx")
    jsonschema.Draft7Validator(SARIF_SCHEMA).validate(log)
    assert code == 1 and log["version"] == "2.1.0"


def test_sarif_has_every_field_github_code_scanning_requires(repo):
    _, log = run_sarif("models/under.onnx", "models/sub.onnx")
    run = log["runs"][0]
    for rule in run["tool"]["driver"]["rules"]:
        assert rule["id"] and rule["shortDescription"]["text"] and rule["fullDescription"]["text"]
        assert rule["help"]["text"] and rule["help"]["markdown"]
    assert len(run["results"]) == 2
    for result in run["results"]:
        assert result["message"]["text"]
        location = result["locations"][0]["physicalLocation"]
        uri = location["artifactLocation"]["uri"]
        assert not uri.startswith(("/", "file:")) and "\\" not in uri  # repo-relative
        assert location["region"]["startLine"] >= 1
        assert result["partialFingerprints"]["precauditFingerprint/v1"]


def test_sarif_golden_onnx_result(repo):
    _, log = run_sarif("models/under.onnx", "--dtype", "fp16")
    run = log["runs"][0]
    result = run["results"][0]
    fingerprint = json.loads(_json_report("models/under.onnx"))["results"][0]["fingerprint"]
    assert {k: v for k, v in result.items() if k != "properties"} == {
        "ruleId": "PA101",
        "ruleIndex": 0,
        "level": "error",
        "message": {"text": f"{MESSAGE}. At node '/encoder/layer.0/LayerNorm/ln' (LayerNormalization) "
                            f"in encoder.layer.0.LayerNorm. Fix: {FIX}"},
        "locations": [{
            "physicalLocation": {"artifactLocation": {"uri": "models/under.onnx", "uriBaseId": "%SRCROOT%"},
                                 "region": {"startLine": 1}},
            "logicalLocations": [{"name": "/encoder/layer.0/LayerNorm/ln", "kind": "function",
                                  "fullyQualifiedName": "encoder.layer.0.LayerNorm/encoder/layer.0/LayerNorm/ln"}],
        }],
        "partialFingerprints": {"precauditFingerprint/v1": fingerprint},
    }
    assert result["properties"]["values"]["eps_rounded"] == 0.0
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == repo.resolve().as_uri() + "/"
    assert run["invocations"][0]["executionSuccessful"] is True and run["invocations"][0]["exitCode"] == 1


def test_sarif_rules_are_the_rules_that_ran_with_levels_and_tags(repo, tmp_path):
    override = tmp_path / "info.yaml"
    override.write_text("id: PA102\nseverity: info\n")
    _, log = run_sarif("models/sub.onnx", "--select", "PA101,PA102", "--rules", str(override))
    rules = log["runs"][0]["tool"]["driver"]["rules"]
    assert [(r["id"], r["name"], r["defaultConfiguration"]["level"]) for r in rules] == [
        ("PA101", "eps-underflow", "error"), ("PA102", "eps-subnormal", "note")]
    assert rules[0]["shortDescription"]["text"] == "The epsilon rounds to zero in the dtype it is computed in."
    assert "0 / 0 = NaN" in rules[0]["help"]["text"] and "```text" in rules[0]["help"]["markdown"]
    assert rules[0]["properties"] == {"tags": ["precision", "numerics"], "precision": "very-high"}
    result = log["runs"][0]["results"][0]
    assert (result["ruleId"], result["level"], result["ruleIndex"]) == ("PA102", "note", 1)


def test_sarif_reports_a_model_that_failed_to_load(repo):
    code, log = run_sarif("models/under.onnx", "models/missing.onnx")
    jsonschema.Draft7Validator(SARIF_SCHEMA).validate(log)
    invocation = log["runs"][0]["invocations"][0]
    assert code == 2 and invocation["executionSuccessful"] is False
    assert invocation["toolExecutionNotifications"] == [
        {"level": "error", "message": {"text": "models/missing.onnx: no such file"}}]


def test_python_source_location_wins_over_the_model_file(repo):
    """A PyTorch finding carries the Python file and line that built the op; code scanning points there."""
    finding = Finding("PA101", "eps-underflow", "error", MESSAGE, FIX, model="model.py", node_name="layer_norm",
                      op_type="aten.layer_norm", scope="encoder.layer.0.LayerNorm",
                      source_file=str(repo / "src" / "model.py"), source_line=42)
    rules = [r for r in load_rules() if r.id == "PA101"]
    outcome = Outcome(AuditResult([finding], [], ["model.py"]), {"dtype": "fp16"}, 1, rules, repo.resolve())
    log = sarif_document(outcome)
    jsonschema.Draft7Validator(SARIF_SCHEMA).validate(log)
    location = log["runs"][0]["results"][0]["locations"][0]
    assert location["physicalLocation"]["artifactLocation"]["uri"] == "src/model.py"
    assert location["physicalLocation"]["region"] == {"startLine": 42}
    assert location["logicalLocations"][0]["fullyQualifiedName"] == "encoder.layer.0.LayerNorm/layer_norm"


def _json_report(model: str) -> str:
    main([model, "--format", "json", "-o", "out.json"])
    return Path("out.json").read_text()
