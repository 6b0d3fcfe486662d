"""The command line's grammar as a shell meets it: the default command, shell completion through click's environment
protocol (in a child process, as a shell runs it), --help, mistyped words, and a grammar nothing imports back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.onnx_builders import fused_norm, save
from precaudit.cli import main
from tests.helpers import run_json
from tests.test_architecture import import_graph

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = ["check", "rules", "explain", "match", "keep-list", "fix", "train", "runtimes", "eps", "scales", "test"]


@pytest.fixture
def underflow(tmp_path):
    """A float32 LayerNorm whose eps 1e-12 rounds to zero in fp16 (PA101), and is a normal number in bf16."""
    return save(fused_norm("LayerNormalization", "fp32", epsilon=1e-12, stash_type=0, name="ln"), tmp_path / "under.onnx")


def _child(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """precaudit in a process of its own, on this checkout, as a shell starts it."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "precaudit", *args], capture_output=True, text=True, env=full,
                          timeout=120)


def _complete(words: str, instruction: str = "bash_complete") -> subprocess.CompletedProcess:
    """A TAB through click's environment protocol: the words typed so far, the last one being completed."""
    cword = len(words.split()) - (0 if words.endswith(" ") else 1)
    return _child([], {"_PRECAUDIT_COMPLETE": instruction, "COMP_WORDS": words, "COMP_CWORD": str(cword)})


# ---- the default command ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["{m}", "--dtype", "bf16"], ["--dtype", "bf16", "{m}"], ["check", "{m}", "-d", "bf16"]])
def test_a_model_first_is_the_check_command(underflow, tmp_path, args):
    """bf16 holds eps 1e-12 as a normal number: no PA101, whichever place the option takes."""
    code, report = run_json([], *[a.format(m=underflow) for a in args], out_dir=tmp_path)
    assert code == 0 and report["settings"]["dtype"] == "bf16" and report["models"] == [str(underflow)]
    assert report["results"] == []


def test_after_a_double_dash_a_model_may_look_like_an_option(underflow, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("--weird-name.onnx").write_bytes(underflow.read_bytes())
    assert main(["--format", "json", "-o", "report.json", "--", "--weird-name.onnx"]) == 1
    report = json.loads(Path("report.json").read_text())
    assert report["models"] == ["--weird-name.onnx"]
    assert [(r["rule_id"], r["node_name"]) for r in report["results"]] == [("PA101", "ln")]


def test_a_mistyped_command_is_named_not_read_as_a_model(capsys):
    assert main(["chek", "under.onnx"]) == 2
    assert capsys.readouterr().err == ("precaudit: No such command 'chek'. Did you mean 'check'? "
                                       "(precaudit --help shows the usage)\n")


@pytest.mark.parametrize("args", [["{m}", "--fail-onn", "warning"], ["--fail-onn", "warning", "{m}"]])
def test_a_mistyped_option_of_the_default_command_gets_clicks_suggestion(underflow, capsys, args):
    assert main([a.format(m=underflow) for a in args]) == 2
    assert capsys.readouterr().err == ("precaudit: No such option: --fail-onn (Possible options: --fail-on) "
                                       "(precaudit --help shows the usage)\n")


def test_a_bare_precaudit_is_a_usage_error_with_the_help_on_stderr(capsys):
    assert main([]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("Usage: precaudit [OPTIONS] [COMMAND] [ARGS]...\n")


# ---- --help -------------------------------------------------------------------------------------------------------

def test_help_lists_every_command_then_the_default_commands_options(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    commands = out.split("Commands:\n", 1)[1].split("\n\n", 1)[0]
    assert [line.split()[0] for line in commands.splitlines() if line.startswith("  ") and line[2] != " "] == COMMANDS
    default = out.split("The default command, check (`precaudit MODEL` is `precaudit check MODEL`):\n", 1)[1]
    assert "  -d, --dtype DTYPE" in default and "  --fail-on error|warning|info|never" in default
    assert "  --version" in out.split("Commands:")[0] and "  --show-completion" in out.split("Commands:")[0]


@pytest.mark.parametrize("command", ["check", "keep-list", "fix"])
def test_help_says_which_selection_flags_replace_and_which_add(command, capsys):
    assert main([command, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--select RULE,... Only these rules: ids, names or id prefixes (PA1), or ALL. Replaces [tool.precaudit] " \
           "select." in out
    assert "--ignore RULE,... Not these rules (wins over --select). Replaces [tool.precaudit] ignore." in out
    assert "--extend-select RULE,... These rules too, added to --select or [tool.precaudit] select" in out
    assert "--extend-ignore RULE,... Not these rules either, added to --ignore or [tool.precaudit] ignore." in out


# ---- shell completion, through click's environment protocol ------------------------------------------------------

@pytest.mark.parametrize("words,expected", [
    ("precaudit ke", ["keep-list"]),
    ("precaudit ", COMMANDS),  # TAB on nothing: the commands
    ("precaudit --dt", ["--dtype"]),  # the default command's options, before any model
    ("precaudit model.onnx --fail", ["--fail-on"]),
    ("precaudit model.onnx --format s", ["sarif"]),  # an option's values
    ("precaudit keep-list model.onnx --tol", ["--tolerance"]),
    ("precaudit keep-list model.onnx --for onnx", ["onnxconverter-common", "onnxruntime"]),
    ("precaudit check --extend-", ["--extend-select", "--extend-ignore"]),
])
def test_tab_completes_commands_options_and_values(words, expected):
    done = _complete(words)
    assert (done.returncode, done.stdout.splitlines(), done.stderr) == (0, expected, "")


def test_tab_answers_typers_spelling_of_the_request_too():
    """The script --show-completion prints sends complete_bash (typer's order); click's is bash_complete."""
    done = _complete("precaudit ex", "complete_bash")
    assert (done.returncode, done.stdout, done.stderr) == (0, "explain\n", "")


def test_show_completion_prints_the_script_and_exits_0():
    done = _child(["--show-completion", "bash"], {"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert done.returncode == 0 and done.stderr == ""
    assert "_PRECAUDIT_COMPLETE=complete_bash" in done.stdout
    assert done.stdout.rstrip().endswith("complete -o default -F _precaudit_completion precaudit")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_printed_script_completes_in_bash(tmp_path):
    """The script, sourced by bash, asks precaudit and fills COMPREPLY: the whole round trip a TAB makes."""
    script = _child(["--show-completion", "bash"], {"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}).stdout
    (tmp_path / "completion.sh").write_text(script)
    launcher = tmp_path / "bin" / "precaudit"
    launcher.parent.mkdir()
    launcher.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m precaudit "$@"\n')
    launcher.chmod(0o755)
    line = ("source completion.sh; COMP_WORDS=(precaudit keep-list m.onnx --max); COMP_CWORD=3; "
            "_precaudit_completion precaudit; printf '%s\\n' \"${COMPREPLY[@]}\"")
    env = {**os.environ, "PATH": f"{launcher.parent}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["bash", "--norc", "-c", line], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "--max-runs\n", "")


def test_install_completion_writes_the_script_into_home_and_exits_0(tmp_path):
    done = _child(["--install-completion", "bash"],
                  {"HOME": str(tmp_path), "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert done.returncode == 0 and done.stderr == ""
    script = tmp_path / ".bash_completions" / "precaudit.sh"
    assert "_PRECAUDIT_COMPLETE=complete_bash" in script.read_text()
    assert f"source '{script}'" in (tmp_path / ".bashrc").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".bash_completions", ".bashrc"]


# ---- the house: a fast --version, and a grammar nothing imports back ---------------------------------------------

def test_version_imports_no_typer():
    code = "import sys; from precaudit.cli import main; main(['--version']); print('typer' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.splitlines()[-1] == "False"


def test_no_command_module_imports_the_grammar():
    """The grammar imports the commands, each when it runs; a command imports the grammar never (no circle), and
    only the package's door (main) imports it."""
    graph = import_graph()
    importers = sorted(name for name, targets in graph.items() if "precaudit.cli.grammar" in targets)
    assert importers == ["precaudit.cli"]
    commands = ["check", "rule_docs", "keep_list", "fix", "train", "runtimes", "eps", "scales", "test_cmd"]
    assert all(f"precaudit.cli.{c}" in graph["precaudit.cli.grammar"] for c in commands)
