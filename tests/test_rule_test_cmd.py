"""`precaudit test RULES_DIR`: a rule's own examples (its YAML tests:, and with --fixtures --allow-code its Python
fixture cases), run and compared rule by rule; the exact lines it prints, its exit code, and bad input in one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fixtures.onnx_builders import fused_norm, save
from precaudit.cli import main

ROOT = Path(__file__).resolve().parent.parent

RULE = """\
id: ORG001
name: eps-gone
severity: error
summary: The norm's eps is 0.0 in its compute dtype.
sites: [norm]
condition: {condition}
message: "eps {{eps:.0e}} is 0.0 in {{compute_dtype}}"
fix: Use 1e-5.
tests:
{tests}"""
FIRE_QUIET = """\
  - {model: fire.onnx, fires: [ln]}
  - {model: quiet.onnx, fires: []}
  - {model: fire.onnx, args: [--dtype, bf16], fires: []}
"""
WORKS = "has_eps and eps_rounded == 0"


def rule_dir(tmp_path: Path, tests: str = FIRE_QUIET, condition: str = WORKS) -> Path:
    """A user's rule folder: ORG001 and its two models, a LayerNorm 'ln' whose eps 1e-12 is 0.0 in fp16 (and a
    normal number in bf16), and its twin with eps 1e-5."""
    folder = tmp_path / "org-rules"
    folder.mkdir()
    (folder / "ORG001-eps-gone.yaml").write_text(RULE.format(condition=condition, tests=tests))
    save(fused_norm("LayerNormalization", "fp32", epsilon=1e-12, stash_type=0, name="ln"), folder / "fire.onnx")
    save(fused_norm("LayerNormalization", "fp32", epsilon=1e-5, stash_type=0, name="ln"), folder / "quiet.onnx")
    return folder


def run(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(["test", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_rule_whose_examples_hold_passes(tmp_path, capsys):
    folder = rule_dir(tmp_path)
    assert run([str(folder)], capsys) == (0, "ok ORG001 eps-gone (3 examples)\n1 rule, 3 examples: 1 ok, 0 failed\n",
                                          "")


def test_the_json_says_the_same(tmp_path, capsys):
    folder = rule_dir(tmp_path, condition="has_eps")
    code, out, err = run([str(folder), "--format", "json"], capsys)
    assert (code, err) == (1, "")
    assert json.loads(out) == {
        "rules": [{"id": "ORG001", "name": "eps-gone", "source": str(folder / "ORG001-eps-gone.yaml"), "ok": False,
                   "examples": 3, "problems": ["example 2 (quiet.onnx): fired at 'ln', where it must not",
                                               "example 3 (fire.onnx): fired at 'ln', where it must not"]}],
        "summary": {"rules": 1, "examples": 3, "ok": 0, "failed": 1}}


def test_a_broken_condition_fails_naming_each_node(tmp_path, capsys):
    """eps > 1e-6 instead of eps rounding to 0.0: it misses the firing model and fires on the twin."""
    folder = rule_dir(tmp_path, condition="has_eps and eps > 1.0e-6")
    assert run([str(folder)], capsys) == (1, "FAIL ORG001 eps-gone (3 examples)\n"
                                             "  example 1 (fire.onnx): did not fire at 'ln'\n"
                                             "  example 2 (quiet.onnx): fired at 'ln', where it must not\n"
                                             "1 rule, 3 examples: 0 ok, 1 failed\n", "")


def test_a_rule_with_only_a_firing_example_fails(tmp_path, capsys):
    folder = rule_dir(tmp_path, tests="  - {model: fire.onnx, fires: [ln]}\n")
    assert run([str(folder)], capsys) == (1, "FAIL ORG001 eps-gone (1 example)\n"
                                             "  no example where it must stay quiet\n"
                                             "1 rule, 1 example: 0 ok, 1 failed\n", "")


def test_a_rule_with_no_examples_fails_twice(tmp_path, capsys):
    folder = rule_dir(tmp_path, tests="  []\n")
    assert run([str(folder)], capsys) == (1, "FAIL ORG001 eps-gone (0 examples)\n"
                                             "  no example where it must fire\n"
                                             "  no example where it must stay quiet\n"
                                             "1 rule, 0 examples: 0 ok, 1 failed\n", "")


def test_node_names_are_escaped_for_the_terminal(tmp_path, capsys):
    folder = rule_dir(tmp_path, tests='  - {model: fire.onnx, fires: ["ln\\e[2J"]}\n  - {model: quiet.onnx, fires: []}\n')
    code, out, _ = run([str(folder)], capsys)
    assert code == 1 and "\x1b" not in out
    assert out.splitlines()[1:3] == ["  example 1 (fire.onnx): did not fire at 'ln\\x1b[2J'",
                                     "  example 1 (fire.onnx): fired at 'ln', where it must not"]


@pytest.mark.parametrize("example,problem", [
    ("{model: ../x.onnx, fires: []}", "model '../x.onnx' is outside the rule folder {root} (an example's files must "
                                      "be in it)"),
    ("{model: link.onnx, fires: []}", "model 'link.onnx' is outside the rule folder {root} (an example's files must "
                                      "be in it)"),
    ("{model: /abs/x.onnx, fires: []}", "model '/abs/x.onnx' is an absolute path; write it relative to the rule file"),
    ("{model: gone.onnx, fires: []}", "model 'gone.onnx': no such file"),
    ("{model: sub.onnx, fires: []}", "model 'sub.onnx' is not a regular file; precaudit reads only regular files"),
    ("{model: fire.onnx}", "missing key 'fires' (an example is {{model: FILE.onnx, args: [OPTION, ...], fires: "
                           "[NODE, ...]}})"),
    ("{model: fire.onnx, fires: [ln], colour: red}", "unknown key 'colour' (an example has model, args, fires)"),
    ("{model: fire.txt, fires: []}", "'model' must name an ONNX file (FILE.onnx), got 'fire.txt'"),
    ("{model: fire.onnx, fires: ln}", "'fires' must list node names (the nodes where the rule fires; [] where it "
                                      "must stay quiet), got a string"),
    ("{model: fire.onnx, fires: [], args: [--rules, /tmp]}", "args: --rules is not an option an example may give; it "
     "may give --dtype, --keep-fp32, --converter, --runtime, --check-weights, --trace, --inputs, --samples, --dim, "
     "--range, --seed, --timeout, --trace-engine"),
    ("{model: fire.onnx, fires: [], args: [-o, out.json]}", "args: --output is not an option an example may give; "
     "it may give --dtype, --keep-fp32, --converter, --runtime, --check-weights, --trace, --inputs, --samples, --dim, "
     "--range, --seed, --timeout, --trace-engine"),
    ("{model: fire.onnx, fires: [], args: [--trace, --inputs, ../in.npz]}", "--inputs file '../in.npz' is outside the "
                                                                            "rule folder {root} (an example's files "
                                                                            "must be in it)"),
    ("{model: fire.onnx, fires: [], args: [other.onnx]}", "args: 'other.onnx' is no option (an example's model is "
                                                          "its 'model')"),
    ("{model: fire.onnx, fires: [], args: [--dtype, fp12]}", "args: --dtype: unknown dtype 'fp12'; choose one of "
                                                             "fp16, bf16, fp8-e4m3, fp8-e5m2, fp32, fp64, mxfp8, "
                                                             "mxfp4, nvfp4"),
    ("{model: fire.onnx, fires: [], args: [--dim, batch]}", "args: Invalid value for '--dim': expected NAME=SIZE with "
                                                            "SIZE >= 1, got 'batch'"),
    ("{model: fire.onnx, fires: [], args: [--bogus]}", "args: No such option: --bogus (Possible options: --jobs)"),
])
def test_a_bad_example_is_exit_2_in_one_line_naming_the_rule_file(tmp_path, capsys, example, problem):
    folder = rule_dir(tmp_path, tests=f"  - {example}\n")
    (tmp_path / "x.onnx").write_bytes((folder / "fire.onnx").read_bytes())
    (tmp_path / "in.npz").write_bytes(b"")
    os.symlink(tmp_path / "x.onnx", folder / "link.onnx")
    (folder / "sub.onnx").mkdir()
    code, out, err = run([str(folder)], capsys)
    root = os.path.realpath(folder)
    assert (code, out) == (2, "")
    assert err == f"precaudit: {folder / 'ORG001-eps-gone.yaml'}:9: rule ORG001: tests: example 1: " \
                  f"{problem.format(root=root)}\n"


def test_an_example_inside_the_folder_may_be_reached_through_a_symlink_and_a_subfolder(tmp_path, capsys):
    folder = rule_dir(tmp_path, tests="  - {model: models/../link.onnx, fires: [ln]}\n"
                                      "  - {model: models/quiet.onnx, fires: []}\n")
    (folder / "models").mkdir()
    os.rename(folder / "quiet.onnx", folder / "models" / "quiet.onnx")
    os.symlink("fire.onnx", folder / "link.onnx")
    assert run([str(folder)], capsys)[:2] == (0, "ok ORG001 eps-gone (2 examples)\n1 rule, 2 examples: 1 ok, "
                                                 "0 failed\n")


def test_bad_yaml_and_a_missing_folder_are_exit_2_in_one_line(tmp_path, capsys):
    folder = rule_dir(tmp_path, tests="  - {model: fire.onnx, fires: [ln]\n")
    code, out, err = run([str(folder)], capsys)
    assert (code, out) == (2, "") and err.startswith(f"precaudit: {folder / 'ORG001-eps-gone.yaml'}:")
    assert err.count("\n") == 1 and "invalid YAML" in err
    assert run([str(tmp_path / "none")], capsys) == (2, "", f"precaudit: {tmp_path / 'none'}: no such folder\n")


def test_fixtures_without_allow_code_is_a_usage_error(tmp_path, capsys):
    folder = rule_dir(tmp_path)
    assert run([str(folder), "--fixtures", str(tmp_path)], capsys) == (
        2, "", "precaudit: --fixtures imports and runs the Python modules of its folder; add --allow-code to allow it "
               "(precaudit --help shows the usage)\n")


FIXTURE = """\
from fixtures.onnx_builders import fused_norm, save
from precaudit.ruletest.case import Case


def under(folder):
    return save(fused_norm("LayerNormalization", "fp32", epsilon=1e-12, stash_type=0, name="ln"), folder / "m.onnx")


CASES = [
    Case("right", under, {("ORG001", "ln"), ("PA101", "ln")}, values={"ORG001": {"eps": 1e-12}}),
    Case("wrong-node", under, {("ORG001", "other"), ("PA101", "ln")}),
    Case("wrong-value", under, {("ORG001", "ln"), ("PA101", "ln")}, values={"ORG001": {"eps": 1e-6, "nope": 1}}),
    Case("exit-zero", under, {("ORG001", "ln"), ("PA101", "ln")}, args=("--exit-zero",)),
    Case("twin", under, set(), dtype="bf16"),
]
"""


def test_fixture_cases_are_compared_exactly(tmp_path, capsys):
    """All findings (other rules' too), the values and the exit code, as the project's own fixtures are."""
    folder = rule_dir(tmp_path, tests="  []\n")
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "ORG001_eps_gone.py").write_text(FIXTURE)
    code, out, err = run([str(folder), "--fixtures", str(tmp_path / "cases"), "--allow-code"], capsys)
    assert (code, err) == (1, "")
    assert out == ("FAIL ORG001 eps-gone (5 examples)\n"
                   "  case wrong-node: no ORG001 at 'other'\n"
                   "  case wrong-node: ORG001 at 'ln', not expected\n"
                   "  case wrong-value: ORG001 eps = 9.999999960041972e-13, expected 1e-06\n"  # 1e-12 as float32
                   "  case wrong-value: ORG001 has no value 'nope'\n"
                   "  case exit-zero: exit code 0, where its findings make 1\n"
                   "1 rule, 5 examples: 0 ok, 1 failed\n")


def test_the_projects_own_rule_passes_with_its_fixture_cases(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert run(["rules", "--fixtures", "fixtures", "--allow-code", "--select", "PA101"], capsys) == (
        0, "ok PA101 eps-underflow (54 examples)\n1 rule, 54 examples: 1 ok, 0 failed\n", "")


def test_an_override_of_a_built_in_rule_may_bring_its_own_examples(tmp_path, capsys):
    """PA101 made to fire below 1e-4 by a user's file: its examples test the rule as overridden (the built-in one
    is quiet on eps 1e-5, which fp16 holds as a subnormal)."""
    folder = rule_dir(tmp_path)
    (folder / "ORG001-eps-gone.yaml").unlink()
    (folder / "PA101-floor.yaml").write_text("id: PA101\ncondition: has_eps and eps < 1.0e-4\n"
                                             "tests:\n  - {model: quiet.onnx, fires: [ln]}\n"
                                             "  - {model: fire.onnx, fires: []}\n")
    assert run([str(folder)], capsys) == (1, "FAIL PA101 eps-underflow (2 examples)\n"
                                             "  example 2 (fire.onnx): fired at 'ln', where it must not\n"
                                             "1 rule, 2 examples: 0 ok, 1 failed\n", "")


def test_an_inputs_file_is_read_relative_to_the_rule_file(tmp_path, capsys, monkeypatch):
    """--inputs in.npz names the folder's in.npz wherever precaudit test runs from (both spellings)."""
    import numpy as np

    folder = rule_dir(tmp_path, tests="  - {model: fire.onnx, args: [--trace, --inputs, data/in.npz], fires: [ln]}\n"
                                      "  - {model: quiet.onnx, args: [--trace, --inputs=data/in.npz], fires: []}\n")
    (folder / "data").mkdir()
    np.savez(folder / "data" / "in.npz", x=np.ones((2, 4, 8), np.float32))
    monkeypatch.chdir(tmp_path)
    assert run(["org-rules"], capsys) == (0, "ok ORG001 eps-gone (2 examples)\n1 rule, 2 examples: 1 ok, 0 failed\n",
                                          "")
    (folder / "data" / "in.npz").unlink()
    code, out, err = run(["org-rules"], capsys)
    assert (code, out, err) == (2, "", "precaudit: org-rules/ORG001-eps-gone.yaml:9: rule ORG001: tests: example 1: "
                                       "--inputs file 'data/in.npz': no such file\n")
