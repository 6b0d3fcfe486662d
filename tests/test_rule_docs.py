"""`precaudit rules`, `precaudit explain RULE`, and preview rules that stay off until selected."""

from __future__ import annotations

import json

import pytest

from fixtures.onnx_builders import fused_norm, save
from precaudit.cli import main
from precaudit.rules.loader import load_rules

PREVIEW_RULE = ("id: XP901\nname: eps-below-1e-4\nseverity: error\nsummary: Experimental eps floor.\nsites: [norm]\n"
                "preview: true\ncondition: has_eps and eps < 1e-4\nmessage: 'eps {eps:.0e} is below 1e-4'\n"
                "fix: Use 1e-4.\n")


@pytest.fixture
def preview_rule(tmp_path):
    path = tmp_path / "XP901.yaml"
    path.write_text(PREVIEW_RULE)
    return str(path)


@pytest.fixture
def small_eps_model(tmp_path):
    """fp16 LayerNorm with eps 6.5e-5: normal in float16 (no built-in finding) but below the preview rule's 1e-4."""
    return str(save(fused_norm("LayerNormalization", epsilon=6.5e-5, stash_type=0), tmp_path / "small.onnx"))


def test_rules_lists_every_rule_with_severity_and_default(capsys):
    assert main(["rules"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["id", "name", "severity", "default", "fix", "summary"]
    rows = {line.split()[0]: line.split()[:5] for line in lines[1:]}
    assert rows["PA101"] == ["PA101", "eps-underflow", "error", "on", "eps-raise"]
    assert rows["PA102"] == ["PA102", "eps-subnormal", "warning", "on", "eps-raise"]
    assert set(rows) == {r.id for r in load_rules()}


def test_rules_shows_a_preview_rule_as_off(preview_rule, capsys):
    assert main(["rules", "--rules", preview_rule, "--format", "json"]) == 0
    listed = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert listed["XP901"]["enabled_by_default"] is False and listed["XP901"]["preview"] is True
    assert listed["PA101"]["enabled_by_default"] is True and listed["PA101"]["severity"] == "error"


@pytest.mark.parametrize("name", ["PA101", "eps-underflow", "pa101"])
def test_explain_prints_the_worked_example_and_fix(name, capsys):
    assert main(["explain", name]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "PA101 eps-underflow  (error, on by default)"
    assert "The epsilon rounds to zero in the dtype it is computed in." in out
    assert "    eps in float16            = 0.0        (smallest float16 subnormal is 5.96e-8)" in out
    assert "    (x - mean) / sqrt(var + eps) = 0 / sqrt(0 + 0) = 0 / 0 = NaN" in out
    assert ("Fix:\n  Raise <eps_role> to at least <eps_floor>, the smallest normal <eps_dtype>, "
            "or keep this node in float32") in out
    assert "References:\n  https://onnx.ai/onnx/operators/onnx__LayerNormalization.html" in out


def test_explain_unknown_rule_is_one_line_exit_2(capsys):
    assert main(["explain", "PA999"]) == 2
    captured = capsys.readouterr()
    assert captured.err == "precaudit: unknown rule 'PA999'; `precaudit rules` lists them\n" and captured.out == ""


@pytest.mark.parametrize("rule", load_rules(), ids=lambda r: r.id)
def test_every_builtin_rule_explains_itself_with_numbers(rule, capsys):
    assert main(["explain", rule.id]) == 0
    out = capsys.readouterr().out
    assert rule.description and any(ch.isdigit() for ch in rule.example), f"{rule.id} needs a worked example"
    assert "Example:" in out and "{" not in out.split("Message:")[1]


def test_bare_model_is_still_the_default_command(small_eps_model, capsys):
    assert main([small_eps_model]) == 0
    assert "Found 0 findings in 1 model" in capsys.readouterr().out


def test_preview_rule_is_off_unless_selected_exactly_or_with_preview(small_eps_model, preview_rule):
    def fires(*args: str) -> bool:
        return main([small_eps_model, "--rules", preview_rule, *args]) == 1

    assert not fires()  # upgrading to a release with a new preview rule never breaks the gate
    assert fires("--select", "XP901")
    assert fires("--select", "eps-below-1e-4")
    assert not fires("--select", "XP9")  # a prefix is not an opt-in
    assert fires("--select", "XP9", "--preview")
    assert fires("--preview")
    assert not fires("--preview", "--ignore", "XP901")


def test_preview_from_pyproject(small_eps_model, preview_rule, tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text(f'[tool.precaudit]\nrules = ["{preview_rule}"]\npreview = true\n')
    monkeypatch.chdir(tmp_path)
    assert main([small_eps_model]) == 1
    assert main([small_eps_model, "--no-preview"]) == 0
