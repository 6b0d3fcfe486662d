"""Quantized models: the report says which parts are quantized and what the audit judges, and the float twin of
the same graph says nothing of the kind."""

from __future__ import annotations

from fixtures.quantized_models import int8_linear_layernorm
from precaudit.cli import main
from tests.helpers import run_json


def test_an_int8_matmulinteger_graph_is_named_quantized(tmp_path):
    path = int8_linear_layernorm(tmp_path / "int8.onnx")
    code, report = run_json([path], out_dir=tmp_path)
    assert report["quantized"] == [{"model": str(path), "ops": {"DynamicQuantizeLinear": 1, "MatMulInteger": 1},
                                    "integer_nodes": 1, "float_nodes": 11, "accumulator_casts": ["to_float"]}]
    # the float parts are audited as ever: the LayerNorm's eps 1e-12 is 0.0 in float16
    assert sorted((r["rule_id"], r["node_name"]) for r in report["results"]) == [("PA101", "add_eps"),
                                                                                 ("PA208", "add_eps")]
    assert code == 1


def test_the_text_report_says_what_is_audited(tmp_path, capsys):
    path = int8_linear_layernorm(tmp_path / "int8.onnx")
    main([str(path)])
    out = capsys.readouterr().out
    assert (f"{path}: quantized (1 DynamicQuantizeLinear, 1 MatMulInteger): 1 node computes in integers and is not "
            "judged as float; the audit covers the 11 float nodes (scales, rescales, norms, softmaxes); 1 Cast of an "
            "integer accumulator to float, which a float16 converter makes float16") in out


def test_the_float_twin_is_not_quantized(tmp_path):
    path = int8_linear_layernorm(tmp_path / "float.onnx", quantized=False)
    _, report = run_json([path], out_dir=tmp_path)
    assert "quantized" not in report
    assert sorted(r["rule_id"] for r in report["results"]) == ["PA101", "PA208"]


def test_traced_the_integer_accumulator_cast_to_float16_overflows(tmp_path):
    """|acc| of 64 int8 x uint8 products passes 65504: the Cast a float16 converter makes float16 overflows."""
    path = int8_linear_layernorm(tmp_path / "int8.onnx")
    _, report = run_json([path], "--trace", "--select", "PA901", out_dir=tmp_path)
    assert [(r["rule_id"], r["node_name"], r["inputs"]) for r in report["results"]] == \
        [("PA901", "to_float", "synthesized")]
