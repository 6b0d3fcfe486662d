"""--select and --ignore replace [tool.precaudit]'s lists; --extend-select and --extend-ignore add to them (Ruff's
semantics), each checked and named as typed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from precaudit.cli import main
from tests.helpers import run_json

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tiny_block_fp16.onnx"
ALL_FOUND = ["PA101", "PA208", "PA201", "PA102", "PA208", "PA105"]  # the example's findings, in report order


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A repository with the README's example model and a pyproject that ignores PA208."""
    (tmp_path / ".git").mkdir()
    shutil.copy(EXAMPLE, tmp_path / "m.onnx")
    (tmp_path / "pyproject.toml").write_text('[tool.precaudit]\nignore = ["PA208"]\n')
    monkeypatch.chdir(tmp_path)
    return tmp_path


def found(project: Path, *args: str) -> tuple[list[str], dict]:
    _, report = run_json(["m.onnx"], *args, out_dir=project)
    return [r["rule_id"] for r in report["results"]], report["settings"]


@pytest.mark.parametrize("args,rules,ignore", [
    ((), ["PA101", "PA201", "PA102", "PA105"], ["PA208"]),
    (("--ignore", "PA201"), ["PA101", "PA208", "PA102", "PA208", "PA105"], ["PA201"]),
    (("--extend-ignore", "PA201"), ["PA101", "PA102", "PA105"], ["PA208", "PA201"]),
    (("--ignore", "PA105", "--extend-ignore", "PA201,PA101"), ["PA208", "PA102", "PA208"], ["PA105", "PA201", "PA101"]),
])
def test_ignore_replaces_the_pyprojects_list_and_extend_ignore_adds_to_it(project, args, rules, ignore):
    ran, settings = found(project, *args)
    assert ran == rules and settings["ignore"] == ignore


def test_extend_select_adds_to_the_pyprojects_select(project):
    (project / "pyproject.toml").write_text('[tool.precaudit]\nselect = ["PA1"]\n')
    assert found(project)[0] == ["PA101", "PA102", "PA105"]
    assert found(project, "--select", "PA201")[0] == ["PA201"]
    rules, settings = found(project, "--extend-select", "PA201")
    assert rules == ["PA101", "PA201", "PA102", "PA105"] and settings["select"] == ["PA1", "PA201"]


def test_extend_select_without_a_select_adds_to_every_rule(project, tmp_path):
    """A preview rule runs only when named exactly: --extend-select turns it on beside every default rule."""
    rule = tmp_path / "preview.yaml"
    rule.write_text("id: ORG901\nname: org-any-norm\nseverity: info\nsummary: s\nsites: [norm]\npreview: true\n"
                    "condition: has_eps\nmessage: m\nfix: f\n")
    (project / "pyproject.toml").write_text(f'[tool.precaudit]\nrules = ["{rule}"]\n')
    assert found(project)[0] == ALL_FOUND
    assert found(project, "--select", "ORG901")[0] == ["ORG901"] * 3  # the three norms with an eps
    rules, settings = found(project, "--extend-select", "ORG901")
    assert sorted(rules) == sorted([*ALL_FOUND, *["ORG901"] * 3]) and settings["select"] == ["ALL", "ORG901"]


@pytest.mark.parametrize("flag", ["--extend-select", "--extend-ignore"])
def test_an_extend_selector_that_matches_nothing_names_its_flag(project, capsys, flag):
    assert main(["m.onnx", flag, "PA999"]) == 2
    assert capsys.readouterr().err == \
        f"precaudit: {flag}: 'PA999' matches no rule id, name or id prefix (see `precaudit rules`)\n"


def test_show_settings_shows_both_lists_and_where_each_came_from(project, capsys):
    assert main(["--show-settings", "--extend-ignore", "PA201"]) == 0
    lines = {line.split("=")[0].strip(): line for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines["ignore"].split("#")[1].strip() == "pyproject.toml" and '["PA208"]' in lines["ignore"]
    assert lines["extend-ignore"].split("#")[1].strip() == "command line" and '["PA201"]' in lines["extend-ignore"]


@pytest.mark.parametrize("flag,kept", [
    ("--ignore", ["/attn_norm/", "/mlp_norm/"]),  # the pyproject's PA208 at /attn_norm/ counts again
    ("--extend-ignore", ["/mlp_norm/"]),  # PA208 and PA101 ignored: only /mlp_norm/'s PA102 is left to keep
])
def test_keep_list_replaces_or_extends_the_pyprojects_ignore(project, capsys, flag, kept):
    assert main(["keep-list", "m.onnx", "--for", "onnxruntime", flag, "PA101", "-f", "json"]) == 0
    nodes = [n["name"] for n in json.loads(capsys.readouterr().out)["nodes"]]
    assert sorted({name[:name.index("/", 1) + 1] for name in nodes}) == kept
