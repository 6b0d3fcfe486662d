"""Load a PyTorch model — a factory, a torch.export .pt2, TorchScript — and capture it as an IR graph.

--dtype semantics for a module: the module is converted with `model.to(dtype)` (fp16, bf16) before capture,
so its explicit upcasts (`x.float()`, `.to(torch.float32)`) survive as casts in the graph; fp32 capture would
drop them as no-ops. fp8 targets capture in float32 and apply the same "float32 runs as the target" rule as
for ONNX graphs. Autocast is not emulated: it keeps norms and softmax in float32 by op lists of its own, which
is what the fused-op stash rules already model for LayerNorm/GroupNorm/RMSNorm.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.util
import io
import logging
import pickle
import shutil
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import InputError
from ..ir import Graph
from ..options import TorchOptions
from .aten_lowering import lower_exported_program

__all__ = ["load_torch_graph", "load_torch_as_onnx"]

_CAPTURE_IN = {"fp16": torch.float16, "bf16": torch.bfloat16}
_INPUT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64,
                 "int64": torch.int64, "int32": torch.int32}
_EPS_ATTRS = ("eps", "variance_epsilon", "layer_norm_eps", "epsilon", "layer_norm_epsilon", "norm_eps")


def load_torch_graph(spec: str, options: TorchOptions, target: str = "fp16") -> Graph:
    """The IR of a PyTorch model named on the command line."""
    lowered = spec.lower()
    if lowered.endswith(".pt2"):
        graph = lower_exported_program(_load_pt2(spec, options), spec)
    elif lowered.endswith((".pt", ".pth", ".ts")):
        return _load_torchscript_or_pickle(spec, options, target)
    else:
        module, args = _from_factory(spec, options)
        graph = _capture(module, args, spec, target)
    return graph


def load_torch_as_onnx(spec: str, options: TorchOptions, target: str = "fp16") -> Graph:
    """The model as the dynamo ONNX exporter writes it, for traced mode, whose emulator runs ONNX ops.

    Exported in the target dtype (fp16/bf16) so explicit upcasts survive as Casts; nodes keep the source
    lines and module paths the exporter records.
    """
    lowered = spec.lower()
    if lowered.endswith((".pt", ".pth", ".ts")):
        return _load_torchscript_or_pickle(spec, options, target, as_onnx=True)
    if lowered.endswith(".pt2"):
        program, args = _load_pt2(spec, options), ()
    else:
        module, args = _from_factory(spec, options)
        program, args = _converted(module.eval(), args, target)
    graph = _via_onnx(program, args, spec, dynamo=True,
                     failure="traced mode exports the model to ONNX first, and that failed ({}); audit an ONNX "
                             "export with --trace instead")
    graph.converted_to = target if target in _CAPTURE_IN and not lowered.endswith(".pt2") else None
    return graph


# ---- sources ---------------------------------------------------------------------------------------------


def _from_factory(spec: str, options: TorchOptions) -> tuple[nn.Module, tuple]:
    """Import model.py or package.module, call the factory; it returns a module or (module, example inputs)."""
    target, _, attr = spec.rpartition(":")
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise InputError(target, "no such file")
            mod_spec = importlib.util.spec_from_file_location(f"_precaudit_model_{path.stem}", path)
            module = importlib.util.module_from_spec(mod_spec)
            sys.path.insert(0, str(path.resolve().parent))  # so the file can import its neighbours
            try:
                mod_spec.loader.exec_module(module)
            finally:
                sys.path.remove(str(path.resolve().parent))
        else:
            module = importlib.import_module(target)
    except InputError:
        raise
    except Exception as exc:
        raise InputError(target, f"importing it failed: {type(exc).__name__}: {_first_line(exc)}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise InputError(spec, f"'{attr}' is not a function or class in {target}")
    try:
        made = factory()
    except Exception as exc:
        raise InputError(spec, f"calling {attr}() failed: {type(exc).__name__}: {_first_line(exc)}") from None
    model, args = (made[0], made[1]) if isinstance(made, tuple) and len(made) == 2 else (made, None)
    if not isinstance(model, nn.Module):
        raise InputError(spec, f"{attr}() must return an nn.Module or (module, example inputs), got {type(model).__name__}")
    if args is None:
        args = _synthesized(spec, options)
    return model, args if isinstance(args, tuple) else (args,)


def _synthesized(spec: str, options: TorchOptions) -> tuple:
    if not options.input_shapes:
        raise InputError(spec, "no example inputs: return (module, inputs) from the factory, or pass "
                               "--input-shape D0,D1,... once per forward() argument")
    dtype = _INPUT_DTYPES.get(options.input_dtype)
    if dtype is None:
        raise InputError(spec, f"--input-dtype must be one of {', '.join(_INPUT_DTYPES)}")
    gen = torch.Generator().manual_seed(0)
    if not dtype.is_floating_point:  # token ids: small non-negative integers fit any embedding table
        return tuple(torch.randint(0, 2, shape, generator=gen, dtype=dtype) for shape in options.input_shapes)
    return tuple(torch.randn(shape, generator=gen, dtype=dtype) for shape in options.input_shapes)


def _load_pt2(spec: str, options: TorchOptions):
    path = _existing(spec)
    # torch.export.load unpickles any custom objects the archive holds with plain pickle.loads: refuse
    # that unless trusted (tensors go through torch.load's weights-only unpickler either way).
    guard = contextlib.nullcontext() if options.trust_pickle else _no_plain_unpickling(spec)
    try:
        with guard, _quiet():
            return torch.export.load(str(path))
    except InputError:
        raise
    except Exception as exc:
        raise InputError(spec, f"not a loadable torch.export program ({type(exc).__name__}: {_first_line(exc)})") from None


def _load_torchscript_or_pickle(spec: str, options: TorchOptions, target: str, as_onnx: bool = False) -> Graph:
    """TorchScript archives load without running Python code; a pickled module needs --trust-pickle."""
    path = _existing(spec)
    if _is_torchscript(path):
        try:
            with _quiet():
                scripted = torch.jit.load(str(path), map_location="cpu")
        except Exception as exc:
            raise InputError(spec, f"not a loadable TorchScript file ({_first_line(exc)})") from None
        return _torchscript_graph(scripted, spec, options)
    if not options.trust_pickle:
        raise InputError(spec, "is a pickled Python object, not TorchScript; unpickling runs arbitrary code from the "
                               "file, so precaudit refuses it. Pass --trust-pickle if you trust where it came from, "
                               "or save the model with torch.export.save / torch.jit.save")
    try:
        with _quiet():
            model = torch.load(str(path), map_location="cpu", weights_only=False)
    except Exception as exc:
        raise InputError(spec, f"cannot unpickle it ({type(exc).__name__}: {_first_line(exc)})") from None
    if not isinstance(model, nn.Module):
        raise InputError(spec, f"holds a {type(model).__name__}, not an nn.Module (a state_dict needs the model's code: "
                               "use a factory, model.py:make_model)")
    if as_onnx:
        return _torchscript_graph(model, spec, options)  # an nn.Module goes through the same ONNX exporter
    return _capture(model, _synthesized(spec, options), spec, target)


def _is_torchscript(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as z:
            return any(name.split("/", 1)[-1].startswith("code/") for name in z.namelist())
    except zipfile.BadZipFile:
        return False


def _torchscript_graph(scripted, spec: str, options: TorchOptions) -> Graph:
    """TorchScript has no torch.export path: run it through the TorchScript ONNX exporter and read that."""
    return _via_onnx(scripted, _synthesized(spec, options), spec, dynamo=False,
                     failure="could not convert the TorchScript module ({}); check --input-shape, or audit an ONNX "
                             "export instead")


def _via_onnx(model, args: tuple, spec: str, dynamo: bool, failure: str) -> Graph:
    """Export to a temporary ONNX file with torch.onnx and read that; failure names what went wrong."""
    from .onnx import load_onnx

    # The folder outlives this call: initializers (external data included) are read lazily, when traced mode
    # runs the graph; it is removed when precaudit exits.
    folder = tempfile.mkdtemp(prefix="precaudit-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    out = Path(folder) / "model.onnx"
    try:
        with _quiet():
            torch.onnx.export(model, args, str(out), dynamo=dynamo, opset_version=18 if dynamo else 17)
        graph = load_onnx(str(out))
    except InputError as exc:
        raise InputError(spec, f"its ONNX export cannot be read: {exc.problem}") from None
    except Exception as exc:
        raise InputError(spec, failure.format(f"{type(exc).__name__}: {_first_line(exc)}")) from None
    graph.path = spec
    return graph


# ---- capture ---------------------------------------------------------------------------------------------


def _converted(model: nn.Module, args: tuple, target: str) -> tuple[nn.Module, tuple]:
    """model.to(dtype) with its float inputs, for fp16/bf16 targets; unchanged otherwise."""
    dtype = _CAPTURE_IN.get(target)
    if dtype is None:
        return model, args
    return model.to(dtype), tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                                  for a in args)


def _capture(model: nn.Module, args: tuple, spec: str, target: str) -> Graph:
    model, args = _converted(model.eval(), args, target)
    try:
        with _quiet():
            ep = torch.export.export(model, args, strict=False)
    except Exception as exc:
        raise InputError(spec, f"torch.export could not capture the model ({type(exc).__name__}: {_first_line(exc)}); "
                               "data-dependent control flow or unexpected inputs are the usual causes: return "
                               "(module, inputs) from the factory or pass --input-shape, or audit an ONNX export "
                               "instead") from None
    graph = lower_exported_program(ep, spec)
    graph.module_eps = _module_walk(model)
    graph.converted_to = target if target in _CAPTURE_IN else None
    return graph


def _module_walk(model: nn.Module) -> dict[str, str]:
    """Every module holding an eps attribute, by module path: where the user changes it."""
    found = {}
    for path, module in model.named_modules():
        for attr in _EPS_ATTRS:
            value = getattr(module, attr, None)
            if isinstance(value, float):
                found[path] = f"{type(module).__name__}.{attr} = {value:g}"
                break
    return found


# ---- helpers ---------------------------------------------------------------------------------------------


class _RefusedUnpickling(Exception):
    pass


@contextlib.contextmanager
def _no_plain_unpickling(spec: str):
    original = pickle.loads

    def refuse(*_a: Any, **_k: Any):
        raise _RefusedUnpickling()

    pickle.loads = refuse
    try:
        yield
    except _RefusedUnpickling:
        raise InputError(spec, "holds pickled Python objects; unpickling runs arbitrary code from the file, so "
                               "precaudit refuses it. Pass --trust-pickle if you trust where it came from") from None
    finally:
        pickle.loads = original


@contextlib.contextmanager
def _quiet():
    """torch talks on stdout, stderr, warnings and logging while exporting; the report is the only output."""
    sink = io.StringIO()
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(logging.NOTSET)


def _existing(spec: str) -> Path:
    path = Path(spec)
    if not path.is_file():
        raise InputError(spec, "no such file")
    return path


def _first_line(exc: Exception) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else "no details"

