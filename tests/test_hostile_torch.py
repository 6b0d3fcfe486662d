"""PyTorch models from a stranger's pull request: loading one never runs code from a file, and a model that exits
or raises is one stderr line and exit 2 for that model while the others are still audited.

The hostile archives are built here from a real torch.export.save: each one's payload creates a marker file when
it runs (the canary test proves plain torch.export.load runs it), and precaudit must never let it appear.
"""

from __future__ import annotations

import contextlib
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

pytestmark = pytest.mark.slow  # PyTorch captures and real steps: seconds each


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


# ---- hostile .pt2 archives -------------------------------------------------------------------------------


class Touch:
    """Unpickling this opens the marker for writing, which creates it: proof that code from the file ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


class Small(torch.nn.Module):
    """A weight, a buffer and a tensor constant: every kind of payload a .pt2 stores."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("shift", torch.ones(4))
        self.scale = torch.tensor([2.0])

    def forward(self, x):
        return self.lin(x) + self.shift * self.scale


def saved_program(path: Path) -> Path:
    torch.export.save(torch.export.export(Small(), (torch.randn(2, 4),)), str(path))
    return path


def torch_saved(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def rewritten(src: Path, dst: Path, change, extra: dict[str, bytes] | None = None) -> Path:
    """The archive entry by entry; change(name, data) returns new bytes or None (kept) or b"-" (dropped).

    Names are given without the archive's top folder; extra entries are added at the end.
    """
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        top = zin.namelist()[0].split("/", 1)[0]
        for info in zin.infolist():
            data = zin.read(info.filename)
            new = change(info.filename.split("/", 1)[1], data)
            if new != b"-":
                zout.writestr(info.filename, data if new is None else new)
        for name, data in (extra or {}).items():
            zout.writestr(f"{top}/{name}", data)
    return dst


def payload_config(data: bytes, key: str, **changes) -> bytes:
    config = json.loads(data)
    config["config"][key].update(changes)
    return json.dumps(config).encode()


def _sample_inputs(src, dst, marker):
    # torch.export.load tries weights_only=True on the sample inputs, then falls back to weights_only=False
    inputs = torch_saved((Touch(marker),))
    return rewritten(src, dst, lambda n, d: inputs if n == "data/sample_inputs/model.pt" else None)


def _sample_inputs_raw_pickle(src, dst, marker):
    return rewritten(src, dst, lambda n, d: pickle.dumps(Touch(marker)) if n == "data/sample_inputs/model.pt" else None)


def _pickled_weight(src, dst, marker):
    def change(name, data):
        if name == "data/weights/model_weights_config.json":
            return payload_config(data, "lin.weight", use_pickle=True)
        return torch_saved(Touch(marker)) if name == "data/weights/weight_0" else None
    return rewritten(src, dst, change)


def _pickled_constant(src, dst, marker):
    def change(name, data):
        if name == "data/constants/model_constants_config.json":
            return payload_config(data, "scale", use_pickle=True)
        return torch_saved(Touch(marker)) if name == "data/constants/tensor_0" else None
    return rewritten(src, dst, change)


def _opaque_constant(src, dst, marker):
    # opaque objects are read with plain pickle.loads
    def change(name, data):
        if name == "data/constants/model_constants_config.json":
            return payload_config(data, "scale", use_pickle=True, path_name="opaque_obj_0")
        return b"-" if name == "data/constants/tensor_0" else None
    return rewritten(src, dst, change, {"data/constants/opaque_obj_0": pickle.dumps(Touch(marker))})


def _legacy_weights_file(src, dst, marker):
    # data/weights/model.pt, the legacy whole-state-dict file, goes through the weights-only-then-pickle fallback
    return rewritten(src, dst, lambda n, d: b"-" if n.startswith("data/weights/") else None,
                     {"data/weights/model.pt": torch_saved({"lin.weight": Touch(marker)})})


def _archive_of_torch_2_7(src, dst, marker):
    # the pre-2.8 zip layout torch.export.load still reads when the archive has no exported program
    from torch._export.serde.schema import SCHEMA_VERSION

    with zipfile.ZipFile(src) as zin:
        program = next(zin.read(n) for n in zin.namelist() if n.endswith("models/model.json"))
    with zipfile.ZipFile(dst, "w") as z:
        z.writestr("version", ".".join(map(str, SCHEMA_VERSION)))
        z.writestr("serialized_exported_program.json", program)
        z.writestr("serialized_state_dict.pt", torch_saved({"lin.weight": Touch(marker)}))
        z.writestr("serialized_constants.pt", b"")
        z.writestr("serialized_example_inputs.pt", b"")
    return dst


def _shape_expression(src, dst, marker):
    # symbolic sizes are parsed with sympy.sympify, which evaluates the string as Python
    expr = {"as_expr": {"expr_str": f"__import__('os').system('touch {marker}')", "hint": {"as_int": 2}}}
    return rewritten(src, dst, lambda n, d: d.decode().replace('{"as_int": 2}', json.dumps(expr), 1).encode()
                     if n == "models/model.json" else None)


PICKLED = {"sample-inputs": _sample_inputs, "sample-inputs-raw-pickle": _sample_inputs_raw_pickle,
           "pickled-weight": _pickled_weight, "pickled-constant": _pickled_constant,
           "opaque-constant": _opaque_constant, "legacy-weights-file": _legacy_weights_file,
           "torch-2.7-archive": _archive_of_torch_2_7}
HOSTILE = {**PICKLED, "shape-expression": _shape_expression}


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    return saved_program(tmp_path_factory.mktemp("legit") / "small.pt2")


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_each_hostile_archive_really_runs_code_in_plain_torch(kind, program, tmp_path):
    # the canary: without it, "no marker" below could mean a malformed file torch never unpickles
    marker = tmp_path / "ran"
    hostile = HOSTILE[kind](program, tmp_path / "hostile.pt2", marker)
    with contextlib.suppress(Exception):  # most fail on what the payload returned, after it ran
        torch.export.load(str(hostile))
    assert marker.exists()


@pytest.mark.parametrize("mode", ["static", "trace"])
@pytest.mark.parametrize("kind", sorted(PICKLED))
def test_pickles_in_a_pt2_are_refused_without_trust(kind, mode, program, tmp_path, capsys):
    marker = tmp_path / "ran"
    hostile = PICKLED[kind](program, tmp_path / "hostile.pt2", marker)
    line = refused(str(hostile), mode, capsys)
    assert line.startswith(f"precaudit: {hostile}: holds pickled Python objects") and "--trust-pickle" in line
    assert not marker.exists()


@pytest.mark.parametrize("mode", ["static", "trace"])
def test_shape_expression_is_not_evaluated(mode, program, tmp_path, capsys):
    marker = tmp_path / "ran"
    hostile = _shape_expression(program, tmp_path / "hostile.pt2", marker)
    line = refused(str(hostile), mode, capsys)
    assert line.startswith(f"precaudit: {hostile}: holds a symbolic shape expression") and "__import__" in line
    assert "--trust-pickle" in line and not marker.exists()


def test_custom_object_constant_goes_through_torchs_restricted_unpickler(program, tmp_path, capsys):
    # custom_obj_* constants are read by torch's C++ unpickler, which resolves torch classes only
    marker = tmp_path / "ran"

    def change(name, data):
        if name == "data/constants/model_constants_config.json":
            return payload_config(data, "scale", use_pickle=True, path_name="custom_obj_0")
        return b"-" if name == "data/constants/tensor_0" else None

    hostile = rewritten(program, tmp_path / "hostile.pt2", change,
                        {"data/constants/custom_obj_0": pickle.dumps(Touch(marker))})
    assert main([str(hostile)]) == 2
    one_error_line(capsys.readouterr().err, f"precaudit: {hostile}: not a loadable torch.export program")
    assert not marker.exists()


def test_compiled_aotinductor_code_is_never_loaded(program, tmp_path, monkeypatch):
    # data/aotinductor/ holds shared libraries that torch.export.load would dlopen; precaudit needs none of it
    marker = tmp_path / "loaded"

    class Loader:  # stands in for torch's AOTI loader: reaching it means native code from the file would run
        def __init__(self, *args):
            marker.touch()

        @staticmethod
        def load_metadata_from_package(*args):
            marker.touch()
            return {}

    monkeypatch.setattr(torch._C._aoti, "AOTIModelPackageLoader", Loader)
    archive = rewritten(program, tmp_path / "aoti.pt2", lambda n, d: None,
                        {"data/aotinductor/model/model.so": b"\x7fELF"})
    for trust in ([], ["--trust-pickle"]):
        code, report = run_json([archive], *trust, out_dir=tmp_path)
        assert (code, report["errors"], report["models"]) == (0, [], [str(archive)])
    assert not marker.exists()


def test_trust_pickle_is_what_lets_it_run(program, tmp_path):
    # the flag's promise, once: with it, torch's own loader (and the file's code) runs
    marker = tmp_path / "ran"
    hostile = _sample_inputs(program, tmp_path / "hostile.pt2", marker)
    main([str(hostile), "--trust-pickle"])
    assert marker.exists()


@pytest.mark.parametrize("mode", [[], ["--trace"]], ids=["static", "trace"])
def test_legit_pt2_still_loads_without_the_flag(mode, program, tmp_path):
    code, report = run_json([program, *mode], out_dir=tmp_path)
    assert (code, report["errors"], report["models"]) == (0, [], [str(program)])


def test_legit_pt2_with_symbolic_shapes_loads_without_the_flag(tmp_path):
    # torch writes its shape expressions as sympy srepr: Symbol('s17', positive=True, integer=True), Mod(...)
    class Dynamic(torch.nn.Module):
        def forward(self, x, y):
            z = torch.cat([x, y], 0)
            return z.reshape(-1) * 2, x[: x.shape[0] // 2], torch.nn.functional.pad(y, (0, 0, 0, y.shape[0] % 3))

    half = torch.export.Dim("half", min=1, max=50)
    ep = torch.export.export(Dynamic(), (torch.randn(4, 3), torch.randn(6, 3)),
                             dynamic_shapes=({0: 2 * half}, {0: torch.export.Dim("rows", min=2)}))
    torch.export.save(ep, str(tmp_path / "dynamic.pt2"))
    assert "Mod(Symbol(" in zipfile.ZipFile(tmp_path / "dynamic.pt2").read("dynamic/models/model.json").decode()
    code, report = run_json([tmp_path / "dynamic.pt2"], out_dir=tmp_path)
    assert (code, report["errors"]) == (0, [])


# ---- TorchScript -----------------------------------------------------------------------------------------


class System:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("entry", ["data.pkl", "constants.pkl"])
def test_torchscript_pickle_naming_os_system_does_not_run(entry, tmp_path, capsys):
    # TorchScript's pickles are read by torch's C++ unpickler, which knows torch classes only: no --trust-pickle
    marker = tmp_path / "ran"
    scripted = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.trace(torch.nn.Linear(4, 4), (torch.randn(2, 4),)), str(scripted))
    hostile = rewritten(scripted, tmp_path / "hostile.pt", lambda n, d: pickle.dumps(System(marker), protocol=2)
                        if n == entry else None)
    assert main([str(hostile), "--input-shape", "2,4"]) == 2
    one_error_line(capsys.readouterr().err, f"precaudit: {hostile}: not a loadable TorchScript file", "posix.system")
    assert not marker.exists()


# ---- files that are not files ----------------------------------------------------------------------------


@pytest.mark.slow
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
    _code, report = run_json([f"{first}:make", f"{second}:make"], out_dir=tmp_path)
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
    _code, report = run_json([f"{path}:make"], out_dir=tmp_path)
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


def test_importing_a_factory_writes_nothing_into_its_folder(tmp_path):
    source = tmp_path / "model.py"
    source.write_text("import torch\n\nclass RMS(torch.nn.Module):\n    def forward(self, x):\n"
                      "        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-12)\n\n"
                      "def make():\n    return RMS(), (torch.randn(2, 8),)\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main([f"{source}:make"]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == before


# ---- a factory's code runs in a worker of its own, one model or several ------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("body, says", [
    ("import os\n\ndef make():\n    os._exit(0)\n", "the process auditing it exited with code 0 before it gave a result"),
    ("import os, signal\n\ndef make():\n    os.kill(os.getpid(), signal.SIGKILL)\n",
     "the process auditing it was killed by signal 9 (SIGKILL) before it gave a result"),
    ("import time\n\ndef make():\n    time.sleep(120)\n", "auditing it stopped after 3 s (--timeout; 0 for no limit)"),
], ids=["os-exit-0", "sigkill", "sleeps"])
def test_a_factory_that_ends_or_hangs_the_process_is_that_models_error(body, says, tmp_path):
    """Alone on the command line too (no -j): os._exit(0) gave exit 0 and no report before; a model beside it is
    still audited and reported."""
    bad = factory_module(tmp_path, body)
    good = model_file(tmp_path / "good", GOOD)
    code, out, err, _ = run_cli_process([f"{bad}:make", "--timeout", "3"], tmp_path, timeout=60)
    assert code == 2 and out.splitlines()[-1].endswith("1 model could not be audited.")
    one_error_line(err, f"precaudit: {bad}:make: {says}")
    # (a legit factory's worker imports torch and exports the module: more than 3 s on a busy machine)
    code, out, err, _ = run_cli_process([f"{bad}:make", f"{good}:make", "--timeout", "20", "-f", "json"], tmp_path,
                                        timeout=90)
    assert code == 2 and json.loads(out)["models"] == [f"{good}:make"]


@pytest.mark.slow
def test_what_a_factory_prints_goes_to_stderr_never_into_the_report(tmp_path):
    path = factory_module(tmp_path, """
        import os

        def make():
            print("from print")
            os.write(1, b"from fd 1\\n")
            return torch.nn.Linear(4, 4), (torch.randn(2, 4),)
    """)
    for jobs in ("1", "2"):
        code, out, err, _ = run_cli_process([f"{path}:make", f"{path}:make", "-f", "json", "-j", jobs], tmp_path,
                                            timeout=120)
        assert code == 0 and json.loads(out)["models"] == [f"{path}:make"] * 2
        assert err.count("from print") == 2 and err.count("from fd 1") == 2
