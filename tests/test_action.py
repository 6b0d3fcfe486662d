"""The GitHub Action (action.yml): its inputs reach the scripts only as environment variables, and its scripts
(action/run.sh, action/install.sh) run here as the action runs them, on models built in the test."""

import json
import os
import subprocess
import sys
from pathlib import Path

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
    upload = next(s for s in steps() if s.get("uses", "").startswith("github/codeql-action/upload-sarif"))
    assert upload["if"].startswith("always()")  # findings fail the audit step; they must upload all the same


def run_action(folder: Path, models: str, tmp_path: Path, **env: str) -> tuple[int, str, dict]:
    """action/run.sh as the audit step runs it: in the workflow's checkout, `python` on PATH, the inputs in env."""
    output = tmp_path / "github_output"
    output.write_text("")
    environ = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               "PYTHONPATH": str(ROOT),  # this checkout's precaudit, as the action's install step would give
               "PRECAUDIT_MODELS": models, "GITHUB_OUTPUT": str(output), "RUNNER_TEMP": str(tmp_path), **env}
    proc = subprocess.run(["bash", str(ROOT / "action" / "run.sh")], cwd=folder, env=environ, capture_output=True,
                          text=True, timeout=300)
    outputs = dict(line.split("=", 1) for line in output.read_text().splitlines())
    return proc.returncode, proc.stdout, outputs


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
    code, stdout, outputs = run_action(checkout, "models/a b;$(touch pwned).onnx\n", tmp_path,
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
    code, stdout, outputs = run_action(checkout, "  models/**/twin.onnx  \n\n", tmp_path)
    assert code == 0, stdout
    assert "Found 1 finding in 1 model (models/ok/twin.onnx): 0 errors" in stdout
    assert outputs == {"exit-code": "0"}  # no SARIF asked for, none written


def test_args_are_split_as_words_and_never_run(checkout: Path, tmp_path: Path):
    """Quotes group words; `$(...)` and `;` in args are text handed to precaudit, which refuses the unknown
    selector (exit 2) instead of a shell running it."""
    sarif = tmp_path / "out dir" / "report.sarif"
    sarif.parent.mkdir()
    code, stdout, _ = run_action(checkout, "models/ok/twin.onnx", tmp_path, PRECAUDIT_SARIF=str(sarif),
                                 PRECAUDIT_ARGS="--fail-on 'warning' --select PA2")
    assert code == 1 and "title=PA208 statistic-overflow" in stdout  # the twin's warning, now at --fail-on
    assert json.loads(sarif.read_text())["runs"][0]["results"][0]["ruleId"] == "PA208"
    code, _, _ = run_action(checkout, "models/ok/twin.onnx", tmp_path, PRECAUDIT_ARGS="--select '$(touch pwned);x'")
    assert code == 2 and not (checkout / "pwned").exists()


def test_a_glob_that_matches_nothing_is_an_error_not_a_pass(checkout: Path, tmp_path: Path):
    code, _, outputs = run_action(checkout, "exports/*.onnx", tmp_path)
    assert code == 2 and outputs == {"exit-code": "2"}


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

    assert install()[-1] == f"-m|pip|install|--quiet|--|{ROOT}|"  # the action's own folder
    calls = install(PRECAUDIT_INSTALL="precaudit==0.1.0; touch pwned", PRECAUDIT_TORCH="true")
    assert calls[1].startswith("-m|pip|install|--quiet|torch==2.13.0|--index-url|https://download.pytorch.org/whl/cpu")
    assert calls[-1] == "-m|pip|install|--quiet|--|precaudit==0.1.0; touch pwned|"
    assert not (tmp_path / "pwned").exists()
