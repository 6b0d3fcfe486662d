"""precaudit fix's exit code and its one stderr line: a run asked for a fixed model that writes nothing while error
findings remain exits 1 (as `ruff --fix` does when violations remain), and every exit 1 says why on stderr."""

from __future__ import annotations

from pathlib import Path

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
