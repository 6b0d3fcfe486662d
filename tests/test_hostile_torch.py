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
