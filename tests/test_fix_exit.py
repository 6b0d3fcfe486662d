"""precaudit fix's exit code and its one stderr line: a run asked for a fixed model that writes nothing while error
findings remain exits 1 (as `ruff --fix` does when violations remain), and every exit 1 says why on stderr; the
tolerance bounds the written model, not each repair alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import numpy_helper

from fixtures import fix_models
from fixtures.onnx_builders import chain_model, save
from precaudit.cli import main


def _unguarded_sqrt(folder: Path) -> Path:
    """sqrt(x·x + 1e-12): the eps is 0.0 in float16 (PA305, an error) and guards data of unknown sign, which fix
    leaves to the author."""
    return save(chain_model([("Mul", ["x", "x"], "p"), ("Add", ["p", "eps"], "guard"), ("Sqrt", ["guard"], "root")],
                            dtype="fp32", consts={"eps": 1e-12}), folder / "sqrt.onnx")


def test_nothing_repaired_with_an_error_left_exits_1_and_says_why_on_stderr(capsys, tmp_path):
    model, out = _unguarded_sqrt(tmp_path), tmp_path / "fixed.onnx"
    assert main(["fix", str(model), "-o", str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.err == (f"precaudit: {model}: nothing repaired and 1 error finding remains (PA305 at 'guard'): "
                            "no model written\n")
    assert "  left    PA305 guard-eps-underflow  node 'guard' (Add)" in captured.out
    assert captured.out.endswith("  nothing repaired: no model written\n") and not out.exists()
    # a plan was all a dry run asked for
    assert main(["fix", str(model), "--dry-run"]) == 0 and capsys.readouterr().err == ""


def test_nothing_to_repair_but_warnings_exits_0(capsys, tmp_path):
    """A floor on data, left alone by default: PA301 is a warning, so nothing written is no failure."""
    model = fix_models.power_log(tmp_path / "power.onnx")
    assert main(["fix", str(model), "-o", str(tmp_path / "fixed.onnx")]) == 0
    assert capsys.readouterr().err == ""


def test_a_withheld_repair_says_so_on_stderr(capsys, tmp_path):
    model = fix_models.power_log(tmp_path / "power.onnx")
    speech = fix_models.speech_frames(tmp_path / "speech.npz")
    code = main(["fix", str(model), "-o", str(tmp_path / "fixed.onnx"), "--data-floor", "subnormal",
                 "--inputs", str(speech)])
    assert code == 1
    assert capsys.readouterr().err == (
        f"precaudit: {model}: 1 repair withheld (guard-raise at 'log': it changes the float32 outputs by 0.398 "
        "(relative) at 'y', beyond --tolerance 0.001); no model written\n")


def test_repairs_each_within_the_tolerance_together_beyond_it_are_not_all_written(capsys, tmp_path):
    """Two LayerNorms' eps raised: alone each moves y by 6.4e-4 and 5.3e-4 of its largest |value|, within 1e-3;
    together by 1.16e-3. The one that moves it most is withheld and the written model, measured again, moves y by
    5.3e-4: within the tolerance (exit 1: a repair withheld)."""
    import onnxruntime as ort

    model, out = fix_models.two_norms(tmp_path / "two.onnx"), tmp_path / "fixed.onnx"
    x = np.random.default_rng(0).standard_normal((4, 16))
    x = ((x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True) * np.sqrt(0.02)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    code = main(["fix", str(model), "-o", str(out), "--inputs", str(tmp_path / "x.npz"), "--format", "json"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert code == 1 and report["written"] and out.exists()
    [written], [withheld] = report["repairs"], report["withheld"]
    assert (written["node"], withheld["node"]) == ("lnB_add_eps", "lnA_add_eps")
    assert round(withheld["output_change"]["relative"], 6) == 0.000636
    assert round(written["output_change"]["relative"], 6) == 0.000526
    assert withheld["reason"] == ("the repairs together change the float32 outputs by 0.00116 (relative) at 'y', beyond "
                                  "--tolerance 0.001, though each alone is within it: this one changes them most "
                                  "(0.000636 alone), so it is left out first")
    assert withheld["keep_fp32_instead"] == ["lnA_mean", "lnA_sub", "lnA_square", "lnA_var", "lnA_add_eps",
                                             "lnA_sqrt", "lnA_div"]
    assert captured.err.startswith(f"precaudit: {model}: 1 repair withheld (eps-raise at 'lnA_add_eps': the repairs "
                                   "together") and captured.err.endswith("; the 1 other repair written\n")
    # the written model, run apart from precaudit: within the tolerance, as its report says
    [a] = ort.InferenceSession(str(model)).run(None, {"x": x})
    [b] = ort.InferenceSession(str(out)).run(None, {"x": x})
    relative = float(np.max(np.abs(a - b)) / np.max(np.abs(a)))
    assert relative == pytest.approx(report["float32"]["outputs"][0]["relative"], rel=1e-5) and relative <= 1e-3


def _scaled(folder: Path) -> Path:
    """y = x · 300 in float32: fine in float16 for |x| < 218, inf beyond; no static rule can know x."""
    return save(chain_model([("Mul", ["x", "k"], "scaled")], dtype="fp32", consts={"k": 300.0}),
                folder / "scaled.onnx")


def _inputs(path: Path, value: float) -> Path:
    np.savez(path, x=np.full((2, 8), value, np.float32))
    return path


def test_an_error_only_trace_measures_is_left_and_fix_exits_1(capsys, tmp_path):
    """fix counts what the audit it was given finds: with --trace, a traced error it cannot repair is listed as left,
    named on stderr, and nothing is written; on inputs where nothing overflows it has nothing to repair."""
    model, out = _scaled(tmp_path), tmp_path / "fixed.onnx"
    loud = _inputs(tmp_path / "loud.npz", 1000.0)
    assert main(["fix", str(model), "-o", str(out), "--trace", "--inputs", str(loud)]) == 1
    captured = capsys.readouterr()
    assert captured.err == (f"precaudit: {model}: nothing repaired and 2 error findings remain (PA901 at 'scaled', "
                            "PA906 at 'scaled'): no model written\n")
    assert captured.out.splitlines()[:2] == [
        f"{model}  (--dtype fp16; {out} not written)",
        "  left    PA901 activation-overflow  node 'scaled' (Mul), error measured on user inputs (--trace): fix "
        "repairs what the static audit finds; keep this in float32 instead (precaudit keep-list MODEL --for "
        "CONVERTER, with the same --trace and --inputs)"]
    assert not out.exists()
    quiet = _inputs(tmp_path / "quiet.npz", 1.0)
    assert main(["fix", str(model), "-o", str(out), "--trace", "--inputs", str(quiet)]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "  nothing to repair: the audit finds nothing here" in captured.out
    # without --trace the run was not asked to measure: the static audit finds nothing
    assert main(["fix", str(model), "-o", str(out)]) == 0


def _wide_weight(folder: Path, eps: float | None) -> Path:
    """x @ w with one weight 1e5 (beyond float16's 65504), after a LayerNorm with eps when given (1e-12: 0 in
    float16, a repair fix makes)."""
    steps: list[tuple] = []
    x = "x"
    if eps is not None:
        steps = [("ReduceMean", ["x"], "mean", {"axes": [-1]}), ("Sub", ["x", "mean"], "d"),
                 ("Mul", ["d", "d"], "d2"), ("ReduceMean", ["d2"], "var", {"axes": [-1]}),
                 ("Add", ["var", "eps"], "ve"), ("Sqrt", ["ve"], "std"), ("Div", ["d", "std"], "normed")]
        x = "normed"
    weight = np.eye(8, dtype=np.float32)
    weight[0, 0] = 1e5
    m = chain_model([*steps, ("MatMul", [x, "w"], "mm")], dtype="fp32", consts={"eps": eps} if eps else {})
    m.graph.initializer.append(numpy_helper.from_array(weight, "w"))
    return save(m, folder / "wide.onnx")


def test_a_weight_error_with_check_weights_is_left_and_fix_exits_1(capsys, tmp_path):
    model, out = _wide_weight(tmp_path, None), tmp_path / "fixed.onnx"
    assert main(["fix", str(model), "-o", str(out), "--check-weights"]) == 1
    captured = capsys.readouterr()
    assert captured.err == (f"precaudit: {model}: nothing repaired and 1 error finding remains (PA212 at 'mm'): "
                            "no model written\n")
    assert ("  left    PA212 weight-overflow  node 'mm' (MatMul): a weight beyond the target's range is the model's "
            "own number: keep its reader in float32 (precaudit keep-list) or rescale it") in captured.out.splitlines()
    assert main(["fix", str(model), "-o", str(out)]) == 0 and not out.exists()


def test_a_norm_statistic_the_static_pass_reads_is_counted_once_with_check_weights(capsys, tmp_path):
    """A running variance of 1e8: the static pass reads it (a norm's parameter), --check-weights reads every
    weight; the one finding is one finding, left once."""
    from fixtures.onnx_builders import fused_norm

    norm = fused_norm("BatchNormalization", dtype="fp32", name="bn")
    var = next(init for init in norm.graph.initializer if init.name == "var")
    var.CopyFrom(numpy_helper.from_array(np.array([1e8, 1.0, 2.0, 3.0], np.float32), "var"))
    model = save(norm, tmp_path / "bn.onnx")
    for extra in ([], ["--check-weights"]):
        assert main(["fix", str(model), "-o", str(tmp_path / "fixed.onnx"), *extra]) == 1
        captured = capsys.readouterr()
        assert captured.err == (f"precaudit: {model}: nothing repaired and 1 error finding remains (PA212 at 'bn'): "
                                "no model written\n")
        assert captured.out.count("  left    PA212") == 1


def test_a_written_model_with_an_error_left_in_it_exits_1(capsys, tmp_path):
    """The eps is raised and the model written; the weight beyond float16 is still in it: exit 1, as `ruff --fix`
    exits when violations remain, with the reason on stderr."""
    model, out = _wide_weight(tmp_path, 1e-12), tmp_path / "fixed.onnx"
    assert main(["fix", str(model), "-o", str(out), "--check-weights"]) == 1
    captured = capsys.readouterr()
    assert captured.err == (f"precaudit: {model}: the fixed model was written and 1 error finding remains "
                            "(PA212 at 'mm') in it, which fix does not repair\n")
    assert out.exists() and "  repair  eps-raise  node 've' (Add)  PA101" in captured.out


def test_the_api_fix_counts_weight_errors_too(tmp_path):
    import precaudit

    model = _wide_weight(tmp_path, None)
    result = precaudit.fix(str(model), str(tmp_path / "fixed.onnx"), check_weights=True)
    assert [(f.rule_id, f.node_name) for f in result.errors_left] == [("PA212", "mm")]
    assert result.exit_code == 1 and not result.written
    assert precaudit.fix(str(model), str(tmp_path / "fixed.onnx")).exit_code == 0
