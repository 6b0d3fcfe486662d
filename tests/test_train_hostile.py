"""precaudit train with a careless factory, loss or option: a NaN loss from the first step, options at their edges
(command line and API), a factory or step that never returns, exits or forks, and one that prints. Each is one line
and exit 2 (or, printing, a clean report): never a silent exit 0, an internal error, a hang or a corrupted stdout."""

from __future__ import annotations

import json
import math
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import precaudit  # noqa: E402
from fixtures.train_models import adam_eps_1e_8, spec  # noqa: E402
from precaudit.cli import main  # noqa: E402
from precaudit.train.audit import MAX_STEPS  # noqa: E402
from tests.helpers import run_cli_process  # noqa: E402

GOOD = spec("adam_eps_1e_8")


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


# ---- options at their edges ----------------------------------------------------------------------------------

_STEPS = "--steps must be a whole number from 1 to 1000"
_SEED = "--seed must be a whole number from 0 to 2**63 - 1"
_LR = "--lr must be a finite number above 0"
_SCALE = "--loss-scale must be a finite number above 0"
_TIMEOUT = "--timeout must be a finite number of seconds, 0 or more (0: no limit)"

EDGES = [
    ("--lr", "nan", f"{_LR}, not nan"), ("--lr", "-1", f"{_LR}, not -1.0"), ("--lr", "0", f"{_LR}, not 0.0"),
    ("--lr", "inf", f"{_LR}, not inf"),
    ("--loss-scale", "inf", f"{_SCALE}, not inf"), ("--loss-scale", "nan", f"{_SCALE}, not nan"),
    ("--loss-scale", "0", f"{_SCALE}, not 0.0"), ("--loss-scale", "-1", f"{_SCALE}, not -1.0"),
    ("--seed", str(10**23), f"{_SEED}, not {10**23}"), ("--seed", str(2**63), f"{_SEED}, not {2**63}"),
    ("--steps", str(10**9), f"{_STEPS}, not {10**9}"), ("--steps", "0", f"{_STEPS}, not 0"),
    ("--steps", "1001", f"{_STEPS}, not 1001"),
    ("--timeout", "nan", f"{_TIMEOUT}, not nan"), ("--timeout", "-1", f"{_TIMEOUT}, not -1.0"),
    ("--timeout", "inf", f"{_TIMEOUT}, not inf"),
]


@pytest.mark.parametrize("option, value, problem", EDGES, ids=[f"{o}={v}" for o, v, _ in EDGES])
def test_option_at_its_edge_is_one_line_from_the_command_line(option, value, problem, capsys):
    assert one_line(capsys, GOOD, "--trace", option, value) == f"precaudit: {problem}"


def test_option_as_text_is_a_usage_error(capsys):
    line = one_line(capsys, GOOD, "--lr", "x")
    assert line == "precaudit: Invalid value for '--lr': 'x' is not a valid float. (precaudit --help shows the usage)"


API_EDGES = [
    ({"lr": math.nan}, f"{_LR}, not nan"), ({"lr": -1}, f"{_LR}, not -1"), ({"lr": 0.0}, f"{_LR}, not 0.0"),
    ({"lr": "x"}, f"{_LR}, not 'x'"), ({"lr": True}, f"{_LR}, not True"),
    ({"loss_scale": math.inf}, f"{_SCALE}, not inf"), ({"loss_scale": "1"}, f"{_SCALE}, not '1'"),
    ({"seed": 10**23}, f"{_SEED}, not {10**23}"), ({"seed": -1}, f"{_SEED}, not -1"),
    ({"seed": True}, f"{_SEED}, not True"), ({"seed": 1.0}, f"{_SEED}, not 1.0"),
    ({"steps": 10**9}, f"{_STEPS}, not {10**9}"), ({"steps": 0}, f"{_STEPS}, not 0"),
    ({"steps": True}, f"{_STEPS}, not True"), ({"steps": 2.5}, f"{_STEPS}, not 2.5"),
    ({"steps": "2"}, f"{_STEPS}, not '2'"), ({"steps": None}, f"{_STEPS}, not None"),
    ({"timeout": math.nan}, f"{_TIMEOUT}, not nan"), ({"timeout": "x"}, f"{_TIMEOUT}, not 'x'"),
    ({"regime": "fp8"}, "--regime: unknown regime 'fp8'; choose from amp-fp16, amp-bf16, bf16, fp16"),
]


@pytest.mark.parametrize("given, problem", API_EDGES, ids=[repr(g) for g, _ in API_EDGES])
def test_option_at_its_edge_raises_from_the_api(given, problem):
    with pytest.raises(precaudit.InputError) as caught:
        precaudit.train_audit(GOOD, trace=True, **given)
    assert str(caught.value) == problem


def test_api_objects_are_checked_the_same_way():
    model, x, loss_fn, optimizer = adam_eps_1e_8()
    with pytest.raises(precaudit.InputError) as caught:
        precaudit.train_audit(model, x, loss_fn, optimizer, trace=True, lr=-1e-3)
    assert str(caught.value) == f"{_LR}, not -0.001"


@pytest.mark.requires("numpy")
def test_numpy_numbers_are_numbers():
    import numpy as np
    report = precaudit.train_audit(GOOD, trace=True, steps=np.int64(2), seed=np.int64(3), lr=np.float32(1e-3),
                                   select=["PA401"])
    assert report.errors == []
    assert report.outcome.settings["steps"] == 2 and type(report.outcome.settings["steps"]) is int


def test_help_states_the_bounds(capsys):
    assert main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"optimizer steps to run, 1 to {MAX_STEPS} (default 1)" in text  # the bound the options are checked by
    assert "--timeout SECONDS" in text


# ---- user code that never returns, exits, forks or prints: run in a child process, as a user runs it ---------


@pytest.mark.parametrize("body", [
    "def make():\n    time.sleep(600)\n",
    "class Slow(torch.nn.Linear):\n    def forward(self, x):\n        time.sleep(600)\n        return super().forward(x)\n\n"
    "def make():\n    return Slow(4, 1), torch.randn(2, 4), lambda out: out.square().mean()\n",
], ids=["factory", "forward"])
def test_user_code_that_never_returns_stops_at_the_timeout(body, tmp_path):
    made = factory(tmp_path, body)
    start = time.monotonic()
    code, out, err, _ = run_cli_process(["train", made, "--trace", "--timeout", "2"], tmp_path, timeout=120)
    elapsed = time.monotonic() - start
    assert code == 2, err
    assert out == "Found 0 findings in 0 models: 0 errors, 0 warnings, 0 info; 1 model could not be audited.\n"
    assert err.splitlines() == [f"precaudit: {made}: running the factory and its step stopped after 2 s (--timeout; "
                                "0 for no limit)"]
    assert elapsed < 30  # 2 s, the interpreter and torch's import


@pytest.mark.parametrize("body, ended", [
    ("def make():\n    os._exit(0)\n", "exited with code 0"),
    ("def make():\n    os._exit(3)\n", "exited with code 3"),
    ("def make():\n    os.kill(os.getpid(), 9)\n", "was killed by signal 9 (SIGKILL)"),
], ids=["exit-0", "exit-3", "sigkill"])
def test_factory_that_ends_its_process_is_an_error(body, ended, tmp_path, capsys):
    made = factory(tmp_path, body)
    line = one_line(capsys, made)
    assert line == (f"precaudit: {made}: the process running the factory and its step {ended} before it gave a "
                    "result (os._exit or a signal in the user's code, or a crash in native code)")


def test_factory_that_forks_gives_one_report(tmp_path):
    made = factory(tmp_path, "def make():\n    os.fork()\n    return _linear()\n")
    code, out, err, _ = run_cli_process(["train", made, "--trace", "-f", "json"], tmp_path, timeout=300)
    assert code == 0, err
    assert out.count('"results"') == 1
    assert json.loads(out)["models"] == [made]
    assert "results" not in err


def test_factory_that_prints_leaves_stdout_to_the_report(tmp_path):
    made = factory(tmp_path, """
        print("printed by the factory")
        def make():
            print("print() in make")
            print("print() to stderr", file=sys.stderr)
            sys.stdout.flush()
            os.write(1, b"os.write to fd 1\\n")
            return _linear()
    """)
    code, out, err, _ = run_cli_process(["train", made, "--trace", "-f", "json"], tmp_path, timeout=300)
    assert code == 0, err
    assert json.loads(out)["models"] == [made]
    assert err.splitlines() == ["printed by the factory", "print() in make", "print() to stderr",
                                "os.write to fd 1"]


# ---- what the child process must carry over from the run that started it -----------------------------------


def test_relative_spec_resolves_from_the_current_folder(tmp_path, monkeypatch, capsys):
    factory(tmp_path, "def make():\n    return _linear()\n")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "m.py:make", "-f", "concise"]) == 0
    assert capsys.readouterr().out.startswith("Found 0 findings in 1 model (m.py:make)")


def test_report_is_not_written_over_a_module_the_factory_imported(tmp_path, capsys):
    (tmp_path / "helper.py").write_text("SIZE = 4\n")
    made = factory(tmp_path, "import helper\n\ndef make():\n    return _linear()\n")
    line = one_line(capsys, made, "-o", str(tmp_path / "helper.py"))
    assert line == f"precaudit: {tmp_path / 'helper.py'}: refusing to write the report over one of the inputs"
    assert (tmp_path / "helper.py").read_text() == "SIZE = 4\n"
