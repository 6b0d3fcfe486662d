"""check, keep-list, fix and the Python API run one pass: the same findings, node for node, under an inline
suppression, a per-node ignore, a per-model ignore, --select and --ignore."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import precaudit
from precaudit.cli import main


def _four_norms_and_a_log_softmax(path: Path) -> Path:
    """Four decomposed LayerNorms n0..n3 (eps 1e-12: PA101, PA208 each), then Log(Softmax) (PA201)."""
    nodes, x = [], "x"
    for i in range(4):
        p = f"n{i}/"
        nodes += [h.make_node("ReduceMean", [x], [p + "m"], name=p + "mean", axes=[-1]),
                  h.make_node("Sub", [x, p + "m"], [p + "c"], name=p + "sub"),
                  h.make_node("Mul", [p + "c", p + "c"], [p + "sq"], name=p + "sq"),
                  h.make_node("ReduceMean", [p + "sq"], [p + "v"], name=p + "var", axes=[-1]),
                  h.make_node("Add", [p + "v", "eps"], [p + "ve"], name=p + "add_eps"),
                  h.make_node("Sqrt", [p + "ve"], [p + "s"], name=p + "sqrt"),
                  h.make_node("Div", [p + "c", p + "s"], [p + "y"], name=p + "div")]
        x = p + "y"
    nodes += [h.make_node("Softmax", [x], ["p"], name="softmax", axis=-1), h.make_node("Log", ["p"], ["y"], name="log")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 8])],
                         [h.make_tensor_value_info("y", T.FLOAT, [2, 8])],
                         [numpy_helper.from_array(np.array(1e-12, np.float32), "eps")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


_REASON = re.compile(r"^(PA\d+) [\w-]+ at '(.*)'$")


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text(
        "[tool.precaudit]\n"
        'per-node-ignores = {"n1/*" = ["PA102"]}\n'
        'per-model-ignores = {"*.onnx" = ["PA208"]}\n')
    (tmp_path / ".git").mkdir()  # the project's root: the config is found from here and no further
    monkeypatch.chdir(tmp_path)
    return tmp_path


SELECT = ["--select", "PA1,PA2", "--ignore", "PA201"]
# keep-list judges the model as its converter leaves it (onnxruntime's clamps the eps to 5.96e-8: PA102), so every
# command is given that converter. PA102 at every norm but n1 (per-node), no PA208 (per-model), no PA201 (--ignore)
EXPECTED = {("PA102", f"n{i}/add_eps") for i in (0, 2, 3)}


def test_check_keep_list_fix_and_the_api_agree_node_for_node(project, capsys):
    model = _four_norms_and_a_log_softmax(project / "m.onnx")
    main([str(model), *SELECT, "--converter", "onnxruntime", "--format", "json", "-o", "check.json"])
    check = {(r["rule_id"], r["node_name"]) for r in json.loads((project / "check.json").read_text())["results"]}
    assert check == EXPECTED

    main(["keep-list", str(model), "--for", "onnxruntime", *SELECT, "--format", "json", "-o", "keep.json"])
    keep = json.loads((project / "keep.json").read_text())
    listed = {_REASON.match(r).groups() for e in keep["entries"] for r in e["reasons"]}
    listed |= {(f["rule_id"], f["node"]) for f in keep["not_fixed"]}
    assert listed == EXPECTED
    assert {n["name"] for n in keep["nodes"]} == {f"n{i}/{op}" for i in (0, 2, 3)
                                                  for op in ("mean", "sub", "sq", "var", "add_eps", "sqrt", "div")}

    main(["fix", str(model), "--dry-run", *SELECT, "--converter", "onnxruntime", "--format", "json"])
    fixed = json.loads(capsys.readouterr().out)
    planned = {(rule, r["node"]) for r in fixed["repairs"] for rule in r["rules"]}
    planned |= {(s["rule_id"], s["node"]) for s in fixed["left"]}
    assert planned == EXPECTED

    report = precaudit.audit(model, select=["PA1", "PA2"], ignore=["PA201"], converter="onnxruntime")
    assert {(f.rule_id, f.node_name) for f in report.findings} == EXPECTED
    assert report.exit_code == 0 and report.ok  # PA102 is a warning: below the default fail_on error


@pytest.mark.slow  # a PyTorch capture or training step: seconds
@pytest.mark.requires("torch")
def test_an_inline_suppression_holds_in_check_keep_list_and_the_api(tmp_path, monkeypatch, capsys):
    """`# precaudit: ignore[PA101]` on the Python line silences PA101 there for every command (keep-list listed
    the node before)."""
    source = tmp_path / "model.py"
    source.write_text(
        "import torch\n"
        "from torch import nn\n\n\n"
        "class HandLayerNorm(nn.Module):\n"
        "    def forward(self, x):\n"
        "        mean = x.mean(-1, keepdim=True)\n"
        "        var = ((x - mean) ** 2).mean(-1, keepdim=True)\n"
        "        return (x - mean) / torch.sqrt(var + 1e-12)  # precaudit: ignore[PA101]\n\n\n"
        "def make():\n"
        "    return HandLayerNorm(), (torch.randn(2, 8),)\n")
    (tmp_path / ".git").mkdir()
    monkeypatch.chdir(tmp_path)
    spec = f"{source}:make"
    main([spec, "--format", "json", "-o", "check.json"])
    check = {r["rule_id"] for r in json.loads((tmp_path / "check.json").read_text())["results"]}
    assert check == {"PA208"}
    main(["keep-list", spec, "--for", "pytorch", "--format", "json", "-o", "keep.json"])
    keep = json.loads((tmp_path / "keep.json").read_text())
    assert [_REASON.match(r).group(1) for e in keep["entries"] for r in e["reasons"]] == ["PA208"]
    assert {f.rule_id for f in precaudit.audit(spec).findings} == {"PA208"}
