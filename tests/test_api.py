"""The Python API: precaudit.audit / keep_list / fix give what the commands give, from a path, an
onnx.ModelProto or an nn.Module, and write nothing the caller did not ask for."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import onnx
import pytest

import precaudit
from fixtures import fix_models
from fixtures.keep_list_models import ffn_overflow_transformer
from precaudit.cli import main
from tests.helpers import SCHEMA

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tiny_block_fp16.onnx"


def _cli_findings(tmp_path: Path, *args: str) -> tuple[int, list[tuple[str, str, str]]]:
    out = tmp_path / "cli.json"
    code = main([*args, "--format", "json", "-o", str(out)])
    return code, [(r["rule_id"], r["node_name"], r["message"]) for r in json.loads(out.read_text())["results"]]


def test_audit_of_a_path_is_the_commands_audit(tmp_path):
    code, cli = _cli_findings(tmp_path, str(EXAMPLE))
    report = precaudit.audit(str(EXAMPLE))
    assert report.exit_code == code == 1 and not report.ok
    assert [(f.rule_id, f.node_name, f.message) for f in report.findings] == cli
    assert report.models == [str(EXAMPLE)] and report.errors == []
    doc = json.loads(report.to_json())
    jsonschema.Draft7Validator(SCHEMA).validate(doc)
    assert [(r["rule_id"], r["node_name"], r["message"]) for r in doc["results"]] == cli
    assert report.to_text().endswith(f"Found 6 findings in 1 model ({EXAMPLE}): 1 error, 5 warnings, 0 info.\n")
    assert json.loads(report.to_sarif())["version"] == "2.1.0"
    assert report._repr_html_().startswith("<!DOCTYPE html>")


def test_a_model_proto_is_audited_by_name_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    proto = onnx.load(str(EXAMPLE))
    report = precaudit.audit(proto, config=None)
    assert report.models == [f"<onnx.ModelProto {proto.graph.name}>"]
    assert {f.model for f in report.findings} == {report.models[0]}
    assert [(f.rule_id, f.node_name) for f in report.findings] == \
        [(f.rule_id, f.node_name) for f in precaudit.audit(str(EXAMPLE)).findings]
    assert list(tmp_path.iterdir()) == []


def test_an_nn_module_with_example_inputs(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from fixtures.torch_src.hazards import HandLayerNorm

    monkeypatch.chdir(tmp_path)
    report = precaudit.audit(HandLayerNorm(), example_inputs=torch.randn(2, 8), config=None)
    assert report.models == ["<HandLayerNorm>"]
    source = Path(__file__).resolve().parent.parent / "fixtures" / "torch_src" / "hazards.py"
    line = next(i for i, text in enumerate(source.read_text().splitlines(), 1) if "torch.sqrt(var + self.eps)" in text)
    assert [(f.rule_id, Path(f.source_file).name, f.source_line) for f in report.findings] == \
        [("PA101", "hazards.py", line), ("PA208", "hazards.py", line)]
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(precaudit.InputError, match="needs example_inputs"):
        precaudit.audit(HandLayerNorm())


def test_errors_raise_or_are_entries(tmp_path):
    with pytest.raises(precaudit.InputError, match="unknown dtype 'fp12'"):
        precaudit.audit(str(EXAMPLE), dtype="fp12")
    with pytest.raises(precaudit.InputError, match="expected a path, an onnx.ModelProto or a torch.nn.Module"):
        precaudit.audit(42)
    report = precaudit.audit(str(tmp_path / "missing.onnx"))
    assert report.exit_code == 2 and [e.problem for e in report.errors] == ["no such file"]


def test_keep_list_and_fix_from_python(tmp_path):
    keep = precaudit.keep_list(ffn_overflow_transformer(tmp_path / "ffn.onnx"), "onnxruntime", trace=True)
    assert [n.name for n in keep.nodes] == ["/layers.1/ffn/wo/MatMul", "/layers.1/ffn/Add",
                                            "/layers.1.ffn_norm/LayerNormalization"]
    assert keep.verified and keep.exit_code == 3  # synthesized inputs only
    assert "node_block_list=['/layers.1/ffn/wo/MatMul'" in keep.code()
    model = fix_models.hot_softmax(tmp_path / "hot.onnx")
    result = precaudit.fix(model, tmp_path / "hot.fixed.onnx")
    assert result.written and result.exit_code == 3 and [r.kind for r in result.plan.repairs] == ["max-shift"]
    assert json.loads(result.to_json())["written"] is True


def test_importing_precaudit_loads_no_pipeline():
    import subprocess
    import sys

    code = ("import sys, precaudit; print(precaudit.__version__); "
            "print(sorted(m for m in sys.modules if m.startswith(('onnx', 'numpy', 'precaudit.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == [precaudit.__version__, "[]"]


def test_the_api_names_are_the_functions_after_every_subpackage_loads():
    """A subpackage named like a function (precaudit/fix/ once) is set on the package when imported and hides it."""
    import importlib

    from precaudit import api

    for module in ("precaudit.fixer.run", "precaudit.audit_models", "precaudit.keeplist", "precaudit.pipeline"):
        importlib.import_module(module)
    assert precaudit.audit is api.audit and precaudit.fix is api.fix and precaudit.keep_list is api.keep_list
