"""Factory or file: an argument that names an existing file is that file, never `model.py:factory` code to import;
with --no-factories nothing is imported at all. A pull request can add `evil.py` and a file named `evil.py:make`
beside it, and a CI glob like `models/*` hands that name to precaudit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fixtures.onnx_builders import decomposed_layernorm, save
from precaudit import config
from precaudit.cli import main
from precaudit.frontends.torch_input import is_torch_input, torch_input_files


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """x.py, whose import writes the file `imported`, beside an empty file literally named `x.py:make`; the test
    runs in that folder."""
    (tmp_path / "x.py").write_text("from pathlib import Path\nPath(__file__).with_name('imported').write_text('ran')\n"
                                   "def make():\n    raise SystemExit(3)\n")
    (tmp_path / "x.py:make").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def stderr_lines(capsys: pytest.CaptureFixture) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_an_existing_file_named_like_a_factory_is_read_as_a_file(planted: Path, capsys: pytest.CaptureFixture):
    assert not is_torch_input("x.py:make")
    assert torch_input_files("x.py:make") == [Path("x.py:make")]
    assert main(["check", "x.py:make"]) == 2
    assert not (planted / "imported").exists()
    assert stderr_lines(capsys) == ["precaudit: x.py:make: unsupported model type: precaudit reads .onnx files and "
                                    "PyTorch models (model.py:factory, package.module:factory, .pt2, TorchScript .pt)"]


def test_a_dangling_symlink_named_like_a_factory_is_a_path_too(planted: Path, capsys: pytest.CaptureFixture):
    os.symlink(planted / "gone", planted / "y.py:make")
    (planted / "y.py").write_text((planted / "x.py").read_text())
    assert main(["check", "y.py:make"]) == 2
    assert not (planted / "imported").exists()
    assert len(stderr_lines(capsys)) == 1


def test_no_factories_imports_nothing(planted: Path, capsys: pytest.CaptureFixture):
    (planted / "x.py:make").unlink()
    for command in (["check"], ["keep-list", "--for", "pytorch"], ["match", "PA101"]):
        assert main([*command, "--no-factories", "x.py:make"]) == 2, command
        assert stderr_lines(capsys) == ["precaudit: x.py:make: no such file (--no-factories: precaudit imports no "
                                        "model.py:factory)"], command
    assert not (planted / "imported").exists()


@pytest.mark.requires("torch")
def test_train_refuses_a_file_named_like_a_factory(planted: Path, capsys: pytest.CaptureFixture):
    assert main(["train", "x.py:make"]) == 2
    assert not (planted / "imported").exists()
    assert stderr_lines(capsys) == ["precaudit: x.py:make: names a file, not a factory: precaudit reads a path it is "
                                    "given as a file, never imports it as code"]


def test_no_factories_refuses_trust_pickle(planted: Path, capsys: pytest.CaptureFixture):
    assert main(["check", "--no-factories", "--trust-pickle", "m.pt"]) == 2
    assert stderr_lines(capsys) == ["precaudit: --trust-pickle unpickles code from the model file, which "
                                    "--no-factories forbids (precaudit --help shows the usage)"]


def test_no_factories_is_in_the_help(capsys: pytest.CaptureFixture):
    assert main(["check", "--help"]) == 0
    assert "--no-factories" in capsys.readouterr().out


def test_no_factories_still_audits_files(tmp_path: Path, capsys: pytest.CaptureFixture):
    model = save(decomposed_layernorm(1e-12, dtype="fp32")[0], tmp_path / "m.onnx")
    assert main(["check", "--no-factories", str(model)]) == 1
    assert "Found 2 findings in 1 model" in capsys.readouterr().out


def test_after_double_dash_every_word_is_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture):
    """As the GitHub Action passes glob matches: `--output=victim.txt` names a file, not the -o option, and a file
    named `--debug` turns on no tracebacks."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "victim.txt").write_text("keep")
    for name in ("--output=victim.txt", "--trust-pickle", "--debug"):
        (tmp_path / name).write_bytes(b"garbage")
    assert main(["check", "--", "--output=victim.txt", "--trust-pickle"]) == 2
    assert (tmp_path / "victim.txt").read_text() == "keep"
    err = stderr_lines(capsys)
    assert [line.split(": ")[1] for line in err] == ["--output=victim.txt", "--trust-pickle"]
    assert main(["check", "--dtype", "fp12", "--", "--debug"]) == 2
    err = stderr_lines(capsys)
    assert err == ["precaudit: --dtype: unknown dtype 'fp12'; choose one of fp16, bf16, fp8-e4m3, fp8-e5m2, fp32, fp64, mxfp8, mxfp4, nvfp4"]


@pytest.mark.parametrize("key", ["trust-pickle = true", "factories = true", "trust_pickle = true"])
def test_no_config_key_turns_on_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                                     key: str):
    """The pyproject comes from the pull request too: nothing in it may import code or unpickle."""
    assert not {"trust_pickle", "factories", "no_factories"} & set(config._KEYS)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_text(f"[tool.precaudit]\n{key}\n")
    assert main(["check", "--show-settings"]) == 2
    assert "unknown key" in capsys.readouterr().err
