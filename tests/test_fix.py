"""precaudit fix: each repair on its fixture (the finding before, gone after, the node, before → after), the fixed
model's float32 outputs against the original, an emulated float16 run that is NaN before and clean after, hostile
names and paths, external data kept external, --dry-run, and real transformers exports."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from fixtures import fix_models
from fixtures.onnx_builders import chain_model, decomposed_layernorm, fused_norm, log_of, save
from precaudit.cli import main

SYNTHESIZED = 3  # fix's exit code: written, but its float32 check ran on synthesized inputs only


def fix_json(capsys, model: Path, *args: str, out: Path | None = None) -> tuple[int, dict]:
    """Exit code and the JSON report of `precaudit fix MODEL -o OUT ARGS --format json`."""
    out = out if out is not None else model.with_name(model.stem + "_fixed.onnx")
    code = main(["fix", str(model), "-o", str(out), *map(str, args), "--format", "json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out.strip() else {"stderr": captured.err}


def fix_text(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["fix", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def audit(capsys, model: Path, *args: str) -> set[tuple[str, str]]:
    """The (rule, node) findings of a plain audit of the model."""
    main([str(model), "--format", "json", "--exit-zero", *args])
    report = json.loads(capsys.readouterr().out)
    assert report["errors"] == []
    return {(r["rule_id"], r["node_name"]) for r in report["results"]}


def run_fp32(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, feeds)


def initializer(path: Path, name: str) -> np.ndarray:
    m = onnx.load(str(path), load_external_data=False)
    return numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == name))


def node(path: Path, name: str) -> onnx.NodeProto:
    return next(n for n in onnx.load(str(path), load_external_data=False).graph.node if n.name == name)


# ---- each repair on its fixture ------------------------------------------------------------------------------

def _ln_fp32(folder):
    return fix_models.layernorm(folder / "ln.onnx")


def _ln_fp16_chain(folder):
    return save(decomposed_layernorm(1e-6, dtype="fp16")[0], folder / "ln16.onnx")


def _fused_stash0(folder):
    return save(fused_norm("LayerNormalization", "fp16", epsilon=1e-12, stash_type=0), folder / "fused.onnx")


def _instance_norm(folder):
    return save(fused_norm("InstanceNormalization", "fp16", epsilon=1e-5), folder / "inorm.onnx")


def _eps_after_root(folder):
    m = chain_model([("Mul", ["x", "x"], "sq"), ("ReduceSum", ["sq", "axes"], "ss"), ("Sqrt", ["ss"], "n"),
                     ("Add", ["n", "eps"], "after"), ("Div", ["x", "after"], "div")], dtype="fp32",
                    consts={"eps": 1e-3})
    m.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), "axes"))
    return save(m, folder / "after.onnx")


def _l2_no_eps(folder):
    return save(chain_model([("ReduceL2", ["x"], "n", {"axes": [-1]}), ("Div", ["x", "n"], "div")]),
                folder / "l2.onnx")


def _naive_softmax(folder):
    return fix_models.hot_softmax(folder / "softmax.onnx", scale=1.0, dtype="fp16")


def _log_relu(folder):
    return save(chain_model([("Relu", ["x"], "r"), ("Log", ["r"], "log")]), folder / "logrelu.onnx")


def _div_relu(folder):
    return save(chain_model([("Relu", ["z"], "r"), ("Div", ["x", "r"], "div")], inputs=("x", "z")),
                folder / "divrelu.onnx")


def _max_guard_1e12(folder):
    return save(chain_model([("Abs", ["x"], "a"), ("Max", ["a", "eps"], "guard"), ("Div", ["x", "guard"], "div")],
                            dtype="fp32", consts={"eps": 1e-12}), folder / "maxguard.onnx")


def _mask_fill(folder):
    return save(chain_model([("Mul", ["x", "fill"], "masked_fill"), ("Softmax", ["masked_fill"], "p", {"axis": -1})],
                            dtype="fp32", consts={"fill": float(np.finfo(np.float32).min)}), folder / "mask.onnx")


def _folded_mask(folder):
    from fixtures.PA209_constant_out_of_range import folded_causal_mask
    return save(folded_causal_mask(float(np.finfo(np.float32).min)), folder / "folded.onnx")


def _mean_pooling(folder):
    from fixtures.PA304_division_by_count import pooling
    return save(pooling(), folder / "pooling.onnx")


# (builder, dtype, kind, rules, node, text in before, text in after)
REPAIRS = [
    (_ln_fp32, "fp16", "eps-raise", ["PA101"], "add_eps", "eps 1e-12 (initializer 'eps')", "eps 6.104e-05"),
    (_ln_fp16_chain, "fp16", "norm-float32", ["PA208", "PA102"], "add_eps", "computing in float16",
     "statistics in float32"),
    (_fused_stash0, "fp16", "stash-type", ["PA101"], "norm", "stash_type=0", "stash_type=1"),
    (_instance_norm, "fp16", "eps-raise", ["PA102"], "norm", "epsilon 1e-05", "epsilon 6.104e-05"),
    (_eps_after_root, "fp16", "eps-inside-root", ["PA104"], "after", "sqrt(var) + 0.001", "sqrt(var + 0.001)"),
    (_l2_no_eps, "fp16", "eps-add", ["PA105"], "n", "x / ||x|| with no eps", "x / max(||x||, 6.104e-05)"),
    (lambda f: save(log_of("Softmax"), f / "ls.onnx"), "fp16", "log-softmax", ["PA201"], "log", "Log(Softmax(x))",
     "LogSoftmax(x, axis -1)"),
    (lambda f: save(chain_model([("Sigmoid", ["x"], "s"), ("Log", ["s"], "log")]), f / "lsig.onnx"), "fp16",
     "log-sigmoid", ["PA202"], "log", "Log(Sigmoid(x))", "-Softplus(-x)"),
    (_naive_softmax, "fp16", "max-shift", ["PA203"], "softmax", "exp(x) / sum(exp(x))", "exp(x - max(x))"),
    (lambda f: fix_models.logsumexp(f / "lse0.onnx", keepdims=0), "fp16", "logsumexp-shift", ["PA204"], "lse",
     "log(sum(exp(x)))", "max(x) + log(sum(exp(x - max(x))))"),
    (lambda f: fix_models.logsumexp(f / "lse1.onnx", keepdims=1), "fp16", "logsumexp-shift", ["PA204"], "lse",
     "log(sum(exp(x)))", "max(x) + log(sum(exp(x - max(x))))"),
    (_log_relu, "fp16", "guard", ["PA301"], "log", "log(x), x from Relu", "log(max(x, 6.104e-05))"),
    (_div_relu, "fp16", "guard", ["PA303"], "div", "y / x, x from Relu", "y / max(x, 6.104e-05)"),
    (_mean_pooling, "fp16", "guard", ["PA304"], "mean", "y / x, x from ReduceSum", "y / max(x, 6.104e-05)"),
    (_max_guard_1e12, "fp16", "guard-raise", ["PA303"], "div", "clamps at 1e-12 (1/x at most 1e+12), 0.0 in float16",
     "clamps at 6.104e-05"),
    (_mask_fill, "fp16", "mask-fill", ["PA209"], "masked_fill", "fill -3.403e+38", "fill -65504, finfo(float16).min"),
    (_folded_mask, "fp16", "mask-fill", ["PA209"], "masked_scores",
     "fill -3.403e+38 (initializer 'causal', a mask of 64", "fill -65504, finfo(float16).min"),
]


@pytest.mark.parametrize("build, dtype, kind, rules, node_name, before, after", REPAIRS,
                         ids=[r[2] + "-" + "-".join(r[3]) for r in REPAIRS])
def test_each_repair_on_its_fixture(capsys, tmp_path, build, dtype, kind, rules, node_name, before, after):
    model = build(tmp_path)
    found = audit(capsys, model, "--dtype", dtype)
    assert {(r, node_name) for r in rules} <= found
    floor = ["--data-floor", "normal"] if kind == "guard-raise" else []  # a floor on data is raised only when asked
    code, report = fix_json(capsys, model, "--dtype", dtype, *floor)
    assert code == SYNTHESIZED and report["written"] and report["problems"] == []
    assert report["verified"] is False and report["inputs"]["source"] == "synthesized"
    [repair] = [r for r in report["repairs"] if r["kind"] == kind]
    assert repair["output_change"]["relative"] <= 1e-3 and repair["output_change"]["alone"]
    assert repair["node"] == node_name and repair["rules"] == rules
    assert before in repair["before"] and after in repair["after"]
    assert repair["still_flagged"] == []
    checked = repair["float32"]
    assert checked is not None and checked["within"] and checked["difference"] <= checked["bound"]
    fixed = Path(report["output"])
    onnx.checker.check_model(str(fixed), full_check=True)
    assert not {(r, node_name) for r in rules} & audit(capsys, fixed, "--dtype", dtype)


def test_an_eps_raise_writes_a_new_initializer_in_the_stored_dtype_and_leaves_the_shared_one(capsys, tmp_path):
    model = fix_models.shared_eps(tmp_path / "shared.onnx")
    code, report = fix_json(capsys, model)
    assert code == SYNTHESIZED
    [repair] = report["repairs"]
    assert repair["notes"] == ["'eps' stays as it is for 1 other reader"]
    fixed = Path(report["output"])
    new = initializer(fixed, "add_eps/precaudit_eps")
    assert new.dtype == np.float32 and new == np.float32(2.0 ** -14)  # the smallest normal float16, exactly
    assert initializer(fixed, "eps") == np.float32(1e-12)
    assert list(node(fixed, "bias_add").input) == ["x", "eps"]
    assert list(node(fixed, "add_eps").input) == ["var", "add_eps/precaudit_eps"]
    # in float16 the stored eps is the same number, and in a float16 model the new initializer is float16
    m16 = save(decomposed_layernorm(1e-12, dtype="fp16", eps_at="constant")[0], tmp_path / "ln16.onnx")
    _, report = fix_json(capsys, m16, "--select", "PA106", "--min-eps", "1e-4")
    [repair] = report["repairs"]
    assert repair["kind"] == "norm-float32" and "eps stored as 0.0 raised to 0.0001" in repair["after"]


def test_min_eps(capsys, tmp_path):
    model = fix_models.layernorm(tmp_path / "ln.onnx")
    code, report = fix_json(capsys, model, "--min-eps", "1e-4")
    assert code == SYNTHESIZED and report["repairs"][0]["after"].startswith("eps 0.0001 ")
    assert initializer(Path(report["output"]), "add_eps/precaudit_eps") == np.float32(1e-4)
    code, _out, err = fix_text(capsys, model, "-o", tmp_path / "x.onnx", "--min-eps", "1e-9")
    assert code == 2 and "--min-eps 1e-09: choose a value from 6.104e-05" in err


def test_what_fix_leaves_alone_says_why(capsys, tmp_path):
    model = fix_models.layernorm(tmp_path / "ln.onnx")
    code, report = fix_json(capsys, model)
    [left] = report["left"]
    assert left["rule_id"] == "PA208" and "a Cast to float32 written into it is a no-op" in left["reason"]
    assert left["keep_fp32"] == ["mean", "sub", "pow", "var", "add_eps", "sqrt", "div"]
    assert report["reaudit"] == {"before": 2, "fixed": 1, "remain": 1, "new": [],
                                 "remaining": [{"rule_id": "PA208", "node": "add_eps"}]}
    # log1p: ONNX has no Log1p op; with nothing to repair, nothing is written
    m = save(chain_model([("Add", ["x", "one"], "a"), ("Log", ["a"], "log")], consts={"one": 1.0}), tmp_path / "l.onnx")
    out = tmp_path / "l_fixed.onnx"
    code, report = fix_json(capsys, m, out=out)
    assert code == 0 and not report["written"] and not out.exists()
    assert report["repairs"] == [] and "ONNX has no Log1p op" in report["left"][0]["reason"]


# ---- float32 outputs and the emulated run -------------------------------------------------------------------

def test_fixed_float32_outputs_match_the_original(capsys, tmp_path):
    """Exact rewrites (max shift, LogSoftmax, -Softplus(-x), the mask fill at its softmax) in one model: its
    outputs agree within float32 rounding, checked here with onnxruntime apart from precaudit's own check."""
    model = fix_models.several(tmp_path / "several.onnx")
    code, report = fix_json(capsys, model)
    assert code == SYNTHESIZED and sorted(r["kind"] for r in report["repairs"]) == \
        ["log-sigmoid", "log-softmax", "mask-fill", "max-shift"]
    assert all(r["float32"]["within"] and r["float32"]["bound"] == 1e-5 for r in report["repairs"])
    [out] = report["float32"]["outputs"]
    assert out["name"] == "y" and out["relative"] < 1e-6
    x = {"x": np.random.default_rng(3).standard_normal((2, 8)).astype(np.float32)}
    [a], [b] = run_fp32(model, x), run_fp32(Path(report["output"]), x)
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_an_eps_raise_is_within_its_bound(capsys, tmp_path):
    """The norm's rows are scaled by sqrt((var + 1e-12)/(var + 6.1e-5)): the bound is computed from the variances
    the original computes on the same inputs, and the difference measured against it."""
    model = fix_models.layernorm(tmp_path / "ln.onnx")
    _code, report = fix_json(capsys, model)
    f32 = report["repairs"][0]["float32"]
    assert 0 < f32["difference"] <= f32["bound"] < 1e-3
    x = {"x": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
    [a], [b] = run_fp32(model, x), run_fp32(Path(report["output"]), x)
    var = x["x"].var(axis=-1, keepdims=True)
    np.testing.assert_allclose(b, a * np.sqrt((var + 1e-12) / (var + 2.0 ** -14)), rtol=1e-5)


def test_an_emulated_float16_run_that_is_nan_before_and_clean_after(capsys, tmp_path):
    model = fix_models.hot_softmax(tmp_path / "hot.onnx")
    code, report = fix_json(capsys, model, "--trace")
    assert code == SYNTHESIZED
    before, after = report["emulated"]["original"], report["emulated"]["fixed"]
    assert not before["outputs_finite"] and before["first_nonfinite"] == "exp" and before["output_error"] is None
    assert after["outputs_finite"] and after["nonfinite_fraction"] == 0 and after["output_error"] < 1e-2
    code, text, _ = fix_text(capsys, model, "-o", tmp_path / "hot2.onnx", "--trace")
    assert "emulated float16 (--trace, 1 synthesized sample (seed 0)):" in text
    assert "outputs finite  no (" in text and "first inf/NaN   'exp'" in text


def test_given_inputs_a_constant_row_divides_zero_by_zero_before_and_not_after(capsys, tmp_path):
    """eps 1e-12 is 0.0 in float16: a row of equal values gives 0/0 there; raised to 6.1e-5 it gives 0."""
    model = fix_models.layernorm(tmp_path / "ln.onnx")
    batch = tmp_path / "rows.npz"
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    x[1] = 3.0
    np.savez(batch, x=x)
    code, report = fix_json(capsys, model, "--trace", "--inputs", batch)
    assert code == 0 and report["float32"]["inputs"] == f"inputs from {batch}"
    assert not report["emulated"]["original"]["outputs_finite"]
    assert report["emulated"]["fixed"]["outputs_finite"]
    [a], [b] = run_fp32(model, {"x": x}), run_fp32(Path(report["output"]), {"x": x})
    # 0 / sqrt(0 + 1e-12) is 0 in float32 as well: the constant row is the same in both models there
    np.testing.assert_array_equal(a[1], 0.0)
    np.testing.assert_array_equal(b[1], 0.0)


# ---- hostile input --------------------------------------------------------------------------------------------

def test_names_with_control_characters_print_escaped(capsys, tmp_path):
    folder = tmp_path / "evil\x1b[31mdir"
    folder.mkdir()
    model = fix_models.hostile_names(folder / "m\nx.onnx")
    code, text, err = fix_text(capsys, model, "-o", folder / "fixed.onnx")
    assert code == SYNTHESIZED, err
    assert "\x1b" not in text and "\u202e" not in text and "\nerror PA999" not in text
    assert "node 'log\\nerror PA999 forged\\u202e' (Log)" in text and "'probs\\x1b[31m'" in text
    assert "evil\\x1b[31mdir/m\\nx.onnx" in text
    code, report = fix_json(capsys, model, out=folder / "fixed2.onnx")
    assert report["repairs"][0]["node"] == "log\nerror PA999 forged\u202e"  # JSON carries the raw name


def test_output_over_an_input_is_refused(capsys, tmp_path):
    model = fix_models.external_weight(tmp_path / "m.onnx")
    data = tmp_path / "weights.data"
    digest = hashlib.sha256(data.read_bytes()).hexdigest()
    os.link(model, tmp_path / "alias.onnx")
    for target in (model, data, tmp_path / "alias.onnx"):
        code, out, err = fix_text(capsys, model, "-o", target)
        assert code == 2 and out == ""
        assert "refusing to write the fixed model over one of the inputs" in err
    batch = tmp_path / "x.npz"
    np.savez(batch, x=np.zeros((2, 512), np.float32))
    code, _, err = fix_text(capsys, model, "-o", batch, "--inputs", batch)
    assert code == 2 and "over one of the inputs" in err
    assert hashlib.sha256(data.read_bytes()).hexdigest() == digest


# ---- external data ----------------------------------------------------------------------------------------

def test_external_weights_stay_external_and_the_data_file_is_unchanged(capsys, tmp_path):
    model = fix_models.external_weight(tmp_path / "m.onnx")
    data = tmp_path / "weights.data"
    assert data.stat().st_size == fix_models.WEIGHT_ROWS * fix_models.WEIGHT_COLS * 4 > 1 << 20
    before = (hashlib.sha256(data.read_bytes()).hexdigest(), data.stat().st_mtime_ns, data.stat().st_ino)
    code, report = fix_json(capsys, model, out=tmp_path / "fixed.onnx")
    assert code == SYNTHESIZED and report["written"] and report["external_data"] == ["weights.data"]
    fixed = tmp_path / "fixed.onnx"
    assert fixed.stat().st_size < 10_000  # the graph only: the weight is not in it
    [w] = [t for t in onnx.load(str(fixed), load_external_data=False).graph.initializer if t.name == "W"]
    assert w.data_location == onnx.TensorProto.EXTERNAL
    assert {e.key: e.value for e in w.external_data}["location"] == "weights.data"
    assert (hashlib.sha256(data.read_bytes()).hexdigest(), data.stat().st_mtime_ns, data.stat().st_ino) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fixed.onnx", "m.onnx", "weights.data"]
    x = {"x": np.random.default_rng(0).standard_normal((2, 512)).astype(np.float32)}
    np.testing.assert_allclose(run_fp32(fixed, x)[0], run_fp32(model, x)[0], rtol=1e-3, atol=1e-3)


def test_external_data_outside_the_fixed_models_folder(capsys, tmp_path):
    """A model reads external data only from inside its folder: a fixed model one folder up points into the
    model's folder; one in a sibling folder cannot reach the data and is refused (nothing copied)."""
    model = fix_models.external_weight(tmp_path / "models" / "m.onnx")
    code, report = fix_json(capsys, model, out=tmp_path / "fixed.onnx")
    assert code == SYNTHESIZED and report["external_data"] == ["models/weights.data"]
    onnx.checker.check_model(str(tmp_path / "fixed.onnx"), full_check=True)
    (tmp_path / "elsewhere").mkdir()
    code, _out, err = fix_text(capsys, model, "-o", tmp_path / "elsewhere" / "fixed.onnx")
    assert code == 2 and "cannot reach" in err and "Write the fixed model next to the original" in err
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_dry_run_writes_nothing(capsys, tmp_path):
    model = fix_models.layernorm(tmp_path / "ln.onnx")
    out = tmp_path / "fixed.onnx"
    code, text, _ = fix_text(capsys, model, "-o", out, "--dry-run")
    assert code == 0 and not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["ln.onnx"]
    assert "--dry-run: the plan only, nothing written" in text
    assert "repair  eps-raise  node 'add_eps' (Add)  PA101" in text and "after:  eps 6.104e-05" in text
    assert "plan: 1 repair for 1 of 2 findings; 1 left" in text
    code, text, _ = fix_text(capsys, model, "--dry-run")  # no -o needed for a plan
    assert code == 0 and "repair  eps-raise" in text
    code, _, err = fix_text(capsys, model)
    assert code == 2 and "give -o FIXED.onnx" in err


# ---- real exports ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    pytest.importorskip("torch")  # a fixture takes no marks: it skips as it is set up
    pytest.importorskip("transformers")
    from fixtures.torch_exports import HF_CASES, export

    folder = tmp_path_factory.mktemp("exports")
    cases = {c.name: c for c in HF_CASES}
    return {name: export(cases[name], "ts14", "fp32", folder) for name in ("hf_bert", "hf_gpt2_attention_mask")}


def test_a_bert_export_is_fixed_and_reaudits_clean_for_pa101(capsys, exports):
    """transformers BERT, TorchScript, opset 14, fp32: three decomposed LayerNorms with eps 1e-12, 0.0 in float16."""
    model = exports["hf_bert"]
    assert audit(capsys, model) >= {("PA101", f"/model/{n}/LayerNorm/Add") for n in
                                    ("embeddings", "encoder/layer.0/attention/output", "encoder/layer.0/output")}
    code, report = fix_json(capsys, model, "--trace")
    assert code == SYNTHESIZED and report["written"]
    assert [(r["kind"], r["rules"]) for r in report["repairs"]] == [("eps-raise", ["PA101"])] * 3
    assert all(r["float32"]["within"] for r in report["repairs"])
    assert report["reaudit"]["fixed"] == 3 and {f["rule_id"] for f in report["reaudit"]["remaining"]} == {"PA208"}
    fixed = Path(report["output"])
    onnx.checker.check_model(str(fixed), full_check=True)
    assert not any(rule == "PA101" for rule, _ in audit(capsys, fixed))
    assert report["float32"]["outputs"][0]["relative"] < 1e-3
    assert report["emulated"]["fixed"]["outputs_finite"]


def test_a_gpt2_export_gets_its_mask_fill_fixed_and_its_eps_raises_withheld(capsys, exports):
    """GPT-2 with an attention mask (TorchScript, opset 14, fp32): the eager mask fill finfo(float32).min is -inf
    in float16 (PA209) and the LayerNorms' eps 1e-5 subnormal (PA102). Random init keeps the residual stream's
    variance near 4e-4, so raising eps to 6.1e-5 moves the float32 outputs by 1-3 %: those raises are withheld
    (exit 1), each with the LayerNorm chain to keep in float32 instead, and the exact mask fill is written."""
    model = exports["hf_gpt2_attention_mask"]
    code, report = fix_json(capsys, model)
    assert code == 1 and report["written"]
    assert [r["kind"] for r in report["repairs"]] == ["mask-fill"]
    assert report["repairs"][0]["output_change"]["relative"] <= 1e-3
    withheld = report["withheld"]
    assert [w["kind"] for w in withheld] == ["eps-raise"] * 3
    for w in withheld:
        assert w["output_change"]["relative"] > 1e-3 and w["output_change"]["alone"]
        assert "beyond --tolerance 0.001" in w["reason"]
        assert w["keep_fp32_instead"][-1].endswith("/Div") and len(w["keep_fp32_instead"]) == 7
    remaining = {f["rule_id"] for f in report["reaudit"]["remaining"]}
    assert "PA209" not in remaining and "PA102" in remaining
    # with a tolerance that admits them, the same raises are written
    code, report = fix_json(capsys, model, "--tolerance", "0.05")
    assert code == SYNTHESIZED and sorted(r["kind"] for r in report["repairs"]) == ["eps-raise"] * 3 + ["mask-fill"]


def test_usage_errors_are_one_line(capsys, tmp_path):
    model = fix_models.layernorm(tmp_path / "ln.onnx")
    for args, says in [((model, "--dry-run", "--dtype", "fp32"), "--dtype fp32: fix repairs what a narrower dtype"),
                       (("fixtures/torch_src/hazards.py:hand_layernorm", "--dry-run"), "fix rewrites ONNX files"),
                       ((tmp_path / "missing.onnx", "--dry-run"), "no such file")]:
        code, out, err = fix_text(capsys, *args)
        assert code == 2 and out == "" and says in err and err.count("\n") == 1


def test_a_folded_mask_keeps_its_zeros_and_gets_the_target_fill(capsys, tmp_path):
    """The dynamo exporter's causal mask, 0 on and below the diagonal and finfo(float32).min above: the copy fix
    writes holds 0 and -65504 in the same places."""
    code, report = fix_json(capsys, _folded_mask(tmp_path))
    assert code == SYNTHESIZED
    fixed = initializer(Path(report["output"]), "causal/precaudit_fill")
    assert fixed.dtype == np.float32 and fixed.shape == (8, 8)
    assert np.array_equal(fixed, np.triu(np.full((8, 8), -65504.0, np.float32), k=1))


def _two_layers_one_fill(folder):
    """Two layers, each a decomposed LayerNorm (eps 1e-12: 0.0 in float16) then scores + mask → Softmax, both masks
    Where(allowed, 0, finfo(float32).min) of one shared fill; the second layer's mask is written first, as the dynamo
    exporter writes Gemma-2's, so the fill's repair is compared at the second layer's softmax."""
    from onnx import helper as h
    nodes = [h.make_node("Where", ["allowed", "zero", "fill"], ["mask1"], name="mask_layer1"),
             h.make_node("Where", ["allowed", "zero", "fill"], ["mask0"], name="mask_layer0")]
    inp = "x"
    for k in (0, 1):
        p = f"l{k}_"
        nodes += [h.make_node("ReduceMean", [inp], [p + "mean"], name=p + "mean", axes=[-1]),
                  h.make_node("Sub", [inp, p + "mean"], [p + "d"], name=p + "sub"),
                  h.make_node("Mul", [p + "d", p + "d"], [p + "sq"], name=p + "square"),
                  h.make_node("ReduceMean", [p + "sq"], [p + "var"], name=p + "var", axes=[-1]),
                  h.make_node("Add", [p + "var", "eps"], [p + "ve"], name=p + "add_eps"),
                  h.make_node("Sqrt", [p + "ve"], [p + "sd"], name=p + "sqrt"),
                  h.make_node("Div", [p + "d", p + "sd"], [p + "ln"], name=p + "normalize"),
                  h.make_node("Add", [p + "ln", f"mask{k}"], [p + "scores"], name=p + "masked_scores"),
                  h.make_node("Softmax", [p + "scores"], [p + "p" if k == 0 else "y"], name=p + "softmax", axis=-1)]
        inp = p + "p"
    inits = [numpy_helper.from_array(np.tril(np.ones((8, 8), bool)), "allowed"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "fill"),
             numpy_helper.from_array(np.array(1e-12, np.float32), "eps")]
    graph = h.make_graph(nodes, "two_layers", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8, 8])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 8, 8])], inits)
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 10
    return save(m, folder / "two_layers.onnx")


def test_a_fill_every_layer_reads_is_checked_by_its_own_change(capsys, tmp_path):
    """The fill reaches the second layer's softmax also through the first layer, whose eps another repair raised:
    the mask fill is judged exact by what it changes itself, and the model is written."""
    # the second layer's eps raise moves its output by 1.0e-3 on this input: the tolerance here is the test's
    code, report = fix_json(capsys, _two_layers_one_fill(tmp_path), "--tolerance", "0.01")
    assert code == SYNTHESIZED and report["written"], report.get("problems")
    kinds = sorted(r["kind"] for r in report["repairs"])
    assert kinds == ["eps-raise", "eps-raise", "mask-fill"]
    [fill] = [r for r in report["repairs"] if r["kind"] == "mask-fill"]
    assert fill["node"] == "mask_layer1" and fill["float32"]["within"] and fill["float32"]["difference"] == 0


@pytest.mark.parametrize("ir_version", [3, 8])
def test_an_eps_inside_an_if_body_is_raised_in_a_valid_body(capsys, tmp_path, ir_version):
    """A verifier branch's LayerNorm inside If's then-branch: at IR version 3 a body can hold no new initializer
    (onnx.checker: 'in initializer but not in graph input'), so the new eps is a Constant node at the body's head;
    at IR 8 it is an initializer of the body. Either way the fixed model passes the full check and runs."""
    model = fix_models.verifier_branch(tmp_path / f"verifier{ir_version}.onnx", ir_version=ir_version)
    _code, report = fix_json(capsys, model, "--select", "PA101")
    assert report.get("problems") == [] and report["written"], report
    [repair] = report["repairs"]
    word = "Constant node" if ir_version <= 3 else "initializer"
    assert repair["node"] == "If_32/then_branch/Add_41"
    assert repair["after"] == f"eps 6.104e-05 (new {word} 'If_32/then_branch/Add_41/precaudit_eps', float32)"
    fixed = Path(report["output"])
    onnx.checker.check_model(str(fixed), full_check=True)
    then = next(a.g for a in onnx.load(str(fixed)).graph.node[-1].attribute if a.name == "then_branch")
    add = next(n for n in then.node if n.name == "Add_41")
    assert list(add.input) == ["v", "If_32/then_branch/Add_41/precaudit_eps"]
    if ir_version <= 3:
        assert then.node[0].op_type == "Constant" and list(then.node[0].output) == [add.input[1]]
        assert not then.initializer
    else:
        assert [t.name for t in then.initializer] == [add.input[1]]
    assert ("PA101", "If_32/then_branch/Add_41") not in audit(capsys, fixed)


def _body(graph: onnx.GraphProto, node_name: str, attr: str) -> onnx.GraphProto:
    return next(a.g for n in graph.node if n.name == node_name for a in n.attribute if a.name == attr)


def _ln(v: np.ndarray, eps: float) -> np.ndarray:
    c = v - v.mean(-1, keepdims=True)
    return c / np.sqrt((c * c).mean(-1, keepdims=True) + eps)


@pytest.mark.parametrize("ir_version", [3, 7])
def test_eps_raises_in_nested_bodies_that_read_outer_values(capsys, tmp_path, ir_version):
    """hey_jarvis: a LayerNorm in the main graph and one in an If body, each eps a Constant node. Raising the first
    rebuilt the main graph's node list (its Constant dropped), which copied the If: the body's new eps went into a
    copy no longer in the model and onnx.checker refused the result ('Nodes in a graph must be topologically sorted,
    however input 'If_32/then_branch/Add_41/precaudit_eps''). Here one level deeper, the bodies reading the outer
    graph's weights: each new eps is in the body that reads it (an initializer there; at IR 3 a Constant node at
    the body's head), the model passes the full check, onnxruntime runs it, and the float32 check measured it."""
    model = fix_models.nested_verifier(tmp_path / f"nested{ir_version}.onnx", ir_version=ir_version)
    batch = tmp_path / "x.npz"
    x = np.random.default_rng(2).standard_normal((1, 16)).astype(np.float32)
    np.savez(batch, x=x)
    code, report = fix_json(capsys, model, "--select", "PA102", "--inputs", batch)
    assert code == 0 and report["written"] and report["problems"] == [] and report["verified"]
    assert [r["node"] for r in report["repairs"]] == [
        "ln0_add_eps", "If_32/then_branch/ln1_add_eps", "If_32/then_branch/inner/then_branch/ln2_add_eps"]
    fixed = Path(report["output"])
    onnx.checker.check_model(str(fixed), full_check=True)
    m = onnx.load(str(fixed))
    then = _body(m.graph, "If_32", "then_branch")
    inner = _body(then, "inner", "then_branch")
    for graph, tag in ((m.graph, "ln0_"), (then, "ln1_"), (inner, "ln2_")):
        add = next(n for n in graph.node if n.name == tag + "add_eps")
        new = add.input[1]
        assert new.endswith("add_eps/precaudit_eps") and not any(n.name == tag + "eps" for n in graph.node)
        if ir_version <= 3:
            [head] = [n for n in graph.node if n.op_type == "Constant"]
            assert list(head.output) == [new] and list(graph.node).index(head) < list(graph.node).index(add)
            value = numpy_helper.to_array(head.attribute[0].t)
        else:
            [init] = [t for t in graph.initializer if t.name == new]
            value = numpy_helper.to_array(init)
        assert value == np.float32(2.0 ** -14)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    [a], [b] = run_fp32(model, {"x": x}), run_fp32(fixed, {"x": x})

    def forward(eps: float) -> np.ndarray:  # the model in float64: three LayerNorms, the If's then-branches taken
        n1 = _ln(_ln(x.astype(np.float64), eps) @ inits["W"] + inits["B"], eps)
        return _ln(n1 * inits["gamma"], eps)

    np.testing.assert_allclose(a, forward(1e-5), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(b, forward(2.0 ** -14), rtol=1e-4, atol=1e-5)
    [out] = report["float32"]["outputs"]
    assert out["max_abs_difference"] == pytest.approx(float(np.max(np.abs(a - b))), rel=1e-6)
    # each repair reaches the output through an If, so each is measured in the whole model
    assert [r["output_change"]["alone"] for r in report["repairs"]] == [False] * 3
    assert {r["output_change"]["relative"] for r in report["repairs"]} == {out["relative"]}


# ---- the float32 gate: a clamp on data, the user's inputs, the tolerance --------------------------------------

def test_a_floor_on_data_is_kept_by_default_with_the_nodes_to_keep(capsys, tmp_path):
    """Max(power, 1e-12) → Log: the floor is the author's, on data. fix does not raise it unasked: it says what the
    floor means (-120 dB) and what a raise would make of it (-42 dB), and names the nodes to keep in float32."""
    model = fix_models.power_log(tmp_path / "power.onnx")
    out = tmp_path / "power_fixed.onnx"
    code, report = fix_json(capsys, model, out=out)
    assert code == 0 and not report["written"] and not out.exists()
    assert report["repairs"] == [] and report["withheld"] == []
    [left] = report["left"]
    assert left["rule_id"] == "PA301" and left["keep_fp32"] == ["clamp", "log"]
    assert ("clamps the data at 1e-12 (log -27.6, -120.0 dB as a power), 0.0 in float16" in left["reason"]
            and "(to the smallest normal 6.104e-05: log -9.7, -42.1 dB as a power)" in left["reason"])


def test_a_raised_floor_that_moves_the_users_outputs_is_withheld(capsys, tmp_path):
    """Asked to raise the floor to float16's smallest subnormal (-72 dB), on speech with silent and quiet frames:
    the raise alone moves the float32 outputs by 0.398 of their largest |value|, so it is not written (exit 1) and
    the float32 keep is offered instead. The same raise checked only on synthesized N(0, 1) frames, where no power
    is below 6e-8, changes nothing measurable: written, and exit 3 says it was never checked on real data."""
    model = fix_models.power_log(tmp_path / "power.onnx")
    speech = fix_models.speech_frames(tmp_path / "speech.npz")
    out = tmp_path / "power_fixed.onnx"
    code, report = fix_json(capsys, model, "--data-floor", "subnormal", "--inputs", speech, out=out)
    assert code == 1 and not report["written"] and not out.exists()
    [w] = report["withheld"]
    assert w["kind"] == "guard-raise" and w["keep_fp32_instead"] == ["clamp", "log"]
    assert w["after"].startswith("clamps at 5.96e-08 (log -16.6, -72.2 dB as a power;")
    assert w["output_change"]["output"] == "y" and round(w["output_change"]["relative"], 3) == 0.398
    assert w["reason"] == "it changes the float32 outputs by 0.398 (relative) at 'y', beyond --tolerance 0.001"
    assert report["inputs"]["source"] == "user" and report["verified"] is False
    code, text, _ = fix_text(capsys, model, "-o", out, "--data-floor", "subnormal")
    assert code == 3 and out.exists()
    assert "float32 outputs change: 0 relative (this repair alone), within --tolerance 0.001" in text
    assert "NOT CHECKED ON YOUR DATA: the float32 check ran on 1 synthesized sample (seed 0); guessed B=1" in text


def test_a_repair_checked_on_the_users_inputs_is_verified(capsys, tmp_path):
    """An exact rewrite (max shift) on the user's own batch: written, verified, exit 0."""
    model = fix_models.hot_softmax(tmp_path / "hot.onnx")
    batch = tmp_path / "batch.npz"
    np.savez(batch, x=np.random.default_rng(5).standard_normal((2, 8)).astype(np.float32))
    code, report = fix_json(capsys, model, "--inputs", batch)
    assert code == 0 and report["written"] and report["verified"] is True
    assert report["float32"]["synthesized"] is False and report["inputs"]["files"] == [str(batch)]
    [repair] = report["repairs"]
    assert repair["kind"] == "max-shift" and repair["output_change"]["relative"] < 1e-6


def test_a_softmax_over_sum_plus_eps_is_left_with_why(capsys, tmp_path):
    """exp / (sum(exp) + eps) is PA203's (its pattern sees the Add), but the max shift is not exact there: the eps
    would be scaled by exp(-max). fix leaves it and says so."""
    from fixtures.PA216_exp_sum_without_max import CASES

    [case] = [c for c in CASES if c.name == "softmax_with_eps_fp16"]
    code, report = fix_json(capsys, case.build(tmp_path), out=tmp_path / "fixed.onnx")
    assert code == 0 and report["repairs"] == []
    [left] = report["left"]
    assert left["rule_id"] == "PA203" and left["reason"].startswith("the divisor is sum(exp(x)) + eps: the max shift")
