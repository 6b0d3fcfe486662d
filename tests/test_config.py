"""[tool.precaudit] in pyproject.toml: discovery, precedence under CLI flags, ignores, --show-settings, bad config."""

from __future__ import annotations

import pytest

from fixtures.onnx_builders import fused_norm, save
from precaudit.cli import main
from tests.helpers import run_json


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A repository with an fp16 model whose eps 1e-5 is subnormal (a warning) and one whose 1e-12 underflows."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "models" / "legacy").mkdir(parents=True)
    save(fused_norm("LayerNormalization", epsilon=1e-5, stash_type=0, name="/encoder/layer.0/LayerNorm/ln"),
         tmp_path / "models" / "sub.onnx")
    save(fused_norm("LayerNormalization", epsilon=1e-12, stash_type=0, name="/encoder/layer.0/LayerNorm/ln"),
         tmp_path / "models" / "legacy" / "under.onnx")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def configure(root, body: str) -> None:
    (root / "pyproject.toml").write_text(f"[project]\nname = 'demo'\n\n[tool.precaudit]\n{body}\n")


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_pyproject_value_applies_and_a_cli_flag_overrides_it(project):
    assert main(["models/sub.onnx"]) == 0  # default --fail-on error: a warning passes
    configure(project, 'fail-on = "warning"')
    assert main(["models/sub.onnx"]) == 1
    assert main(["models/sub.onnx", "--fail-on", "error"]) == 0


def test_isolated_reads_no_pyproject_for_check_or_train(project, capsys):
    """--isolated: every setting from the command line; the pyproject's fail-on and ignore do not apply."""
    configure(project, 'fail-on = "warning"\nignore = ["PA101"]')
    code, report = run_json(["models/legacy/under.onnx"], out_dir=project)
    assert (code, report["results"], report["settings"]["config_file"]) == (0, [], "pyproject.toml")
    code, report = run_json(["models/legacy/under.onnx"], "--isolated", out_dir=project)
    assert code == 1 and report["settings"]["config_file"] is None
    assert [(r["rule_id"], r["node_name"]) for r in report["results"]] == [("PA101", "/encoder/layer.0/LayerNorm/ln")]
    assert main(["models/sub.onnx", "--isolated"]) == 0  # a warning passes the default --fail-on error
    assert main(["train", "nowhere.py:make", "--isolated"]) == 2  # train takes it: the error is the factory's
    assert "nowhere.py" in one_error_line(capsys)


def test_config_is_found_from_a_subfolder_and_its_paths_are_relative_to_it(project, monkeypatch):
    (project / "org-rules").mkdir()
    (project / "org-rules" / "floor.yaml").write_text(
        "id: ORG001\nname: org-min-eps\nseverity: error\nsummary: s\nsites: [norm]\n"
        "condition: has_eps and eps < 1e-3\nmessage: 'eps {eps:.0e} is below our floor'\nfix: Use 1e-3.\n")
    configure(project, 'rules = ["org-rules"]\nselect = ["ORG001"]')
    monkeypatch.chdir(project / "models")
    code, report = run_json(["sub.onnx"], out_dir=project)
    assert code == 1 and [r["message"] for r in report["results"]] == ["eps 1e-05 is below our floor"]
    assert report["settings"]["config_file"] == "../pyproject.toml"


def test_config_outside_the_repository_is_not_used(project, monkeypatch):
    configure(project, 'fail-on = "warning"')
    inner = project / "vendored"
    (inner / ".git").mkdir(parents=True)
    monkeypatch.chdir(inner)
    assert main([str(project / "models" / "sub.onnx")]) == 0


def test_a_pyproject_without_the_table_is_skipped(project, monkeypatch):
    configure(project, 'fail-on = "warning"')
    (project / "models" / "pyproject.toml").write_text("[project]\nname = 'inner'\n")
    monkeypatch.chdir(project / "models")
    assert main(["sub.onnx"]) == 1


def test_show_settings_says_where_each_value_comes_from(project, capsys):
    configure(project, 'fail-on = "warning"\ndtype = "bf16"\nper-node-ignores = {"encoder.*.LayerNorm" = ["PA102"]}')
    assert main(["--show-settings", "--dtype", "fp16"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "config file: pyproject.toml"
    lines = {line.split("=")[0].strip(): line for line in out[1:]}
    assert lines["fail-on"].split("#")[1].strip() == "pyproject.toml" and '"warning"' in lines["fail-on"]
    assert lines["dtype"].split("#")[1].strip() == "command line" and '"fp16"' in lines["dtype"]
    assert lines["select"].split("#")[1].strip() == "default"
    assert '{"encoder.*.LayerNorm" = ["PA102"]}' in lines["per-node-ignores"]


def test_show_settings_escapes_what_the_config_says(project, capsys):
    """A pyproject's strings reach the terminal escaped and quoted: no escape sequence, no line break, no bidi
    override, and each value printed parses back as the TOML it came from."""
    import tomllib

    configure(project, 'keep-fp32 = ["a\\u001b[31mred", "two\\nlines", "quo\\"te", "back\\\\slash", "\\u202egnp"]\n'
                       'per-node-ignores = {"enc\\u001b]0;title\\u0007" = ["PA102"]}')
    assert main(["--show-settings"]) == 0
    out = capsys.readouterr().out
    assert not any((ord(c) < 0x20 and c != "\n") or c == "\u202e" for c in out)
    lines = {line.split("=")[0].strip(): line for line in out.splitlines()[1:]}
    assert len(out.splitlines()) == len(lines) + 1
    value = lambda key: tomllib.loads("v = " + lines[key].split(" = ", 1)[1].rsplit("#", 1)[0])["v"]  # noqa: E731
    assert value("keep-fp32") == ["a\x1b[31mred", "two\nlines", 'quo"te', "back\\slash", "\u202egnp"]
    assert value("per-node-ignores") == {"enc\x1b]0;title\x07": ["PA102"]}


def test_an_integer_past_the_digit_limit_is_one_line(project, capsys):
    configure(project, f"samples = {'9' * 5000}")
    assert main(["models/sub.onnx"]) == 2
    assert one_error_line(capsys).startswith("precaudit: pyproject.toml: invalid TOML: a number too long to read")


def test_a_pyproject_past_1_mib_is_one_line(project, capsys):
    configure(project, "keep-fp32 = [" + ", ".join(f'"n{i}"' for i in range(120_000)) + "]")
    assert main(["models/sub.onnx"]) == 2
    assert one_error_line(capsys) == "precaudit: pyproject.toml: file is larger than 1 MiB; precaudit refuses to read it"


def test_per_model_ignores(project, capsys):
    configure(project, 'per-model-ignores = {"models/legacy/*" = ["PA101"]}')
    assert main(["models/legacy/under.onnx", "models/sub.onnx", "--fail-on", "warning"]) == 1
    out = capsys.readouterr().out
    assert "PA101" not in out and "PA102 eps-subnormal" in out
    assert "1 finding ignored by per-model or per-node ignores." in out


@pytest.mark.parametrize("glob", ["encoder.*.LayerNorm", "/encoder/layer.0/*"])
def test_per_node_ignores_match_module_scope_or_node_name(project, glob, capsys):
    configure(project, f'per-node-ignores = {{"{glob}" = ["eps-underflow"]}}')
    assert main(["models/legacy/under.onnx"]) == 0
    assert "Found 0 findings in 1 model" in capsys.readouterr().out


@pytest.mark.parametrize("body,problem", [
    ('fail-on = "critical"', "[tool.precaudit] fail-on: must be one of error, warning, info, never, got 'critical'"),
    ('fail_on = "warning"', "[tool.precaudit] fail_on: unknown key (allowed: dtype, keep-fp32,"),
    ("select = \"PA101\"", "[tool.precaudit] select: must be a list of strings"),
    ('dtype = "fp12"', "[tool.precaudit] dtype: unknown dtype 'fp12'"),
    ("preview = 1", "[tool.precaudit] preview: must be true or false, got 1"),
    ('per-node-ignores = {"enc.*" = "PA101"}', "[tool.precaudit] per-node-ignores: 'enc.*' must map to a list"),
    ('per-node-ignores = {"enc.*" = ["PA999"]}',
     "[tool.precaudit] per-node-ignores.\"enc.*\": 'PA999' matches no rule id, name or id prefix"),
    ('ignore = ["eps-underflw"]', "[tool.precaudit] ignore: 'eps-underflw' matches no rule id, name or id prefix"),
    ("fail-on = ", "invalid TOML: Invalid value (at line 5, column 11)"),
])
def test_bad_config_is_exit_2_naming_file_and_key(project, capsys, body, problem):
    configure(project, body)
    assert main(["models/sub.onnx"]) == 2
    line = one_error_line(capsys)
    assert line.startswith("precaudit: pyproject.toml: ") and problem in line, line
