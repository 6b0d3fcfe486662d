"""What keep-list does with the model its snippet writes: onnxruntime's converter places the Cast back to float16
of a kept node's output last, after an If whose body reads it (onnxruntime runs that; precaudit reads it too),
onnxconverter-common leaves such a read undefined (onnxruntime refuses: keep-list looks for a list that loads and
says which it printed), a converted model that crashes onnxruntime is 'NOT verified', not a dead keep-list."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from precaudit.cli import main


def _body_reads_a_later_value(path: Path) -> Path:
    """y = If(cond, then: v·2, else: v) where v = Cast(x) is made by the node after the If, as onnxruntime's
    float16 converter writes it: onnx.checker refuses the order, onnxruntime runs it."""
    vi = lambda name: h.make_tensor_value_info(name, T.FLOAT, [2])  # noqa: E731
    then = h.make_graph([h.make_node("Add", ["v", "v"], ["t"], name="double")], "then", [], [vi("t")])
    other = h.make_graph([h.make_node("Identity", ["v"], ["e"], name="pass")], "else", [], [vi("e")])
    graph = h.make_graph([h.make_node("If", ["cond"], ["y"], name="gate", then_branch=then, else_branch=other),
                          h.make_node("Cast", ["x"], ["v"], name="v_cast", to=T.FLOAT)], "late",
                         [vi("x"), h.make_tensor_value_info("cond", T.BOOL, [])], [vi("y")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    model.ir_version = 7
    onnx.save(model, str(path))
    return path


def test_a_body_reading_an_outer_value_made_later_is_read_as_onnxruntime_runs_it(tmp_path, capsys):
    import onnxruntime as ort

    path = _body_reads_a_later_value(tmp_path / "late.onnx")
    with pytest.raises(onnx.checker.ValidationError, match="topologically sorted"):
        onnx.checker.check_model(str(path))
    x = np.array([1.5, -2.0], np.float32)
    [y] = ort.InferenceSession(str(path)).run(None, {"x": x, "cond": np.array(True)})
    assert y.tolist() == [3.0, -4.0]
    from precaudit.frontends.onnx import load_onnx

    graph = load_onnx(str(path))
    # (onnx.helper writes a node's attributes sorted by name: else_branch first)
    assert [n.name for n in graph.nodes] == ["v_cast", "gate", "gate/else_branch/pass", "gate/then_branch/double"]
    assert graph.nodes[2].inputs[0] is graph.nodes[0].outputs[0] is graph.nodes[3].inputs[0]
    assert main([str(path), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["errors"] == []
