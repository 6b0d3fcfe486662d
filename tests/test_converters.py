"""--converter: each converter's constant clamp, default block list and Cast handling, in the finding and its reason.

The numbers a converter writes were read off the real converters (onnxconverter-common 1.16.0, onnxruntime
1.32.0's transformers float16 converter, nvidia-modelopt 0.47.0) run on these same models in a scratch
environment; test_real_converters_write_what_the_model_says checks them again wherever those packages import.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from fixtures.onnx_builders import chain_model, decomposed_layernorm, save
from fixtures.PA304_division_by_count import pooling
from precaudit.cli import main
from precaudit.converters import CONVERTER_NAMES, converter_named
from tests.helpers import run_json

OCC, MODELOPT = converter_named("onnxconverter-common").title, converter_named("modelopt").title  # name + version

# What each converter stores for an fp32 eps of 1e-12, by where the eps lives (read off the converted models).
STORED_EPS = {
    "onnxconverter-common": {"initializer": 1.1920928955078125e-07, "constant": 1.1920928955078125e-07},
    "onnxruntime": {"initializer": 5.960464477539063e-08, "constant": 5.960464477539063e-08},
    "modelopt": {"initializer": 5.960464477539063e-08, "constant": 0.0},  # a Constant node is cast at run time
}


def _results(report: dict) -> dict[str, dict]:
    return {r["rule_id"]: r for r in report["results"]}


@pytest.mark.parametrize("converter", sorted(STORED_EPS))
@pytest.mark.parametrize("eps_at", ["initializer", "constant"])
def test_an_eps_of_1e_12_is_judged_as_the_converter_stores_it(converter, eps_at, tmp_path):
    m, _ = decomposed_layernorm(1e-12, dtype="fp32", eps_at=eps_at, opset=14)
    path = save(m, tmp_path / "ln.onnx")
    _, report = run_json([path], "--converter", converter, "--select", "PA101,PA102", out_dir=tmp_path)
    stored = STORED_EPS[converter][eps_at]
    found = _results(report)
    rule = "PA101" if stored == 0 else "PA102"
    assert set(found) == {rule}
    values = found[rule]["values"]
    assert values["eps"] == pytest.approx(1e-12) and values["eps_rounded"] == pytest.approx(stored)
    if stored:
        assert values["eps_converted"] == pytest.approx(1e-7 if converter == "onnxconverter-common" else 5.96e-8)
        assert "clamps" in values["eps_source"] or "clips" in values["eps_source"]
        assert "1e-12 → " in found[rule]["message"]


def test_plain_rounds_the_eps_to_zero(tmp_path):
    m, _ = decomposed_layernorm(1e-12, dtype="fp32", opset=14)
    _, report = run_json([save(m, tmp_path / "ln.onnx")], "--select", "PA101,PA102", out_dir=tmp_path)
    assert set(_results(report)) == {"PA101"}
    assert _results(report)["PA101"]["values"]["eps_converted"] is None


def test_the_reason_names_the_converter(tmp_path):
    m, _ = decomposed_layernorm(1e-12, dtype="fp32", opset=14)
    _, report = run_json([save(m, tmp_path / "ln.onnx")], "--converter", "onnxconverter-common",
                         "--select", "PA102", out_dir=tmp_path)
    reason = report["results"][0]["values"]["compute_reason"]
    assert reason == f"--dtype fp16: float32 tensors run as float16 converted by {OCC}"
    assert report["settings"]["converter"] == "onnxconverter-common"


def _long_cumsum() -> onnx.ModelProto:
    m = chain_model([("CumSum", ["x", "axis"], "running")], dtype="fp32")
    m.graph.initializer.append(numpy_helper.from_array(np.array(1, np.int64), "axis"))
    for vi in (*m.graph.input, *m.graph.output):
        vi.type.tensor_type.shape.dim[1].dim_value = 4096
    return m


@pytest.mark.parametrize("converter,fires", [("plain", True), ("onnxconverter-common", False),
                                             ("onnxruntime", False), ("modelopt", True)])
def test_a_cumsum_in_the_default_block_list_runs_in_float32(converter, fires, tmp_path):
    """CumSum is in onnxconverter-common's and onnxruntime's DEFAULT_OP_BLOCK_LIST; modelopt converts it (its
    schema allows float16 since opset 14)."""
    path = save(_long_cumsum(), tmp_path / "cumsum.onnx")
    _, report = run_json([path], "--converter", converter, "--select", "PA214", out_dir=tmp_path)
    assert [r["node_name"] for r in report["results"]] == (["running"] if fires else [])


def test_the_block_list_reason_lists_the_ops(tmp_path):
    from precaudit.analysis.compute_dtype import DtypeResolver
    from precaudit.dtypes import format_named
    from precaudit.frontends.onnx import load_onnx

    graph = load_onnx(str(save(_long_cumsum(), tmp_path / "cumsum.onnx")))
    node = next(n for n in graph.nodes if n.op_type == "CumSum")
    reason = DtypeResolver(graph, format_named("fp16"), converter="onnxconverter-common").of_node(node).reason
    assert reason == (f"kept in float32 by {OCC}'s default op_block_list (RandomUniformLike, "
                      "NonMaxSuppression, TopK, RoiAlign, Resize, Range, CumSum, Min, Max, Upsample and 18 ai.onnx.ml "
                      "ops)")
    ort = DtypeResolver(graph, format_named("fp16"), converter="onnxruntime").of_node(node).reason
    assert "Resize" not in ort and "and 19 ai.onnx.ml ops" in ort


@pytest.mark.parametrize("guard,converter,fires", [
    ("Clip", "plain", True),  # clamp(min=1e-9) is 0.0 in float16
    ("Clip", "onnxconverter-common", False),  # 1e-9 → 1e-7: survives
    ("Clip", "onnxruntime", False),  # 1e-9 → 5.96e-8, the smallest subnormal: survives
    ("Max", "onnxconverter-common", False),  # Max is in the block list: the guard runs in float32
    ("Max", "modelopt", False),  # an initializer of 1e-9 becomes 5.96e-8
])
def test_a_mean_pooling_guard_as_the_converter_leaves_it(guard, converter, fires, tmp_path):
    path = save(pooling(guard=guard), tmp_path / "pool.onnx")
    _, report = run_json([path], "--converter", converter, "--select", "PA304", out_dir=tmp_path)
    assert [r["rule_id"] for r in report["results"]] == (["PA304"] if fires else [])


def _upcast_island() -> onnx.ModelProto:
    """An fp32 graph that narrows x to float16 and widens it back before a norm chain (a mixed-precision export)."""
    m, _ = decomposed_layernorm(1e-12, dtype="fp32", opset=14)
    cast_nodes = [h.make_node("Cast", ["x_in"], ["x16"], name="down", to=T.FLOAT16),
                  h.make_node("Cast", ["x16"], ["x"], name="up", to=T.FLOAT)]
    nodes = [*cast_nodes, *m.graph.node]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    m.graph.input[0].name = "x_in"
    return m


@pytest.mark.parametrize("converter,rule,words", [
    ("plain", None, None),  # the widening Cast starts a float32 island: eps 1e-12 is fine there
    ("onnxruntime", "PA102", "rewrites it to Cast(to=float16)"),
    ("onnxconverter-common", "PA102", "retypes its output to float16"),
    ("modelopt", "PA102", "removes it"),
])
def test_no_converter_keeps_an_upcast(converter, rule, words, tmp_path):
    path = save(_upcast_island(), tmp_path / "island.onnx")
    _, report = run_json([path], "--converter", converter, "--select", "PA101,PA102", out_dir=tmp_path)
    assert [r["rule_id"] for r in report["results"]] == ([rule] if rule else [])
    if words:
        reason = report["results"][0]["values"]["compute_reason"]
        assert "the Cast to float32 at 'up' starts no island" in reason and words in reason


def _layernorm_with_initializers(eps: float = 1e-12, path: Path | None = None) -> onnx.ModelProto:
    """modelopt's replace_layernorm_pattern form: exponent, eps, scale and bias are initializers."""
    nodes = [h.make_node("ReduceMean", ["x"], ["m"], name="mean", axes=[-1]),
             h.make_node("Sub", ["x", "m"], ["d"], name="sub"),
             h.make_node("Pow", ["d", "two"], ["d2"], name="pow"),
             h.make_node("ReduceMean", ["d2"], ["v"], name="var", axes=[-1]),
             h.make_node("Add", ["v", "eps"], ["ve"], name="add_eps"),
             h.make_node("Sqrt", ["ve"], ["s"], name="sqrt"),
             h.make_node("Div", ["d", "s"], ["n"], name="div"),
             h.make_node("Mul", ["n", "g"], ["ng"], name="scale"),
             h.make_node("Add", ["ng", "b"], ["y"], name="bias")]
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(eps, np.float32), "eps"),
             numpy_helper.from_array(np.ones(16, np.float32), "g"), numpy_helper.from_array(np.zeros(16, np.float32), "b")]
    graph = h.make_graph(nodes, "ln", [h.make_tensor_value_info("x", T.FLOAT, [2, 16])],
                         [h.make_tensor_value_info("y", T.FLOAT, [2, 16])], inits)
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 14)])
    m.ir_version = 8
    return m


def test_modelopt_fuses_a_decomposed_layernorm_into_float32_statistics(tmp_path):
    """modelopt 0.47.0 turned this chain into one LayerNormalization(epsilon=1e-12) (checked); the TorchScript
    form with Constant nodes for the exponent and eps it leaves alone (checked too)."""
    path = save(_layernorm_with_initializers(), tmp_path / "ln.onnx")
    _, plain = run_json([path], "--select", "PA101,PA102,PA208", out_dir=tmp_path)
    assert {r["rule_id"] for r in plain["results"]} == {"PA101", "PA208"}
    _, fused = run_json([path], "--converter", "modelopt", "--select", "PA101,PA102,PA208", out_dir=tmp_path)
    assert fused["results"] == []
    from precaudit.analysis.compute_dtype import DtypeResolver
    from precaudit.dtypes import format_named
    from precaudit.frontends.onnx import load_onnx
    graph = load_onnx(str(path))
    reason = DtypeResolver(graph, format_named("fp16"), converter="modelopt").of_node(graph.nodes[4]).reason
    assert "fuses the decomposed LayerNorm 'mean' … 'bias' into one LayerNormalization" in reason
    constants, _ = decomposed_layernorm(1e-12, dtype="fp32", eps_at="constant", opset=14)
    _, unfused = run_json([save(constants, tmp_path / "c.onnx")], "--converter", "modelopt", "--select", "PA101",
                          out_dir=tmp_path)
    assert [r["rule_id"] for r in unfused["results"]] == ["PA101"]


def test_modelopt_keeps_a_node_reading_a_large_initializer(tmp_path):
    m = chain_model([("Add", ["x", "fill"], "scores"), ("Softmax", ["scores"], "p", {"axis": -1})], dtype="fp32",
                    consts={"fill": -1e9})
    path = save(m, tmp_path / "mask.onnx")
    from precaudit.analysis.compute_dtype import DtypeResolver
    from precaudit.dtypes import format_named
    from precaudit.frontends.onnx import load_onnx
    graph = load_onnx(str(path))
    reason = DtypeResolver(graph, format_named("fp16"), converter="modelopt").of_node(graph.nodes[0]).reason
    assert reason == (f"kept in float32 by {MODELOPT}'s InitializerRangeRule: it reads initializer "
                      "'fill' (|v| = 1e+09), beyond init_max 65504")


def test_usage_errors_are_one_line(tmp_path, capsys):
    m, _ = decomposed_layernorm(1e-12, dtype="fp32", opset=14)
    path = save(m, tmp_path / "ln.onnx")
    assert main([str(path), "--converter", "tflite"]) == 2
    assert "--converter: must be one of plain, onnxconverter-common, onnxruntime, olive, modelopt, got 'tflite'" \
        in capsys.readouterr().err
    assert main([str(path), "--converter", "onnxruntime", "--dtype", "bf16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "converts to float16 only, not bfloat16" in err
    assert main([str(path), "--converter", "modelopt", "--dtype", "bf16", "--select", "PA101"]) == 0  # bf16: converted, 1e-12 is normal there
    capsys.readouterr()
    assert main([str(path), "--converter", "onnxruntime", "--dtype", "fp32"]) == 0  # nothing to convert


def test_the_converter_key_in_the_pyproject(tmp_path, monkeypatch, capsys):
    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.precaudit]\nconverter = "onnxconverter-common"\n')
    monkeypatch.chdir(tmp_path)
    assert main(["--show-settings"]) == 0
    assert 'converter          = "onnxconverter-common"' in capsys.readouterr().out
    (tmp_path / "pyproject.toml").write_text('[tool.precaudit]\nconverter = "tf"\n')
    assert main(["--show-settings"]) == 2
    assert "converter: must be one of plain, onnxconverter-common" in capsys.readouterr().err


def test_every_converter_name_has_a_model():
    for name in CONVERTER_NAMES:
        assert converter_named(name).name == name
    clamp = converter_named("onnxconverter-common").clamps["fp16"]
    assert [clamp.apply(v) for v in (1e-12, -1e-12, 0.0, 1e5, -3.4e38, -math.inf)] == \
        [1e-7, -1e-7, 0.0, 1e4, -1e4, -math.inf]
    modelopt = converter_named("modelopt").clamps["fp16"]
    assert modelopt.apply(-1e-12) == 5.96e-08 and not modelopt.applies_to("Constant node 'c'")


# --- the real converters, where they install (a scratch environment: they are no dependency of precaudit) ------

def _stored(model: onnx.ModelProto, name: str) -> float:
    for init in model.graph.initializer:
        if init.name == name:
            return float(numpy_helper.to_array(init).reshape(-1)[0])
    for node in model.graph.node:
        if node.name == name:
            return float(numpy_helper.to_array(node.attribute[0].t).reshape(-1)[0])
    raise KeyError(name)


@pytest.mark.parametrize("converter", sorted(STORED_EPS))
def test_real_converters_write_what_the_model_says(converter, tmp_path):
    for eps_at, where in (("initializer", "eps"), ("constant", "eps_const")):
        m, _ = decomposed_layernorm(1e-12, dtype="fp32", eps_at=eps_at, opset=14)
        path = save(m, tmp_path / f"{eps_at}.onnx")
        if converter == "onnxconverter-common":
            float16 = pytest.importorskip("onnxconverter_common.float16")
            out = float16.convert_float_to_float16(onnx.load(str(path)))
        elif converter == "onnxruntime":
            float16 = pytest.importorskip("onnxruntime.transformers.float16")
            out = float16.convert_float_to_float16(onnx.load(str(path)))
        else:
            autocast = pytest.importorskip("modelopt.onnx.autocast")
            out = autocast.convert_to_mixed_precision(onnx_path=str(path), data_max=float("inf"))
        assert _stored(out, where) == STORED_EPS[converter][eps_at]
