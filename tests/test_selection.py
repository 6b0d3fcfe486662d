"""--select / --ignore by id, name or prefix, --exit-zero and --statistics, and golden text and JSON reports."""

from __future__ import annotations

import pytest

from fixtures.onnx_builders import fused_norm, save
from precaudit.cli import main
from tests.helpers import run_json


@pytest.fixture
def models(tmp_path, monkeypatch):
    """Two fp16 models: eps 1e-12 rounds to 0.0 (PA101, error); eps 1e-5 is subnormal (PA102, warning)."""
    monkeypatch.chdir(tmp_path)
    save(fused_norm("LayerNormalization", epsilon=1e-12, stash_type=0, name="/encoder/ln"), tmp_path / "under.onnx")
    save(fused_norm("LayerNormalization", epsilon=1e-5, stash_type=0, name="/head/ln"), tmp_path / "sub.onnx")
    return ["under.onnx", "sub.onnx"]


def rule_ids(models, tmp_path, *args: str) -> list[str]:
    _, report = run_json(models, *args, out_dir=tmp_path)
    return [r["rule_id"] for r in report["results"]]


@pytest.mark.parametrize("args,expected", [
    ((), ["PA101", "PA102"]),
    (("--select", "PA102"), ["PA102"]),
    (("--select", "eps-underflow"), ["PA101"]),
    (("--select", "PA1"), ["PA101", "PA102"]),
    (("--select", "PA101,PA102", "--ignore", "eps-subnormal"), ["PA101"]),
    (("--ignore", "PA1"), []),
])
def test_select_and_ignore_by_id_name_or_prefix(models, tmp_path, args, expected):
    assert rule_ids(models, tmp_path, *args) == expected


def test_ignored_rule_no_longer_fails_the_build(models):
    assert main(models) == 1
    assert main([*models, "--ignore", "PA101"]) == 0


def test_a_selector_that_matches_nothing_is_a_usage_error(models, capsys):
    assert main([*models, "--select", "PA999"]) == 2
    assert capsys.readouterr().err == (
        "precaudit: --select: 'PA999' matches no rule id, name or id prefix (see `precaudit rules`)\n")


def test_exit_zero_but_errors_stay_2(models):
    assert main([*models, "--exit-zero"]) == 0
    assert main([*models, "missing.onnx", "--exit-zero"]) == 2


def test_statistics(models, capsys):
    assert main([*models, "--statistics"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "    1  PA101  eps-underflow  error",
        "    1  PA102  eps-subnormal  warning",
        "Found 2 findings in 2 models: 1 error, 1 warning, 0 info.",
    ]


def test_statistics_only_with_text(models, capsys):
    assert main([*models, "--statistics", "--format", "sarif"]) == 2
    assert "--statistics prints a table" in capsys.readouterr().err


def test_text_report_golden(models, capsys):
    assert main(models) == 1
    assert capsys.readouterr().out.splitlines() == [
        "under.onnx  (--dtype fp16)",
        "  error   PA101 eps-underflow  node '/encoder/ln' (LayerNormalization) in encoder",
        "          eps 1e-12 (attribute epsilon) rounds to 0.0 in float16: the guard against dividing by a zero "
        "statistic is gone",
        "          why float16: stash_type=0 is no float type, so the input dtype applies: model stored in float16",
        "          fix: Raise eps to at least 6.104e-05, the smallest normal float16, or keep this node in float32 "
        "(--keep-fp32 LayerNormalization; the same entry in your converter's op block list).",
        "",
        "sub.onnx  (--dtype fp16)",
        "  warning PA102 eps-subnormal  node '/head/ln' (LayerNormalization) in head",
        "          eps 1e-05 (attribute epsilon) is subnormal in float16: stored as 1.0014e-05, and 0.0 wherever "
        "subnormals are flushed to zero",
        "          why float16: stash_type=0 is no float type, so the input dtype applies: model stored in float16",
        "          fix: Use eps >= 6.104e-05 (the smallest normal float16), or compute this node's statistics in float32 "
        "(stash_type=1, or --keep-fp32 LayerNormalization).",
        "",
        "Found 2 findings in 2 models: 1 error, 1 warning, 0 info.",
    ]


def test_json_report_golden(models, tmp_path):
    code, report = run_json(models, "--select", "PA101", out_dir=tmp_path)
    assert code == 1
    (result,) = report["results"]
    assert {k: result[k] for k in ("rule_id", "rule_name", "severity", "model", "node_name", "op_type", "scope")} == {
        "rule_id": "PA101", "rule_name": "eps-underflow", "severity": "error", "model": "under.onnx",
        "node_name": "/encoder/ln", "op_type": "LayerNormalization", "scope": "encoder"}
    assert result["values"]["eps_rounded"] == 0.0 and abs(result["values"]["eps"] - 1e-12) < 1e-18
    assert result["values"]["compute_dtype"] == "float16"
    assert report["settings"]["select"] == ["PA101"] and report["settings"]["config_file"] is None
    assert report["summary"] == {"models": 2, "findings": 1, "error": 1, "warning": 0, "info": 0, "exit_code": 1}
    assert "baseline" not in report
