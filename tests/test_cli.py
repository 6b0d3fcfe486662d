"""The command line as users and CI meet it: exit codes, formats, bad input, rule overrides, lean start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import onnx
import pytest

from fixtures.onnx_builders import decomposed_layernorm, fused_norm, save
from precaudit.cli import main
from tests.helpers import run_json

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "precaudit/schemas/report.schema.json").read_text())


@pytest.fixture
def underflow(tmp_path):
    """An fp16 LayerNorm whose eps 1e-12 rounds to zero (an error finding)."""
    return save(fused_norm("LayerNormalization", epsilon=1e-12, stash_type=0, name="encoder.ln"), tmp_path / "under.onnx")


@pytest.fixture
def subnormal(tmp_path):
    """An fp16 LayerNorm whose eps 1e-5 is subnormal (a warning finding only)."""
    return save(fused_norm("LayerNormalization", epsilon=1e-5, stash_type=0), tmp_path / "sub.onnx")


@pytest.fixture
def clean(tmp_path):
    return save(fused_norm("LayerNormalization", epsilon=1e-12), tmp_path / "clean.onnx")


def test_clean_model_exits_0(clean, capsys):
    assert main([str(clean)]) == 0
    assert "Found 0 findings in 1 model" in capsys.readouterr().out


def test_text_report_names_node_numbers_reason_and_fix(underflow, capsys):
    assert main([str(underflow), "--dtype", "fp16"]) == 1
    out = capsys.readouterr().out
    assert "PA101 eps-underflow" in out and "node 'encoder.ln' (LayerNormalization)" in out
    assert "eps 1e-12 (attribute epsilon) rounds to 0.0 in float16" in out
    assert "why float16: stash_type=0" in out
    assert "fix: Raise eps to at least 6.104e-05" in out
    assert "1 error, 0 warnings, 0 info" in out


@pytest.mark.parametrize("fail_on,expected", [("error", 0), ("warning", 1), ("info", 1), ("never", 0)])
def test_fail_on_warning_model(subnormal, fail_on, expected):
    assert main([str(subnormal), "--fail-on", fail_on]) == expected


def test_fail_on_never_with_error(underflow):
    assert main([str(underflow), "--fail-on", "never"]) == 0


def test_json_report_matches_schema(underflow, subnormal, tmp_path):
    code, report = run_json([underflow, subnormal], out_dir=tmp_path)
    jsonschema.Draft7Validator(SCHEMA).validate(report)
    assert code == 1 and report["summary"]["exit_code"] == 1
    assert report["summary"]["error"] == 1 and report["summary"]["warning"] == 1
    assert report["settings"]["dtype"] == "fp16" and report["models"] == [str(underflow), str(subnormal)]
    first = report["results"][0]
    assert first["values"]["eps_rounded"] == 0.0 and first["values"]["compute_dtype"] == "float16"


def test_fingerprint_survives_reexport_and_another_working_folder(tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()  # a repository: the fingerprint keys the model by its path inside it
    (tmp_path / "models").mkdir()
    m1, _ = decomposed_layernorm(1e-12, dtype="fp32")
    _, r1 = run_json([save(m1, tmp_path / "models/m.onnx")], out_dir=tmp_path)
    m2, _ = decomposed_layernorm(1e-12, dtype="fp32")
    m2.graph.node.insert(0, onnx.helper.make_node("Identity", ["x"], ["unused"], name="extra"))  # node indices shift
    save(m2, tmp_path / "models/m.onnx")
    monkeypatch.chdir(tmp_path / "models")
    _, r2 = run_json(["m.onnx"], out_dir=tmp_path)
    assert [r["rule_id"] for r in r1["results"]] == ["PA101", "PA208"]
    assert [r["fingerprint"] for r in r1["results"]] == [r["fingerprint"] for r in r2["results"]]
    m3, _ = decomposed_layernorm(1e-9, dtype="fp32")  # another eps is another finding
    _, r3 = run_json([save(m3, tmp_path / "models/m.onnx")], out_dir=tmp_path)
    assert r3["results"][0]["fingerprint"] != r1["results"][0]["fingerprint"]


def test_output_file_and_empty_stdout(underflow, tmp_path, capsys):
    out = tmp_path / "report.txt"
    assert main([str(underflow), "-o", str(out)]) == 1
    assert capsys.readouterr().out == ""
    assert "PA101" in out.read_text()


def test_output_refuses_to_overwrite_the_model(underflow, capsys):
    before = underflow.read_bytes()
    assert main([str(underflow), "-o", str(underflow)]) == 2
    assert "refusing to write the report over one of the inputs" in capsys.readouterr().err
    assert underflow.read_bytes() == before


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_missing_model(tmp_path, capsys):
    assert main([str(tmp_path / "nope.onnx")]) == 2
    assert _one_line_error(capsys) == f"precaudit: {tmp_path / 'nope.onnx'}: no such file"


def test_garbage_model(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\x01garbage" * 10)
    assert main([str(bad)]) == 2
    line = _one_line_error(capsys)
    assert str(bad) in line and "not a readable ONNX model" in line


def test_unsupported_extension(tmp_path, capsys):
    other = tmp_path / "model.tflite"
    other.write_bytes(b"x")
    assert main([str(other)]) == 2
    assert "unsupported model type" in _one_line_error(capsys)


def test_bad_model_among_good_ones_still_reports_the_good(underflow, tmp_path):
    missing = tmp_path / "missing.onnx"
    code, report = run_json([underflow, missing], out_dir=tmp_path)
    assert code == 2
    assert [r["rule_id"] for r in report["results"]] == ["PA101"]
    assert report["errors"] == [{"file": str(missing), "line": None, "message": "no such file"}]


def test_external_data_outside_model_folder_is_refused(tmp_path, capsys):
    m, _eps = decomposed_layernorm(1e-12, eps_at="external")
    (tmp_path / "sub").mkdir()
    for init in m.graph.initializer:
        if init.name == "eps":
            onnx.external_data_helper.set_external_data(init, location="../secret.bin")
            init.ClearField("raw_data")
            init.data_location = onnx.TensorProto.EXTERNAL
    (tmp_path / "secret.bin").write_bytes(b"\x00" * 2)
    path = tmp_path / "sub" / "m.onnx"
    onnx.save(m, str(path))
    assert main([str(path)]) == 2
    assert "leaves the model's folder" in _one_line_error(capsys)


def test_bad_dtype_is_a_usage_error(clean, capsys):
    assert main([str(clean), "--dtype", "fp12"]) == 2
    assert "unknown dtype 'fp12'" in capsys.readouterr().err


def test_broken_rule_yaml_names_file_and_line(clean, tmp_path, capsys):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "bad.yaml").write_text("id: ORG001\nname: x\nseverity: [unclosed\n")
    assert main([str(clean), "--rules", str(rules)]) == 2
    line = _one_line_error(capsys)
    assert f"{rules / 'bad.yaml'}:" in line and "invalid YAML" in line


def test_rule_with_unknown_fact_names_the_line(clean, tmp_path, capsys):
    rule = tmp_path / "org.yaml"
    rule.write_text("id: ORG001\nname: tiny-eps\nseverity: error\nsummary: s\nsites: [norm]\n"
                    "condition: epss < 1e-6\nmessage: m\nfix: f\n")
    assert main([str(clean), "--rules", str(rule)]) == 2
    line = _one_line_error(capsys)
    assert f"{rule}:6:" in line and "unknown name 'epss'" in line


@pytest.mark.parametrize("condition,problem", [
    ("__import__('os').system('touch pwned')", "only these functions may be called"),
    ("eps.__class__ == 1", "'Attribute' is not allowed in a condition"),
    ("[x for x in eps_source]", "'ListComp' is not allowed in a condition"),
])
def test_rule_condition_cannot_run_code(clean, tmp_path, capsys, monkeypatch, condition, problem):
    monkeypatch.chdir(tmp_path)
    rule = tmp_path / "evil.yaml"
    rule.write_text("id: ORG002\nname: evil\nseverity: error\nsummary: s\nsites: [norm]\n"
                    f"condition: \"{condition}\"\nmessage: m\nfix: f\n")
    assert main([str(clean), "--rules", str(rule)]) == 2
    line = _one_line_error(capsys)
    assert f"{rule}:6:" in line and problem in line
    assert not (tmp_path / "pwned").exists()


def test_user_rule_fires(clean, tmp_path):
    rule = tmp_path / "org.yaml"
    rule.write_text("id: ORG001\nname: org-min-eps\nseverity: error\nsummary: Our org needs eps >= 1e-6\n"
                    "sites: [norm]\ncondition: has_eps and eps < min_eps\nparams: {min_eps: 1.0e-6}\n"
                    "message: 'eps {eps:.0e} is below our floor {min_eps:.0e}'\nfix: Use 1e-5.\n")
    code, report = run_json([clean], "--rules", str(rule), out_dir=tmp_path)
    assert code == 1
    assert [(r["rule_id"], r["message"]) for r in report["results"]] == [("ORG001", "eps 1e-12 is below our floor 1e-06")]


def test_override_threshold_and_severity(tmp_path):
    bn = save(fused_norm("BatchNormalization", "fp32", epsilon=0.1), tmp_path / "bn.onnx")
    code, report = run_json([bn], "--dtype", "fp32", out_dir=tmp_path)
    assert [r["rule_id"] for r in report["results"]] == ["PA103"] and code == 0
    override = tmp_path / "override.yaml"
    override.write_text("id: PA103\nseverity: error\nparams: {max_eps: 0.05}\n")
    code, report = run_json([bn], "--dtype", "fp32", "--rules", str(override), out_dir=tmp_path)
    assert [(r["rule_id"], r["severity"]) for r in report["results"]] == [("PA103", "error")] and code == 1
    override.write_text("id: PA103\nparams: {max_eps: 0.2}\n")
    code, report = run_json([bn], "--dtype", "fp32", "--rules", str(override), out_dir=tmp_path)
    assert report["results"] == [] and code == 0


def test_override_may_not_change_sites(clean, tmp_path, capsys):
    override = tmp_path / "o.yaml"
    override.write_text("id: PA101\nsites: [log]\n")
    assert main([str(clean), "--rules", str(override)]) == 2
    assert "may not change 'sites'" in _one_line_error(capsys)


def test_version_and_onnx_audit_never_import_torch(underflow):
    code = ("import sys; from precaudit.cli import main; "
            f"main(['--version']); main([{str(underflow)!r}, '-o', '/dev/null']); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False"


def test_console_script_exit_codes(underflow, clean):
    exe = [sys.executable, "-m", "precaudit"]
    assert subprocess.run([*exe, str(clean)], capture_output=True).returncode == 0
    assert subprocess.run([*exe, str(underflow)], capture_output=True).returncode == 1
    bad = subprocess.run([*exe, "missing.onnx"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_readme_example_model(tmp_path):
    """The model the README's first command runs on: its real hazards, and nothing on the safe fused LayerNorm."""
    example = Path(__file__).resolve().parent.parent / "examples" / "tiny_block_fp16.onnx"
    code, report = run_json([example], "--dtype", "fp16", out_dir=tmp_path)
    assert code == 1
    assert [(r["rule_id"], r["node_name"]) for r in report["results"]] == [
        ("PA101", "/attn_norm/Add"), ("PA208", "/attn_norm/Add"), ("PA201", "/attn/Log"),
        ("PA102", "/mlp_norm/Add"), ("PA208", "/mlp_norm/Add"), ("PA105", "/head/LpNormalization")]


def test_control_characters_in_node_names_cannot_inject_lines(tmp_path, capsys):
    evil = "ln\n::error file=x::injected\x1b[31m"
    model = save(fused_norm("LayerNormalization", epsilon=1e-12, stash_type=0, name=evil), tmp_path / "m.onnx")
    assert main([str(model), "--format", "github"]) == 1
    out = capsys.readouterr().out
    assert not any(line.startswith("::error file=x") for line in out.splitlines())
    assert "\x1b" not in out and "ln\\n::error" in out


def test_bare_command_shows_help_and_is_a_usage_error(capsys):
    assert main([]) == 2
    captured = capsys.readouterr()
    assert "check" in captured.out + captured.err and "Traceback" not in captured.err


def test_help_lists_the_commands_and_the_default_commands_options(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(command in out for command in ("keep-list", "explain", "match", "fix", "rules"))
    assert "--dtype" in out and "--fail-on" in out
    assert main(["keep-list", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--for CONVERTER" in out and "--tolerance" in out and "--fail-on" not in out


def test_version_prints_the_version(capsys):
    from precaudit import __version__
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"precaudit {__version__}\n"


def test_options_may_come_between_and_after_the_models(underflow, subnormal, tmp_path):
    code, report = run_json([underflow], "--dtype", "fp16", str(subnormal), "--select", "PA1", out_dir=tmp_path)
    assert code == 1 and report["models"] == [str(underflow), str(subnormal)]
    assert {r["rule_id"] for r in report["results"]} == {"PA101", "PA102"}


@pytest.mark.parametrize("args,says", [
    (["--samples", "x"], "Invalid value for '--samples': 'x' is not a valid int range."),
    (["--fail-on", "sometimes"],
     "Invalid value for '--fail-on': must be one of error, warning, info, never, got 'sometimes'"),
    (["--jobs", "0"], "Invalid value for '--jobs' / '-j': 0 is not in the range x>=1."),
    (["--output"], "Option '--output' requires an argument."),
    (["--bogus"], "No such option: --bogus"),
])
def test_bad_option_values_are_one_line_naming_the_option(underflow, capsys, args, says):
    assert main([str(underflow), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and err.endswith("(precaudit --help shows the usage)\n")


def test_every_format_the_options_accept_has_a_renderer():
    """--format's choices are checked low in the house (options.FORMATS); each must render."""
    from precaudit.options import FORMATS
    from precaudit.report import RENDERERS

    assert set(FORMATS) == set(RENDERERS)
