"""Load a PyTorch model — a factory, a torch.export .pt2, TorchScript — and capture it as an IR graph.

--dtype semantics for a module: the module is converted with `model.to(dtype)` (fp16, bf16) before capture,
so its explicit upcasts (`x.float()`, `.to(torch.float32)`) survive as casts in the graph; fp32 capture would
drop them as no-ops. fp8 targets capture in float32 and apply the same "float32 runs as the target" rule as
for ONNX graphs.

--autocast cuda|cpu means the module runs in float32 under torch.autocast(device, dtype): it is captured in
float32 (its own casts kept, see autocast.preserve_casts) and every node takes the dtype torch's autocast
kernels give it (autocast.plan_autocast). Traced mode exports the same program with those casts written in.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.util
import io
import logging
import re
import shutil
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import torch
from torch import nn

from ..errors import InputError
from ..files import check_regular, note_read, open_regular
from ..ir import Graph
from ..options import TorchOptions
from .aten_lowering import lower_exported_program
from .autocast import DEVICES, plan_autocast, preserve_casts
from .autocast_export import cast_explicitly, note_export
from .pt2_guard import archive_guard, no_compiled_code, pt2_package
from .torch_objects import registered
from .user_code import described, first_line, user_code

__all__ = ["capture", "capture_under_autocast", "exported_fp32", "load_torch_as_onnx", "load_torch_graph"]

_CAPTURE_IN = {"fp16": torch.float16, "bf16": torch.bfloat16}
_INPUT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64,
                 "int64": torch.int64, "int32": torch.int32}
_EPS_ATTRS = ("eps", "variance_epsilon", "layer_norm_eps", "epsilon", "layer_norm_epsilon", "norm_eps")
_MODEL_MODULE = "_precaudit_model_"  # sys.modules name of an imported model.py (its stem follows)
_CAPTURE_FAILED = ("torch.export could not capture the model ({}); data-dependent control flow or unexpected inputs "
                   "are the usual causes: return (module, inputs) from the factory or pass --input-shape, or audit "
                   "an ONNX export instead")


def load_torch_graph(spec: str, options: TorchOptions, target: str = "fp16") -> Graph:
    """The IR of a PyTorch model named on the command line."""
    lowered = spec.lower()
    _check_autocast(spec, options, target)
    if lowered.endswith(".pt2"):
        program = _load_pt2(spec, options)
        if options.autocast:
            return _lowered_under_autocast(program, spec, options.autocast, target)
        return lower_exported_program(program, spec)
    if lowered.endswith((".pt", ".pth", ".ts")):
        return _load_torchscript_or_pickle(spec, options, target)
    with _factory_model(spec, options) as (module, args):
        if options.autocast:
            return capture_under_autocast(module, args, spec, options.autocast, target)
        return capture(module, args, spec, target)


def load_torch_as_onnx(spec: str, options: TorchOptions, target: str = "fp16") -> Graph:
    """The model as the dynamo ONNX exporter writes it, for traced mode, whose emulator runs ONNX ops.

    Exported in the target dtype (fp16/bf16) so explicit upcasts survive as Casts; nodes keep the source
    lines and module paths the exporter records.
    """
    lowered = spec.lower()
    _check_autocast(spec, options, target)
    if lowered.endswith((".pt", ".pth", ".ts")):
        return _load_torchscript_or_pickle(spec, options, target, as_onnx=True)
    if options.autocast:
        # the float32 program with the casts autocast inserts written in: the export computes in autocast's dtypes
        if lowered.endswith(".pt2"):
            program, args = _load_pt2(spec, options), ()
        else:
            with _factory_model(spec, options) as (module, args):
                program, _ = _capture_fp32(module, args, spec)
        with _quiet():
            plan = plan_autocast(program, options.autocast, target, spec)
            cast_explicitly(program, plan)
        return _exported_to_onnx(program, args, spec, plan)
    if lowered.endswith(".pt2"):
        graph = _exported_to_onnx(_load_pt2(spec, options), (), spec)
    else:
        with _factory_model(spec, options) as (module, given):
            with user_code(spec, "converting the module with model.to()"):
                program, args = _converted(module.eval(), given, target)
            graph = _exported_to_onnx(program, args, spec)
    graph.converted_to = target if target in _CAPTURE_IN and not lowered.endswith(".pt2") else None
    return graph


def exported_fp32(spec: str, options: TorchOptions):
    """The model's torch.export program as the user wrote it, in float32 (keep-list --for coreml converts it with
    coremltools, whose op names follow its nodes): a factory's module exported, or a .pt2's program."""
    lowered = spec.lower()
    if lowered.endswith(".pt2"):
        return _load_pt2(spec, options)
    if lowered.endswith((".pt", ".pth", ".ts")):
        raise InputError(spec, "--for coreml names ops after the torch.export graph's nodes: give a factory "
                               "(model.py:make_model) or a torch.export .pt2, not a TorchScript or pickled file")
    with _factory_model(spec, options) as (module, args), \
            user_code(spec, "running forward() under torch.export", _CAPTURE_FAILED), _quiet():
        return torch.export.export(module.eval(), args, strict=False)


def _exported_to_onnx(program, args: tuple, spec: str, plan=None) -> Graph:
    return _via_onnx(program, args, spec, dynamo=True,
                     failure="traced mode exports the model to ONNX first, and that failed ({}); audit an ONNX "
                             "export with --trace instead", plan=plan)


# ---- sources ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _factory_model(spec: str, options: TorchOptions) -> Iterator[tuple[nn.Module, tuple]]:
    """The factory's (module, inputs), with model.py's imports in effect until the model is captured.

    Its folder stays on sys.path while the factory and forward() run (they may import neighbours late); then
    sys.path is restored and the modules imported from that folder are forgotten, so the next model's
    `import layers` finds its own layers.py, not this one's.
    """
    from .torch_objects import check_importable

    given = registered(spec)
    if given is not None:  # a module the Python API handed over: nothing to import, and it is the caller's
        with _left_as_given(given[0]):
            yield given
        return
    check_importable(spec, options.factories)  # here, where the import happens, whoever called
    target = spec.rpartition(":")[0]
    folder = check_regular(target).resolve().parent if target.endswith(".py") else None
    with _isolated_imports(folder):
        yield _from_factory(spec, options, folder)


@contextlib.contextmanager
def _left_as_given(module: nn.Module) -> Iterator[None]:
    """The caller's module as it was after the audit: model.to(dtype) and eval() change a module in place, so its
    parameters' and buffers' tensors and every submodule's training flag are put back (no copy of the weights: the
    converted tensors are new ones, the caller's are only set aside)."""
    params = [(p, p.data, p.grad) for p in module.parameters()]
    buffers = [(m, dict(m._buffers)) for m in module.modules()]  # .to() puts new tensors in each _buffers dict
    modes = [(m, m.training) for m in module.modules()]
    try:
        yield
    finally:
        for param, data, grad in params:
            param.data, param.grad = data, grad
        for m, held in buffers:
            m._buffers.update(held)
        for m, training in modes:
            m.training = training


def _from_factory(spec: str, options: TorchOptions, folder: Path | None) -> tuple[nn.Module, tuple]:
    """Import model.py or package.module, call the factory; it returns a module or (module, example inputs)."""
    target, _, attr = spec.rpartition(":")
    with user_code(target, "importing it"):
        module = _import_model(target, folder) if folder else importlib.import_module(target)
        factory = getattr(module, attr, None)  # a module __getattr__ is the user's code too
    if not callable(factory):
        raise InputError(spec, f"'{attr}' is not a function or class in {target}")
    with user_code(spec, f"calling {attr}()"):
        made = factory()
        model, args = (made[0], made[1]) if isinstance(made, tuple) and len(made) == 2 else (made, None)
        if not isinstance(model, nn.Module):
            raise InputError(spec, f"{attr}() must return an nn.Module or (module, example inputs), got "
                                   f"{type(model).__name__}")
    if args is None:
        args = _synthesized(spec, options)
    return model, args if isinstance(args, tuple) else (args,)


def _import_model(target: str, folder: Path):
    """model.py as a module, registered in sys.modules while it runs (dataclasses and pickling look it up there)."""
    path = Path(target)
    name = _MODEL_MODULE + path.stem
    mod_spec = importlib.util.spec_from_file_location(name, path)
    assert mod_spec is not None and mod_spec.loader is not None  # a .py file always has a spec and a loader
    module = importlib.util.module_from_spec(mod_spec)
    sys.path.insert(0, str(folder))  # so the file can import its neighbours
    sys.modules[name] = module
    mod_spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _isolated_imports(folder: Path | None) -> Iterator[None]:
    """Undo what importing a model did to sys.path and sys.modules (see _factory_model)."""
    saved_path = list(sys.path)
    before = set(sys.modules)
    saved_bytecode = sys.dont_write_bytecode
    sys.dont_write_bytecode = True  # no __pycache__ in the user's folder: an audit modifies nothing it reads
    try:
        yield
    finally:
        sys.dont_write_bytecode = saved_bytecode
        sys.path[:] = saved_path
        if folder is not None:
            for name in [n for n in sys.modules if n not in before and _imported_from(n, folder)]:
                _forget(name)


def _imported_from(name: str, folder: Path) -> bool:
    """Whether a module newly imported while the model loaded came from its folder (first on sys.path then)."""
    top = name.partition(".")[0]
    return top.startswith(_MODEL_MODULE) or (folder / f"{top}.py").is_file() or (folder / top).is_dir()


def _forget(name: str) -> None:
    """Drop a module of the model's; its file still counts as read (no report may be written over it)."""
    module = sys.modules.pop(name, None)
    file = getattr(module, "__dict__", {}).get("__file__")
    if isinstance(file, str):
        note_read(file)


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
    """The exported program; without --trust-pickle nothing in the archive may run code (see pt2_guard)."""
    pt2_package()  # imported before the guard replaces functions its imports might keep
    guard = contextlib.nullcontext() if options.trust_pickle else archive_guard(spec)
    with _opened(spec) as fh:
        try:
            with guard, no_compiled_code(), _quiet():
                return torch.export.load(fh)
        except InputError:
            raise
        except Exception as exc:
            raise InputError(spec, f"not a loadable torch.export program ({described(exc)})") from None


def _load_torchscript_or_pickle(spec: str, options: TorchOptions, target: str, as_onnx: bool = False) -> Graph:
    """TorchScript archives load without running Python code; a pickled module needs --trust-pickle."""
    with _opened(spec) as fh:
        if _is_torchscript(fh):
            try:
                with _quiet():
                    scripted = torch.jit.load(fh, map_location="cpu")
            except Exception as exc:
                raise InputError(spec, f"not a loadable TorchScript file ({first_line(exc)})") from None
            return _torchscript_graph(scripted, spec, options)
        if not options.trust_pickle:
            raise InputError(spec, "is a pickled Python object, not TorchScript; unpickling runs arbitrary code from "
                                   "the file, so precaudit refuses it. Pass --trust-pickle if you trust where it came "
                                   "from, or save the model with torch.export.save / torch.jit.save")
        # trusted, and its code may still exit or raise, like a factory's
        with user_code(spec, "unpickling it", "cannot unpickle it ({})"), _quiet():
            model = torch.load(fh, map_location="cpu", weights_only=False)
    if not isinstance(model, nn.Module):
        raise InputError(spec, f"holds a {type(model).__name__}, not an nn.Module (a state_dict needs the model's code: "
                               "use a factory, model.py:make_model)")
    if as_onnx:
        return _torchscript_graph(model, spec, options)  # an nn.Module goes through the same ONNX exporter
    return capture(model, _synthesized(spec, options), spec, target)


@contextlib.contextmanager
def _opened(spec: str) -> Iterator[BinaryIO]:
    """The model file, opened once: torch reads this descriptor, checked to be a regular file, not the name again."""
    with open_regular(spec) as fh:
        note_read(spec)
        yield fh


def _is_torchscript(fh: BinaryIO) -> bool:
    try:
        with zipfile.ZipFile(fh) as z:
            return any(name.split("/", 1)[-1].startswith("code/") for name in z.namelist())
    except zipfile.BadZipFile:
        return False
    finally:
        fh.seek(0)


def _torchscript_graph(scripted, spec: str, options: TorchOptions) -> Graph:
    """TorchScript has no torch.export path: run it through the TorchScript ONNX exporter and read that."""
    return _via_onnx(scripted, _synthesized(spec, options), spec, dynamo=False,
                     failure="could not convert the TorchScript module ({}); check --input-shape, or audit an ONNX "
                             "export instead")


def _via_onnx(model, args: tuple, spec: str, dynamo: bool, failure: str, plan=None) -> Graph:
    """Export to a temporary ONNX file with torch.onnx and read that; failure names what went wrong.

    A dynamo export's nodes are placed as a captured program's are (source.frames: a library module's own
    forward, the user's call as the call site); with an autocast plan every float value says why it has its dtype.
    """
    from .onnx import load_onnx

    # The folder outlives this call: initializers (external data included) are read lazily, when traced mode
    # runs the graph; it is removed when precaudit exits.
    folder = tempfile.mkdtemp(prefix="precaudit-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    out = Path(folder) / "model.onnx"
    with user_code(spec, "running forward() for the ONNX export", failure):  # the exporter runs the user's forward()
        with _quiet():
            torch.onnx.export(model, args, str(out), dynamo=dynamo, opset_version=18 if dynamo else 17)
        try:
            graph = load_onnx(str(out))
        except InputError as exc:
            raise InputError(spec, f"its ONNX export cannot be read: {exc.problem}") from None
    if dynamo:
        targets = _placed(graph, out)
        if plan is not None:
            note_export(graph, targets, plan)
    graph.path = spec
    return graph


_FX_TARGET = re.compile(r"target=torch\.ops\.(?:aten|prims)\.(\w+)\.(\w+)")
_FX_NAME = re.compile(r"%(\w+) :")


def _placed(graph: Graph, path: Path) -> dict[str, str]:
    """Place each node by the exporter's stack trace as a captured program's nodes are; the ATen op each
    node came from, by node name ('linear', 'pow.Tensor_Scalar')."""
    import onnx

    from .source import frames

    model = onnx.load(str(path), load_external_data=False)
    by_name = {node.name: node for node in graph.nodes}
    targets: dict[str, str] = {}
    for proto in model.graph.node:
        node = by_name.get(proto.name)
        if node is None:
            continue
        meta = {p.key: p.value for p in proto.metadata_props}
        frame, call_site = frames(meta.get("pkg.torch.onnx.stack_trace", ""))
        if frame is not None:
            node.source_file, node.source_line = frame
        if call_site is not None:
            node.call_site = call_site
        fx_node = meta.get("pkg.torch.onnx.fx_node", "")
        named = _FX_NAME.match(fx_node)
        if named:  # the torch.export node it was lowered from ('%mean : ...'): what torch-side lists name
            graph.fx_names[proto.name] = named[1]
        found = _FX_TARGET.search(fx_node)
        if found:
            targets[proto.name] = found[1] if found[2] == "default" else f"{found[1]}.{found[2]}"
    return targets


# ---- capture ---------------------------------------------------------------------------------------------


def _converted(model: nn.Module, args: tuple, target: str) -> tuple[nn.Module, tuple]:
    """model.to(dtype) with its float inputs, for fp16/bf16 targets; unchanged otherwise."""
    dtype = _CAPTURE_IN.get(target)
    if dtype is None:
        return model, args
    return model.to(dtype), tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                                  for a in args)


def capture(model: nn.Module, args: tuple, spec: str, target: str) -> Graph:
    # model.eval(), .to() and forward() are the user's code: any exit or exception there is this model's error
    with user_code(spec, "running forward() under torch.export", _CAPTURE_FAILED):
        model, args = _converted(model.eval(), args, target)
        with _quiet():
            ep = torch.export.export(model, args, strict=False)
        eps = _module_walk(model)
    graph = lower_exported_program(ep, spec)
    graph.module_eps = eps
    graph.converted_to = target if target in _CAPTURE_IN else None
    return graph


def _check_autocast(spec: str, options: TorchOptions, target: str) -> None:
    if not options.autocast:
        return
    if options.autocast not in DEVICES:
        raise InputError(spec, f"--autocast must be one of {', '.join(DEVICES)}, not {options.autocast!r}")
    if target not in ("fp16", "bf16"):
        raise InputError(spec, f"--autocast runs ops in float16 or bfloat16: use it with --dtype fp16 or bf16, "
                               f"not {target}")
    if spec.lower().endswith((".pt", ".pth", ".ts")):
        raise InputError(spec, "--autocast needs the module's ATen program: a factory (model.py:make_model) or a "
                               "torch.export .pt2, not a TorchScript or pickled file")


def _capture_fp32(model: nn.Module, args: tuple, spec: str):
    """The module as it runs under autocast: in float32, every float cast it writes recorded."""
    with user_code(spec, "running forward() under torch.export", _CAPTURE_FAILED):
        model = model.eval()
        with _quiet(), preserve_casts():
            return torch.export.export(model, args, strict=False), _module_walk(model)


def capture_under_autocast(model: nn.Module, args: tuple, spec: str, device: str, target: str) -> Graph:
    program, eps = _capture_fp32(model, args, spec)
    graph = _lowered_under_autocast(program, spec, device, target)
    graph.module_eps = eps
    return graph


def _lowered_under_autocast(program, spec: str, device: str, target: str) -> Graph:
    with _quiet():
        plan = plan_autocast(program, device, target, spec)
    return lower_exported_program(program, spec, plan)


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
