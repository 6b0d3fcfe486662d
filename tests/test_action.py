"""The GitHub Action (action.yml): its inputs reach the scripts only as environment variables, and its scripts
(action/run.sh, action/install.sh) run here as the action runs them, on models built in the test."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from fixtures.onnx_builders import decomposed_layernorm, save

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the action's scripts are bash")


def steps() -> list[dict]:
    return yaml.safe_load((ROOT / "action.yml").read_text())["runs"]["steps"]


def test_inputs_reach_the_scripts_through_env_only():
    """An expression inside `run:` is pasted into the script's text before bash reads it: a model named
    `$(curl ...)` would run. Every run step must be a fixed command, with the inputs in its env."""
    runs = [s for s in steps() if "run" in s]
    assert [s["run"] for s in runs] == ['bash "$GITHUB_ACTION_PATH/action/install.sh"',
                                       'bash "$GITHUB_ACTION_PATH/action/run.sh"']
    for step in runs:
        assert "${{" not in step["run"]
    audit = next(s for s in runs if s.get("id") == "audit")
    assert audit["env"]["PRECAUDIT_MODELS"] == "${{ inputs.models }}"
    assert audit["env"]["PRECAUDIT_FACTORIES"] == "${{ inputs.factories }}"
    inputs = yaml.safe_load((ROOT / "action.yml").read_text())["inputs"]
    assert inputs["factories"]["default"] == "false"  # no code from the repository runs unless the workflow says so
    upload = next(s for s in steps() if s.get("uses", "").startswith("github/codeql-action/upload-sarif"))
    assert upload["if"].startswith("always()")  # findings fail the audit step; they must upload all the same


class Step(NamedTuple):
    code: int
    stdout: str
    outputs: dict[str, str]
    stderr: str
    github_output: list[str]  # the lines written to GITHUB_OUTPUT, as the runner reads them


def run_action(folder: Path, models: str, tmp_path: Path, **env: str) -> Step:
    """action/run.sh as the audit step runs it: in the workflow's checkout, `python` on PATH, the inputs in env."""
    output = tmp_path / "github_output"
    output.write_text("")
    environ = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               "PYTHONPATH": str(ROOT),  # this checkout's precaudit, as the action's install step would give
               "PRECAUDIT_MODELS": models, "GITHUB_OUTPUT": str(output), "RUNNER_TEMP": str(tmp_path), **env}
    proc = subprocess.run(["bash", str(ROOT / "action" / "run.sh")], cwd=folder, env=environ, capture_output=True,
                          text=True, timeout=300)
    lines = output.read_text().splitlines()
    return Step(proc.returncode, proc.stdout, dict(line.split("=", 1) for line in lines), proc.stderr, lines)


_ANNOTATION = re.compile(r"::(error|warning|notice) (file=[^:,]*,(line=\d+,)?)?title=[^:,]*::")


def commands_in(text: str) -> list[str]:
    """The lines of a step's log GitHub's runner acts on: a `::command` (after leading blanks), or, in any other
    line, its older `##[command]` syntax anywhere (actions/runner, ActionCommand.TryParseV2 then TryParse)."""
    return [line for line in text.splitlines() if line.lstrip().startswith("::") or "##[" in line]


def foreign_commands(step: Step) -> list[str]:
    """Every command line in the log that is not one of precaudit's own annotations (nor the script's ::error)."""
    return [line for line in commands_in(step.stdout + step.stderr)
            if not _ANNOTATION.match(line) and not line.startswith("::error title=precaudit::")]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A repository with a float32 LayerNorm whose eps 1e-12 is 0.0 in fp16, under a name a shell would run, and
    its twin with eps 1e-3."""
    folder = tmp_path / "repo"
    (folder / "models" / "ok").mkdir(parents=True)
    save(decomposed_layernorm(1e-12, dtype="fp32")[0], folder / "models" / "a b;$(touch pwned).onnx")
    save(decomposed_layernorm(1e-3, dtype="fp32")[0], folder / "models" / "ok" / "twin.onnx")
    return folder


def test_an_error_finding_fails_the_step_and_reaches_sarif_and_annotations(checkout: Path, tmp_path: Path):
    code, stdout, outputs, *_ = run_action(checkout, "models/a b;$(touch pwned).onnx\n", tmp_path,
                                           PRECAUDIT_UPLOAD_SARIF="true")
    assert code == 1
    assert not list(checkout.rglob("pwned")) and not (tmp_path / "pwned").exists()
    assert "::error file=models/a b;$(touch pwned).onnx,line=1,title=PA101 eps-underflow::" in stdout
    assert outputs == {"exit-code": "1", "sarif-file": str(tmp_path / "precaudit.sarif")}
    sarif = json.loads(Path(outputs["sarif-file"]).read_text())
    results = sarif["runs"][0]["results"]
    assert {r["ruleId"] for r in results if r["level"] == "error"} == {"PA101"}
    assert {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in results} == \
        {"models/a b;$(touch pwned).onnx"}


def test_the_clean_twin_passes_and_globs_expand(checkout: Path, tmp_path: Path):
    code, stdout, outputs, *_ = run_action(checkout, "  models/**/twin.onnx  \n\n", tmp_path)
    assert code == 0, stdout
    assert "Found 1 finding in 1 model (models/ok/twin.onnx): 0 errors" in stdout
    assert outputs == {"exit-code": "0"}  # no SARIF asked for, none written


def test_args_are_split_as_words_and_never_run(checkout: Path, tmp_path: Path):
    """Quotes group words; `$(...)` and `;` in args are text handed to precaudit, which refuses the unknown
    selector (exit 2) instead of a shell running it."""
    sarif = tmp_path / "out dir" / "report.sarif"
    sarif.parent.mkdir()
    code, stdout, *_ = run_action(checkout, "models/ok/twin.onnx", tmp_path, PRECAUDIT_SARIF=str(sarif),
                                  PRECAUDIT_ARGS="--fail-on 'warning' --select PA2")
    assert code == 1 and "title=PA208 statistic-overflow" in stdout  # the twin's warning, now at --fail-on
    assert json.loads(sarif.read_text())["runs"][0]["results"][0]["ruleId"] == "PA208"
    code, *_ = run_action(checkout, "models/ok/twin.onnx", tmp_path, PRECAUDIT_ARGS="--select '$(touch pwned);x'")
    assert code == 2 and not (checkout / "pwned").exists()


def test_a_glob_that_matches_nothing_is_an_error_not_a_pass(checkout: Path, tmp_path: Path):
    step = run_action(checkout, "exports/*.onnx\nmodels/ok/twin.onnx", tmp_path)
    assert step.code == 2 and step.outputs == {"exit-code": "2"}
    assert step.stdout.splitlines()[0] == "::error title=precaudit::models: no file matches exports/*.onnx"
    assert "Found 1 finding in 1 model (models/ok/twin.onnx)" in step.stdout  # the rest is audited


FACTORY = """from pathlib import Path
Path(__file__).with_name("imported-" + Path(__file__).stem).write_text("ran")
import torch


class Norm(torch.nn.Module):
    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-12)


def make():
    return Norm(), (torch.randn(2, 8),)
"""


def plant(folder: Path, name: str) -> Path:
    """models/NAME.py, a factory whose import writes models/imported-NAME, and beside it a file named NAME.py:make."""
    (folder / "models" / f"{name}.py").write_text(FACTORY)
    (folder / "models" / f"{name}.py:make").write_bytes(b"")
    return folder / "models" / f"imported-{name}"


def test_a_glob_match_is_a_path_never_a_factory(checkout: Path, tmp_path: Path):
    """A pull request adds evil.py and a file named `evil.py:make`; the workflow's glob matches the latter."""
    marker = plant(checkout, "evil")
    step = run_action(checkout, "models/*:make", tmp_path)
    assert not marker.exists()
    assert step.code == 2 and step.outputs == {"exit-code": "2"}
    assert step.stderr.splitlines() == ["precaudit: models/evil.py:make: unsupported model type: precaudit reads "
                                        ".onnx files and PyTorch models (model.py:factory, package.module:factory, "
                                        ".pt2, TorchScript .pt)"]


@pytest.mark.requires("torch")
def test_a_factory_is_imported_only_from_a_literal_line_with_factories_true(checkout: Path, tmp_path: Path):
    (checkout / "models" / "net.py").write_text(FACTORY)
    net = checkout / "models" / "imported-net"
    decoy = plant(checkout, "decoy")
    step = run_action(checkout, "models/net.py:make", tmp_path)  # factories not given: false
    assert not net.exists() and step.code == 2
    assert step.stderr.splitlines() == ["precaudit: models/net.py:make: no such file (--no-factories: precaudit "
                                        "imports no model.py:factory)"]
    step = run_action(checkout, "models/net.py:make\nmodels/decoy*:make", tmp_path, PRECAUDIT_FACTORIES="true")
    assert net.exists() and not decoy.exists()
    line = FACTORY.splitlines().index("        return (x - mean) / torch.sqrt(var + 1e-12)") + 1
    assert f"::error file=models/net.py,line={line},title=PA101 eps-underflow::" in step.stdout
    assert step.code == 2  # the decoy: a file, and no model
    assert step.stderr.splitlines() == ["precaudit: models/decoy.py:make: unsupported model type: precaudit reads "
                                        ".onnx files and PyTorch models (model.py:factory, package.module:factory, "
                                        ".pt2, TorchScript .pt)"]


def test_a_glob_match_that_looks_like_an_option_is_a_path(checkout: Path, tmp_path: Path):
    (checkout / "victim.txt").write_text("keep")
    for name in ("--output=victim.txt", "--trust-pickle"):
        (checkout / name).write_bytes(b"garbage")
    step = run_action(checkout, "--*", tmp_path, PRECAUDIT_UPLOAD_SARIF="true")
    assert (checkout / "victim.txt").read_text() == "keep"
    assert step.code == 2
    assert [line.split(": ")[1] for line in step.stderr.splitlines()] == ["--output=victim.txt", "--trust-pickle"]


def test_one_line_per_bad_match(checkout: Path, tmp_path: Path):
    """The SARIF run and the annotations run both fail on it: its stderr line is said once."""
    (checkout / "models" / "bad one two.onnx").write_bytes(b"garbage")
    step = run_action(checkout, "models/bad*.onnx", tmp_path, PRECAUDIT_UPLOAD_SARIF="true")
    assert step.code == 2
    assert step.stderr.splitlines() == ["precaudit: models/bad one two.onnx: not a readable ONNX model (DecodeError: "
                                        "Error parsing message with type 'onnx.ModelProto': Wire format was corrupt)"]
    assert step.outputs == {"exit-code": "2", "sarif-file": str(tmp_path / "precaudit.sarif")}  # the error, in SARIF


def test_a_sarif_path_with_a_line_break_is_refused(checkout: Path, tmp_path: Path):
    step = run_action(checkout, "models/ok/twin.onnx", tmp_path, PRECAUDIT_SARIF=f"{tmp_path}/r.sarif\nexit-code=0")
    assert step.code == 2 and step.github_output == ["exit-code=2"]
    assert step.stdout == "::error title=precaudit::the sarif input holds a line break: give one file path\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["github_output", "repo"]


def test_a_sarif_path_naming_the_model_is_never_claimed(checkout: Path, tmp_path: Path):
    twin = checkout / "models" / "ok" / "twin.onnx"
    before = twin.read_bytes()
    step = run_action(checkout, "models/ok/twin.onnx", tmp_path, PRECAUDIT_SARIF="models/ok/twin.onnx",
                      PRECAUDIT_UPLOAD_SARIF="true")
    assert twin.read_bytes() == before
    assert step.code == 2 and step.github_output == ["exit-code=2"]  # no sarif-file: upload-sarif is skipped
    assert step.stderr.splitlines() == ["precaudit: models/ok/twin.onnx: refusing to write the report over one of "
                                        "the inputs"]


def test_file_names_carrying_workflow_commands_stay_data(checkout: Path, tmp_path: Path):
    (checkout / "models" / "a b;$(touch pwned).onnx").rename(checkout / "models" / "##[error]boom.onnx")
    (checkout / "models" / "::error::x.onnx").write_bytes(b"garbage")
    (checkout / "models" / "##[set-output name=exit-code]0.onnx").write_bytes(b"garbage")
    step = run_action(checkout, "models/*.onnx\nmodels/##[[]add-mask]*", tmp_path, PRECAUDIT_UPLOAD_SARIF="true")
    assert step.code == 2
    assert foreign_commands(step) == []
    assert [line for line in step.stdout.splitlines() if line.startswith("::")] == [
        line for line in step.stdout.splitlines() if _ANNOTATION.match(line)]
    titles = [_ANNOTATION.match(line)[0] for line in commands_in(step.stdout)[1:]]
    assert sorted(titles) == [
        "::error file=models/##[error]boom.onnx,line=1,title=PA101 eps-underflow::",
        "::error file=models/##[set-output name=exit-code]0.onnx,title=precaudit could not audit this model::",
        "::error file=models/%3A%3Aerror%3A%3Ax.onnx,title=precaudit could not audit this model::",
        "::warning file=models/##[error]boom.onnx,line=1,title=PA208 statistic-overflow::"]
    # the glob that matches nothing, said by the script itself
    assert step.stdout.splitlines()[0] == "::error title=precaudit::models: no file matches models/##\\x5b[]add-mask]*"
    assert len(step.stderr.splitlines()) == 2 and step.github_output[0] == "exit-code=2"


def test_an_unclosed_quote_in_args_is_one_error_line(checkout: Path, tmp_path: Path):
    step = run_action(checkout, "models/ok/twin.onnx", tmp_path, PRECAUDIT_ARGS="--select 'PA1")
    assert step.code == 2 and step.github_output == ["exit-code=2"]
    assert step.stdout == ("::error title=precaudit::the args input does not split into words as a shell splits them: "
                           "No closing quotation\n")
    assert step.stderr == ""


def test_the_checkouts_python_files_never_shadow_a_module(checkout: Path, tmp_path: Path):
    """`python -m` and `python -c` put the working folder first on sys.path: a pull request's shlex.py or typer.py
    would be imported in place of the real one."""
    for name in ("shlex", "typer", "onnx", "precaudit"):
        (checkout / f"{name}.py").write_text(f"open('shadowed-{name}', 'w')\n")
    for factories in ("false", "true"):
        step = run_action(checkout, "models/ok/twin.onnx", tmp_path, PRECAUDIT_ARGS="--fail-on warning",
                          PRECAUDIT_FACTORIES=factories)
        assert sorted(p.name for p in checkout.glob("shadowed-*")) == []
        assert step.code == 1 and "title=PA208 statistic-overflow" in step.stdout


def test_install_passes_its_input_to_pip_as_one_word(tmp_path: Path):
    """install.sh with a `python` that records its arguments instead of installing (the suite has no network)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/usr/bin/env bash\nprintf "%s|" "$@" >> "{log}"\necho >> "{log}"\n')
    (bin_dir / "python").chmod(0o755)
    environ = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               "GITHUB_ACTION_PATH": str(ROOT)}

    def install(**env: str) -> list[str]:
        log.write_text("")
        subprocess.run(["bash", str(ROOT / "action" / "install.sh")], cwd=tmp_path, env={**environ, **env},
                       check=True, timeout=60)
        return log.read_text().splitlines()

    # -I: the checkout (the working folder) is not on sys.path, where a pull request's pip/ would run as pip
    assert install()[-1] == f"-I|-m|pip|install|--quiet|--|{ROOT}|"  # the action's own folder
    calls = install(PRECAUDIT_INSTALL="precaudit==0.1.0; touch pwned", PRECAUDIT_TORCH="true")
    assert calls[1].startswith("-I|-m|pip|install|--quiet|torch==2.13.0|--index-url|https://download.pytorch.org/whl/cpu")
    assert calls[-1] == "-I|-m|pip|install|--quiet|--|precaudit==0.1.0; touch pwned|"
    assert not (tmp_path / "pwned").exists()
