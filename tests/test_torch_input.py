"""Auditing PyTorch models directly: the same rules, pointing at the Python line and the module path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from precaudit.cli import main  # noqa: E402
from tests.helpers import run_json  # noqa: E402

SRC = Path(__file__).resolve().parent.parent / "fixtures" / "torch_src" / "hazards.py"
HAZARDS = SRC.relative_to(Path.cwd()).as_posix() if SRC.is_relative_to(Path.cwd()) else str(SRC)


pytestmark = pytest.mark.slow  # PyTorch captures and real steps: seconds each


def line_of(text: str) -> int:
    """The line of hazards.py holding this text: tests follow the source instead of hard-coding numbers."""
    return next(i for i, line in enumerate(SRC.read_text().splitlines(), 1) if text in line)


def audit(tmp_path, factory: str, *args: str) -> tuple[int, list[dict]]:
    code, report = run_json([f"{SRC}:{factory}"], *args, out_dir=tmp_path)
    assert report["errors"] == []
    return code, report["results"]


def test_eps_underflow_points_at_the_python_line(tmp_path):
    code, results = audit(tmp_path, "hand_layernorm")
    assert code == 1
    first = results[0]
    assert (first["rule_id"], first["source_line"]) == ("PA101", line_of("hazard: eps 1e-12 is 0.0 in fp16"))
    assert first["source_file"].endswith("fixtures/torch_src/hazards.py")
    assert first["values"]["eps_rounded"] == 0.0 and first["values"]["compute_dtype"] == "float16"
    assert "HandLayerNorm.eps = 1e-12" in first["values"]["eps_source"]


def test_fixed_twin_has_no_eps_finding(tmp_path):
    _, results = audit(tmp_path, "hand_layernorm_fixed")
    assert [r["rule_id"] for r in results] == ["PA208"]  # only the fp16 squares remain


def test_module_path_of_a_nested_module(tmp_path):
    _, results = audit(tmp_path, "nested")
    assert [(r["rule_id"], r["scope"]) for r in results if r["rule_id"] == "PA101"] == [("PA101", "encoder.layer.0")]


def test_block_flags_only_its_real_hazard(tmp_path):
    # a fused LayerNorm with eps 1e-12 keeps float32 statistics, the RMSNorm upcasts: only log(softmax) is a hazard
    _, results = audit(tmp_path, "block")
    assert [(r["rule_id"], r["source_line"]) for r in results] == [("PA201", line_of("hazard: log of softmax"))]


def test_eps_outside_sqrt(tmp_path):
    _, results = audit(tmp_path, "eps_outside_sqrt")
    assert ("PA104", line_of("hazard: eps outside the sqrt")) in [(r["rule_id"], r["source_line"]) for r in results]


def test_bf16_keeps_the_tiny_eps(tmp_path):
    _, results = audit(tmp_path, "hand_layernorm", "--dtype", "bf16")
    assert "PA101" not in [r["rule_id"] for r in results]


def test_inline_suppression_by_rule(tmp_path):
    _, results = audit(tmp_path, "suppressed")
    assert [(r["rule_id"], r["source_line"]) for r in results] == [("PA201", line_of("ignore[PA999]"))]


def test_text_output_shows_file_and_line(capsys):
    assert main([f"{SRC}:hand_layernorm", "--no-color"]) == 1
    out = capsys.readouterr().out
    assert f"hazards.py:{line_of('hazard: eps 1e-12')}  node 'add' (Add)" in out


def test_factory_without_inputs_needs_input_shape(tmp_path, capsys):
    assert main([f"{SRC}:no_inputs"]) == 2
    err = capsys.readouterr().err
    assert "no example inputs" in err and "--input-shape" in err and "Traceback" not in err
    code, results = audit(tmp_path, "no_inputs", "--input-shape", "2,4,8")
    assert code == 1 and results[0]["rule_id"] == "PA101"


def test_export_failure_is_one_line(capsys):
    assert main([f"{SRC}:data_dependent"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "torch.export could not capture the model" in err[0] and "ONNX export" in err[0]


def test_pt2_program(tmp_path):
    from fixtures.torch_src.hazards import hand_layernorm
    module, args = hand_layernorm()
    torch.export.save(torch.export.export(module.half(), tuple(a.half() for a in args)), str(tmp_path / "m.pt2"))
    code, report = run_json([tmp_path / "m.pt2"], out_dir=tmp_path)
    assert code == 1
    assert (report["results"][0]["rule_id"], report["results"][0]["source_line"]) == ("PA101", line_of("hazard: eps 1e-12"))


def test_torchscript_file(tmp_path):
    from fixtures.torch_src.hazards import HandLayerNorm
    torch.jit.save(torch.jit.trace(HandLayerNorm(1e-12), (torch.randn(2, 4, 8),)), str(tmp_path / "m.pt"))
    code, report = run_json([tmp_path / "m.pt"], "--input-shape", "2,4,8", out_dir=tmp_path)
    assert code == 1 and next(r["rule_id"] for r in report["results"]) == "PA101"


def test_pickled_module_is_refused_without_trust(tmp_path, capsys):
    from fixtures.torch_src.hazards import HandLayerNorm
    torch.save(HandLayerNorm(1e-12), str(tmp_path / "m.pt"))
    assert main([str(tmp_path / "m.pt"), "--input-shape", "2,4,8"]) == 2
    err = capsys.readouterr().err
    assert "unpickling runs arbitrary code" in err and "--trust-pickle" in err
    code, report = run_json([tmp_path / "m.pt"], "--input-shape", "2,4,8", "--trust-pickle", out_dir=tmp_path)
    assert code == 1 and report["results"][0]["rule_id"] == "PA101"


def test_without_torch_installed(tmp_path):
    script = ("import sys; sys.modules['torch'] = None; from precaudit.cli import main; "
              f"sys.exit(main([{str(SRC) + ':hand_layernorm'!r}]))")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 2
    assert "needs torch: pip install 'precaudit[torch]'" in run.stderr and "Traceback" not in run.stderr


def test_traced_mode_on_a_module_names_the_python_line(tmp_path):
    _, results = audit(tmp_path, "loud_rmsnorm", "--trace", "--select", "PA9")
    overflow = [r for r in results if r["rule_id"] == "PA901"]
    assert [(r["source_line"], r["scope"]) for r in overflow] == [(line_of("traced: 300² = 90000"), None)]
    assert overflow[0]["values"]["absmax"] >= 90000


def test_traced_mode_twin_with_the_float32_upcast(tmp_path):
    _, results = audit(tmp_path, "loud_rmsnorm_upcast", "--trace", "--select", "PA9")
    assert results == []


def test_json_report_of_a_traced_module_matches_the_schema(tmp_path):
    import json

    import jsonschema

    schema = json.loads((SRC.parents[2] / "precaudit/schemas/report.schema.json").read_text())
    _code, report = run_json([f"{SRC}:loud_rmsnorm"], "--trace", out_dir=tmp_path)
    jsonschema.Draft7Validator(schema).validate(report)
    assert {r["rule_id"] for r in report["results"]} >= {"PA208", "PA901"}
    assert all(r["source_file"].endswith("hazards.py") and r["source_line"] for r in report["results"])


def test_traced_mode_on_a_module_with_weights(tmp_path):
    # the export's initializers are read lazily while the model runs: they must still be there
    code, results = audit(tmp_path, "embedding_block", "--trace")
    assert code == 0 and results == []


def test_reason_names_the_conversion_precaudit_made(tmp_path):
    _, results = audit(tmp_path, "hand_layernorm")
    assert results[0]["values"]["compute_reason"] == "--dtype fp16: the module was converted with model.to(float16)"


def test_pytorch_instance_norm_keeps_float32_statistics(tmp_path):
    _, results = audit(tmp_path, "instance_norm_1e12")
    assert results == []  # its ONNX export (InstanceNormalization in fp16) would be PA101; PyTorch's kernel is not


def test_torchscript_with_token_id_inputs(tmp_path):
    module = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.LayerNorm(8, eps=1e-12))
    torch.jit.save(torch.jit.trace(module, (torch.randint(0, 10, (2, 5)),)), str(tmp_path / "emb.pt"))
    code, report = run_json([tmp_path / "emb.pt"], "--input-shape", "2,5", "--input-dtype", "int64", out_dir=tmp_path)
    assert report["errors"] == [] and code == 0


def test_a_scale_from_a_size_is_no_unguarded_division(tmp_path):
    """torch.tensor(x.size(-1)) comes out of torch.export as lift_fresh_copy + detach_ of a constant: a positive
    number, so x / sqrt(size * 3) divides by no zero; the twin divides by sqrt(relu(x))."""
    _, results = audit(tmp_path, "scaled_by_size")
    assert [r["rule_id"] for r in results] == []
    _, results = audit(tmp_path, "scaled_by_relu")
    assert [(r["rule_id"], r["source_line"]) for r in results] == [("PA303", line_of("hazard: relu(x) can be 0"))]


@pytest.mark.parametrize("dtype,eps", [("fp16", 1.1920928955078125e-07), ("bf16", 1.1920928955078125e-07),
                                       ("fp32", 1.1920928955078125e-07)])
def test_rms_norm_without_eps_uses_the_float32_machine_epsilon_for_half_inputs(dtype, eps, tmp_path, capsys):
    """nn.RMSNorm(eps=None) takes finfo of the dtype its kernel computes in: float32 for half and bfloat16 inputs
    (measured: F.rms_norm(half, eps=None) equals eps=finfo(float32).eps and differs from float16's 9.77e-4)."""
    x = torch.full((2, 64), 1e-3).half()
    x[0] = 0
    measured = torch.nn.functional.rms_norm(x, (64,))
    assert torch.equal(measured, torch.nn.functional.rms_norm(x, (64,), eps=torch.finfo(torch.float32).eps))
    assert not torch.equal(measured, torch.nn.functional.rms_norm(x, (64,), eps=torch.finfo(torch.float16).eps))
    (tmp_path / "rms.py").write_text("import torch\nfrom torch import nn\n\n\ndef make():\n"
                                     "    return nn.Sequential(nn.RMSNorm(64)), (torch.randn(2, 64),)\n")
    assert main(["match", "PA103", f"{tmp_path}/rms.py:make", "--dtype", dtype]) == 0
    assert f"eps={eps!r}" in capsys.readouterr().out
