"""Where a finding of an ONNX model is: the model file and the node. The Python line torch's dynamo exporter recorded
on the node (its pkg.torch.onnx.stack_trace) was a line on the exporting machine: it is a related location, shown
only when that file is here, in the repository the audit runs in."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import shutil
from pathlib import Path

import onnx
import pytest

from precaudit.cli import main
from precaudit.finding import RECORDED

# one small module exported once for the file (a few seconds): the default tier
pytestmark = pytest.mark.requires("torch", "onnxscript")

SOURCE = """import torch
from torch import nn


class HandLayerNorm(nn.Module):
    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-12)
"""
LINE = 9  # the return line: the exporter drops the Add of 1e-12, so PA105 and PA208 land on its Sqrt


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository whose src/model.py was exported here with torch.onnx.export(dynamo=True) to model.onnx."""
    import torch

    repo = tmp_path_factory.mktemp("exporter")
    (repo / ".git").mkdir()
    (repo / "src").mkdir()
    (repo / "src" / "model.py").write_text(SOURCE)
    spec = importlib.util.spec_from_file_location("exported_model", repo / "src" / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        torch.onnx.export(module.HandLayerNorm().half(), (torch.randn(2, 8).half(),), str(repo / "model.onnx"),
                          dynamo=True)
    return repo


def _stack_traces(model: Path) -> set[str]:
    return {p.value for n in onnx.load(str(model)).graph.node for p in n.metadata_props
            if p.key == "pkg.torch.onnx.stack_trace"}


@pytest.fixture
def here(exported: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The exporting repository, entered: the recorded file is here."""
    monkeypatch.chdir(exported)
    return exported


@pytest.fixture
def elsewhere(exported: Path, repo: Path) -> Path:
    """Another repository holding only the model: the recorded file is on this machine, but not in it."""
    shutil.copy(exported / "model.onnx", repo / "model.onnx")
    return repo


def _moved(exported: Path, repo: Path, to: str) -> None:
    """model.onnx in repo, its metadata naming the source file as if exported from the folder `to`."""
    (repo / ".git").mkdir()
    model = onnx.load(str(exported / "model.onnx"))
    for node in model.graph.node:
        for prop in node.metadata_props:
            prop.value = prop.value.replace(str(exported), to)
    onnx.save(model, str(repo / "model.onnx"))
    assert all(f'File "{to}/src/model.py"' in trace for trace in _stack_traces(repo / "model.onnx"))


@pytest.fixture
def nowhere(exported: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The model as another machine exported it: its metadata names a path that does not exist here, even though a
    src/model.py does."""
    _moved(exported, tmp_path, "/home/someone/project")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "model.py").write_text(SOURCE)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _out(capsys: pytest.CaptureFixture, *args: str) -> str:
    assert main(["model.onnx", *args]) == 0  # warnings: below the default --fail-on error
    return capsys.readouterr().out


def test_the_exporter_records_the_python_line(exported: Path):
    assert f'File "{exported / "src" / "model.py"}", line {LINE}, in forward\n' \
           f'    return (x - mean) / torch.sqrt(var + 1e-12)' in _stack_traces(exported / "model.onnx")


def test_concise_names_the_model_and_node_and_the_recorded_line_here(here: Path, capsys: pytest.CaptureFixture):
    lines = _out(capsys, "--format", "concise").splitlines()
    assert [line.split(": ", 1)[0] for line in lines[:2]] == ["model.onnx:node_sqrt"] * 2
    assert [line.split(" [")[0].split(": ")[1] for line in lines[:2]] == ["PA105", "PA208"]
    assert all(line.endswith(f" (recorded at src/model.py:{LINE})") for line in lines[:2])
    assert lines[2].startswith("Found 2 findings")


@pytest.mark.parametrize("where", ["elsewhere", "nowhere"])
def test_concise_without_the_recorded_file(where: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture):
    request.getfixturevalue(where)
    lines = _out(capsys, "--format", "concise").splitlines()
    assert [line.split(": ", 1)[0] for line in lines[:2]] == ["model.onnx:node_sqrt"] * 2
    assert "recorded at" not in "".join(lines) and "model.py" not in "".join(lines)


def test_text_notes_the_recorded_line(here: Path, capsys: pytest.CaptureFixture):
    heads = [line for line in _out(capsys, "--no-color").splitlines() if line.startswith("  warning ")]
    assert heads == [f"  warning PA105 eps-missing  node 'node_sqrt' (Sqrt), recorded at src/model.py:{LINE}",
                     f"  warning PA208 statistic-overflow  node 'node_sqrt' (Sqrt), recorded at src/model.py:{LINE}"]


def test_github_annotates_the_model(here: Path, capsys: pytest.CaptureFixture):
    lines = _out(capsys, "--format", "github").splitlines()
    assert [line.split("::")[1] for line in lines[:2]] == [
        "warning file=model.onnx,line=1,title=PA105 eps-missing",
        "warning file=model.onnx,line=1,title=PA208 statistic-overflow"]
    assert all(f"At node 'node_sqrt' (Sqrt), recorded at src/model.py:{LINE}. Fix: " in line for line in lines[:2])


def test_github_without_the_recorded_file(elsewhere: Path, capsys: pytest.CaptureFixture):
    lines = _out(capsys, "--format", "github").splitlines()
    assert [line.split("::")[1].split(",")[0] for line in lines[:2]] == ["warning file=model.onnx"] * 2
    assert all("At node 'node_sqrt' (Sqrt). Fix: " in line for line in lines[:2])


def _sarif_results(capsys: pytest.CaptureFixture) -> list[dict]:
    return json.loads(_out(capsys, "--format", "sarif"))["runs"][0]["results"]


def test_sarif_locates_the_model_and_relates_the_recorded_line(here: Path, capsys: pytest.CaptureFixture):
    for result in _sarif_results(capsys):
        assert result["locations"] == [{
            "physicalLocation": {"artifactLocation": {"uri": "model.onnx", "uriBaseId": "%SRCROOT%"},
                                 "region": {"startLine": 1}},
            "logicalLocations": [{"name": "node_sqrt", "kind": "function", "fullyQualifiedName": "node_sqrt"}]}]
        assert result["relatedLocations"] == [{
            "id": 1, "message": {"text": RECORDED},
            "physicalLocation": {"artifactLocation": {"uri": "src/model.py", "uriBaseId": "%SRCROOT%"},
                                 "region": {"startLine": LINE}}}]


@pytest.mark.parametrize("where", ["elsewhere", "nowhere"])
def test_sarif_without_the_recorded_file(where: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture):
    request.getfixturevalue(where)
    for result in _sarif_results(capsys):
        assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "model.onnx"
        assert "relatedLocations" not in result


def test_json_has_no_source_and_relates_the_recorded_line(here: Path, capsys: pytest.CaptureFixture):
    for result in json.loads(_out(capsys, "--format", "json"))["results"]:
        assert (result["source_file"], result["source_line"]) == (None, None)
        assert result["related_locations"] == [{"file": "src/model.py", "line": LINE, "message": RECORDED}]


def test_a_comment_on_the_recorded_line_still_silences_it(exported: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture):
    _moved(exported, tmp_path, str(tmp_path))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "model.py").write_text(SOURCE.replace("1e-12)\n", "1e-12)  # precaudit: ignore[PA105]\n"))
    monkeypatch.chdir(tmp_path)
    lines = _out(capsys, "--format", "concise").splitlines()
    assert [line.split(" [")[0] for line in lines[:1]] == ["model.onnx:node_sqrt: PA208"]
    assert lines[1].startswith("Found 1 finding ")
