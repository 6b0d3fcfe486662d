"""PyTorch models from a stranger's pull request: loading one never runs code from a file, and a model that exits
or raises is one stderr line and exit 2 for that model while the others are still audited.

The hostile archives are built here from a real torch.export.save: each one's payload creates a marker file when
it runs (the canary test proves plain torch.export.load runs it), and precaudit must never let it appear.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from precaudit.cli import main  # noqa: E402
from precaudit.errors import InputError  # noqa: E402
from precaudit.frontends.torch_input import load_torch_for_trace, torch_input_files  # noqa: E402
from precaudit.options import TorchOptions  # noqa: E402
from tests.helpers import run_cli_process, run_json  # noqa: E402


def one_error_line(err: str, *needles: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def refused(spec: str, mode: str, capsys) -> str:
    """The one error line for the model: from the CLI (static), or from traced mode's loader, which --trace
    reaches only after a static load succeeded (load_torch_as_onnx)."""
    if mode == "static":
        assert main([spec]) == 2
        return one_error_line(capsys.readouterr().err)
    with pytest.raises(InputError) as caught:
        load_torch_for_trace(spec, TorchOptions(), "fp16")
    return f"precaudit: {caught.value}"


def model_file(folder: Path, body: str, name: str = "model.py") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


# ---- files that are not files ----------------------------------------------------------------------------


def test_pt2_on_dev_zero_and_pt_fifo_are_one_line_each(tmp_path):
    # a child process with a timeout: a blocking open or an endless read would fail the test, not hang it
    (tmp_path / "zero.pt2").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "pipe.pt")
    code, _, err, _ = run_cli_process([tmp_path / "zero.pt2", tmp_path / "pipe.pt", "--input-shape", "2,4"],
                                      tmp_path, timeout=120)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 2, err
    assert f"precaudit: {tmp_path / 'zero.pt2'}: is a device, not a regular file" in lines[0]
    assert f"precaudit: {tmp_path / 'pipe.pt'}: is a FIFO (named pipe), not a regular file" in lines[1]


# ---- factories that exit or raise ------------------------------------------------------------------------

GOOD = """
import torch

def make():
    return torch.nn.Linear(4, 4), (torch.randn(2, 4),)
"""


def factory_module(tmp_path: Path, body: str) -> Path:
    return model_file(tmp_path / "src", "import sys\nimport torch\n" + textwrap.dedent(body))


@pytest.mark.parametrize("body, stopped", [
    ("def make():\n    sys.exit(0)\n", "calling make() exited (SystemExit 0)"),
    ("def make():\n    sys.exit('bye')\n", "calling make() exited (SystemExit bye)"),
    ("class Boom(BaseException):\n    pass\n\ndef make():\n    raise Boom('no')\n", "calling make() failed: Boom: no"),
    ("def make():\n    raise KeyboardInterrupt\n", "calling make() was interrupted (KeyboardInterrupt)"),
], ids=["exit-0", "exit-message", "base-exception", "keyboard-interrupt"])
def test_factory_that_stops_is_an_error_for_that_model(body, stopped, tmp_path, capsys):
    spec = f"{factory_module(tmp_path, body)}:make"
    assert main([spec]) == 2
    one_error_line(capsys.readouterr().err, f"precaudit: {spec}: {stopped}")


def test_exit_while_importing_model_py(tmp_path, capsys):
    path = factory_module(tmp_path, "sys.exit(0)\n\ndef make():\n    pass\n")
    assert main([f"{path}:make"]) == 2
    one_error_line(capsys.readouterr().err, f"precaudit: {path}: importing it exited (SystemExit 0)")


@pytest.mark.parametrize("mode, doing", [("static", "running forward() under torch.export"),
                                         ("trace", "running forward() for the ONNX export")])
def test_exit_inside_forward_while_torch_captures_it(mode, doing, tmp_path, capsys):
    path = factory_module(tmp_path, """
        class Quits(torch.nn.Module):
            def forward(self, x):
                sys.exit(0)

        def make():
            return Quits(), (torch.randn(2, 4),)
    """)
    assert refused(f"{path}:make", mode, capsys) == f"precaudit: {path}:make: {doing} exited (SystemExit 0)"


def test_exception_whose_message_exits_is_still_one_line(tmp_path, capsys):
    # the exception is the user's object: even formatting it runs their code
    path = factory_module(tmp_path, """
        class Sly(Exception):
            def __str__(self):
                sys.exit(0)

        def make():
            raise Sly()
    """)
    assert main([f"{path}:make"]) == 2
    one_error_line(capsys.readouterr().err, f"precaudit: {path}:make: calling make() failed: Sly:")


def test_other_models_on_the_command_line_are_still_audited(tmp_path):
    quits = factory_module(tmp_path, "def make():\n    sys.exit(0)\n")
    interrupted = model_file(tmp_path / "other", "def make():\n    raise KeyboardInterrupt\n")
    good = model_file(tmp_path / "good", GOOD)
    code, report = run_json([f"{quits}:make", f"{interrupted}:make", f"{good}:make"], out_dir=tmp_path)
    assert code == 2
    assert report["models"] == [f"{good}:make"]
    assert len(report["errors"]) == 2


# ---- one model's imports do not leak into the next -------------------------------------------------------


def neighbour_model(folder: Path, value: str) -> Path:
    model_file(folder, f"VALUE = {value!r}\n", name="layers.py")
    return model_file(folder, f"""
        import torch
        import layers

        def make():
            if layers.VALUE != {value!r}:
                raise RuntimeError("imported the other model's layers.py: " + layers.VALUE)
            return torch.nn.Linear(4, 4), (torch.randn(2, 4),)
    """)


def test_each_model_imports_its_own_neighbours(tmp_path):
    first, second = neighbour_model(tmp_path / "a", "first"), neighbour_model(tmp_path / "b", "second")
    path_before = list(sys.path)
    code, report = run_json([f"{first}:make", f"{second}:make"], out_dir=tmp_path)
    assert report["errors"] == [] and len(report["models"]) == 2
    assert sys.path == path_before and "layers" not in sys.modules


def test_factory_may_import_a_neighbour_late_and_use_dataclasses(tmp_path):
    # the folder stays importable while the factory runs; dataclasses look model.py up in sys.modules
    model_file(tmp_path / "src", "import torch\nBlock = torch.nn.Linear\n", name="blocks.py")
    path = model_file(tmp_path / "src", """
        from __future__ import annotations

        import dataclasses

        import torch

        @dataclasses.dataclass
        class Config:
            width: int = 4

        def make():
            from blocks import Block
            return Block(Config().width, 4), (torch.randn(2, 4),)
    """)
    code, report = run_json([f"{path}:make"], out_dir=tmp_path)
    assert report["errors"] == [] and report["models"] == [f"{path}:make"]


# ---- which files a PyTorch spec reads --------------------------------------------------------------------


def test_torch_input_files_names_what_the_spec_reads(tmp_path, monkeypatch):
    package = tmp_path / "site" / "zoo_models"
    model_file(package, "raise RuntimeError('must not be imported')\n", name="__init__.py")
    model_file(package, "raise RuntimeError('must not be imported')\n", name="tiny.py")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert torch_input_files("weights/model.pt2") == [Path("weights/model.pt2")]
    assert torch_input_files("src/model.py:make") == [Path("src/model.py")]
    assert torch_input_files("zoo_models.tiny:make") == [package / "tiny.py"]
    assert torch_input_files("zoo_models:make") == [package / "__init__.py"]
    assert torch_input_files("no_such_package.mod:make") == []
    assert torch_input_files("model.onnx") == []
    assert "zoo_models" not in sys.modules
