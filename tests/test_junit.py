"""--format junit: a suite per model, a case per rule that ran, failures where a rule found something."""

from __future__ import annotations

from xml.etree import ElementTree as ET

from fixtures.onnx_builders import fused_norm, save
from precaudit.cli import main


def _junit(tmp_path, *args) -> tuple[int, ET.Element]:
    out = tmp_path / "report.xml"
    code = main([*map(str, args), "--format", "junit", "-o", str(out)])
    return code, ET.parse(out).getroot()


def test_findings_are_failures_of_their_rule(tmp_path):
    model = save(fused_norm("LayerNormalization", epsilon=1e-12, stash_type=0, name="enc.ln"), tmp_path / "m.onnx")
    code, root = _junit(tmp_path, model, "--select", "PA1")
    suite = root.find("testsuite")
    assert code == 1 and suite.get("name") == str(model)
    assert suite.get("tests") == "8" and suite.get("failures") == "1"  # PA101-PA108 ran; PA101 failed
    failed = [c for c in suite.iter("testcase") if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["PA101 eps-underflow"]
    failure = failed[0].find("failure")
    assert failure.get("type") == "error" and "node 'enc.ln' (LayerNormalization)" in failure.get("message")
    assert "Fix: Raise eps" in failure.text


def test_clean_model_and_unreadable_model(tmp_path):
    clean = save(fused_norm("LayerNormalization", epsilon=1e-5), tmp_path / "clean.onnx")
    code, root = _junit(tmp_path, clean, tmp_path / "missing.onnx")
    suites = root.findall("testsuite")
    assert code == 2
    assert suites[0].get("failures") == "0" and int(suites[0].get("tests")) >= 17
    assert suites[1].get("errors") == "1" and suites[1].find("testcase/error").get("message") == "no such file"
