"""precaudit train with a careless factory, loss or option: a NaN loss from the first step, options at their edges
(command line and API), a factory or step that never returns, exits or forks, and one that prints. Each is one line
and exit 2 (or, printing, a clean report): never a silent exit 0, an internal error, a hang or a corrupted stdout."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import precaudit  # noqa: E402
from fixtures.train_models import adam_eps_1e_8  # noqa: E402
from precaudit.cli import main  # noqa: E402


def factory(tmp_path: Path, body: str, name: str = "m.py") -> str:
    """model.py:make, with a small Linear model whose loss is finite unless the body says otherwise."""
    path = tmp_path / name
    path.write_text("import os\nimport sys\nimport time\nimport torch\n\n"
                    "def _linear(loss=lambda out: out.square().mean()):\n"
                    "    torch.manual_seed(0)\n"
                    "    return torch.nn.Linear(4, 1), torch.randn(2, 4), loss\n\n" + textwrap.dedent(body))
    return f"{path}:make"


def one_line(capsys, *args: str) -> str:
    code = main(["train", *args])
    err = capsys.readouterr().err.splitlines()
    assert code == 2, err
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


# ---- a loss that is not finite in float32 ------------------------------------------------------------------


@pytest.mark.parametrize("factor, shown", [("float('nan')", "nan"), ("float('inf')", "inf"), ("-float('inf')", "-inf")])
def test_loss_not_finite_in_float32_is_an_error_at_step_one(factor, shown, tmp_path, capsys):
    """Not a precision finding (float32 makes it, before any low precision): the audit has no finite step to
    compare the regime with, and says so instead of reporting a clean run."""
    made = factory(tmp_path, f"def make():\n    return _linear(lambda out: out.square().mean() * {factor})\n")
    line = one_line(capsys, made, "--trace")
    assert line == (f"precaudit: {made}: the loss is {shown} in float32, before any low precision (the float32 "
                    "reference step on the factory's batch): the audit compares the regime with a finite float32 "
                    "step; fix the model or loss_fn first")


def test_loss_not_finite_from_the_api_objects_is_a_report_error():
    model, x, loss_fn, optimizer = adam_eps_1e_8()
    report = precaudit.train_audit(model, x, lambda out: loss_fn(out) * math.nan, optimizer, trace=True)
    assert report.exit_code == 2
    assert [e.problem for e in report.errors] == [
        "the loss is nan in float32, before any low precision (the float32 reference step on the factory's batch): "
        "the audit compares the regime with a finite float32 step; fix the model or loss_fn first"]
    assert report.findings == []
