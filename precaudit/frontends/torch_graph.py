"""Load a PyTorch model — a factory, a torch.export .pt2, TorchScript — and capture it as an IR graph.

--dtype semantics for a module: the module is converted with `model.to(dtype)` (fp16, bf16) before capture,
so its explicit upcasts (`x.float()`, `.to(torch.float32)`) survive as casts in the graph; fp32 capture would
drop them as no-ops. fp8 targets capture in float32 and apply the same "float32 runs as the target" rule as
for ONNX graphs. Autocast is not emulated: it keeps norms and softmax in float32 by op lists of its own, which
is what the fused-op stash rules already model for LayerNorm/GroupNorm/RMSNorm.
"""

from __future__ import annotations

import ast
import atexit
import builtins
import contextlib
import functools
import importlib
import importlib.util
import io
import keyword
import logging
import pickle
import shutil
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import sympy
import torch
from torch import nn

from ..errors import InputError
from ..files import check_regular, note_read, open_regular
from ..ir import Graph
from ..options import TorchOptions
from .aten_lowering import lower_exported_program

__all__ = ["load_torch_graph", "load_torch_as_onnx", "stopped_as_error"]

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
    if lowered.endswith(".pt2"):
        return lower_exported_program(_load_pt2(spec, options), spec)
    if lowered.endswith((".pt", ".pth", ".ts")):
        return _load_torchscript_or_pickle(spec, options, target)
    with _factory_model(spec, options) as (module, args):
        return _capture(module, args, spec, target)


def load_torch_as_onnx(spec: str, options: TorchOptions, target: str = "fp16") -> Graph:
    """The model as the dynamo ONNX exporter writes it, for traced mode, whose emulator runs ONNX ops.

    Exported in the target dtype (fp16/bf16) so explicit upcasts survive as Casts; nodes keep the source
    lines and module paths the exporter records.
    """
    lowered = spec.lower()
    if lowered.endswith((".pt", ".pth", ".ts")):
        return _load_torchscript_or_pickle(spec, options, target, as_onnx=True)
    if lowered.endswith(".pt2"):
        graph = _exported_to_onnx(_load_pt2(spec, options), (), spec)
    else:
        with _factory_model(spec, options) as (module, args):
            with user_code(spec, "converting the module with model.to()"):
                program, args = _converted(module.eval(), args, target)
            graph = _exported_to_onnx(program, args, spec)
    graph.converted_to = target if target in _CAPTURE_IN and not lowered.endswith(".pt2") else None
    return graph


def _exported_to_onnx(program, args: tuple, spec: str) -> Graph:
    return _via_onnx(program, args, spec, dynamo=True,
                     failure="traced mode exports the model to ONNX first, and that failed ({}); audit an ONNX "
                             "export with --trace instead")


# ---- sources ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _factory_model(spec: str, options: TorchOptions) -> Iterator[tuple[nn.Module, tuple]]:
    """The factory's (module, inputs), with model.py's imports in effect until the model is captured.

    Its folder stays on sys.path while the factory and forward() run (they may import neighbours late); then
    sys.path is restored and the modules imported from that folder are forgotten, so the next model's
    `import layers` finds its own layers.py, not this one's.
    """
    target = spec.rpartition(":")[0]
    folder = check_regular(target).resolve().parent if target.endswith(".py") else None
    with _isolated_imports(folder):
        yield _from_factory(spec, options, folder)


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
    """The exported program; without --trust-pickle nothing in the archive may run code (see _archive_guard)."""
    _pt2_package()  # imported before the guard replaces functions its imports might keep
    guard = contextlib.nullcontext() if options.trust_pickle else _archive_guard(spec)
    with _opened(spec) as fh:
        try:
            with guard, _no_compiled_code(), _quiet():
                return torch.export.load(fh)
        except InputError:
            raise
        except Exception as exc:
            raise InputError(spec, f"not a loadable torch.export program ({_described(exc)})") from None


def _load_torchscript_or_pickle(spec: str, options: TorchOptions, target: str, as_onnx: bool = False) -> Graph:
    """TorchScript archives load without running Python code; a pickled module needs --trust-pickle."""
    with _opened(spec) as fh:
        if _is_torchscript(fh):
            try:
                with _quiet():
                    scripted = torch.jit.load(fh, map_location="cpu")
            except Exception as exc:
                raise InputError(spec, f"not a loadable TorchScript file ({_first_line(exc)})") from None
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
    return _capture(model, _synthesized(spec, options), spec, target)


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


def _via_onnx(model, args: tuple, spec: str, dynamo: bool, failure: str) -> Graph:
    """Export to a temporary ONNX file with torch.onnx and read that; failure names what went wrong."""
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


# ---- the user's code: exits and interrupts are this model's error ----------------------------------------


@contextlib.contextmanager
def user_code(file: str, doing: str, failure: str | None = None) -> Iterator[None]:
    """Run the user's code (model.py, a factory, forward()); whatever it raises becomes one InputError.

    BaseException, not just Exception: sys.exit(0) in a factory must not end precaudit with exit 0 and no
    report, and a KeyboardInterrupt or a BaseException subclass must not become a traceback. (A real Ctrl-C
    arriving while the user's code runs is reported the same way; the next model is still audited.)
    failure formats an ordinary exception's message ("{}" is its type and first line).
    """
    try:
        yield
    except InputError:
        raise
    except Exception as exc:
        problem = failure.format(_described(exc)) if failure else f"{doing} failed: {_described(exc)}"
        raise InputError(file, problem) from None
    except BaseException as exc:
        raise InputError(file, _stopped(doing, exc)) from None


@contextlib.contextmanager
def stopped_as_error(spec: str) -> Iterator[None]:
    """The last net around loading a PyTorch model: an exit or interrupt anywhere in it is an error for the model."""
    try:
        yield
    except Exception:
        raise
    except BaseException as exc:
        raise InputError(spec, _stopped("loading it", exc)) from None


def _stopped(doing: str, exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"{doing} exited (SystemExit {_safe_str(exc.code)})"
    if isinstance(exc, KeyboardInterrupt):
        return f"{doing} was interrupted (KeyboardInterrupt)"
    return f"{doing} failed: {_described(exc)}"


def _described(exc: BaseException) -> str:
    """'Type: first line of the message'; the exception is the user's object, whose __str__ may itself raise."""
    return f"{type(exc).__name__}: {_first_line(exc)}"


def _safe_str(value: object) -> str:
    """One line of str(value), at most 300 characters; '?' when the user's __str__ raises or exits."""
    try:
        text = str(value)
    except BaseException:  # noqa: B036 - sys.exit() in __str__ is no message
        return "?"
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else ""


def _first_line(exc: BaseException) -> str:
    return _safe_str(exc) or "no details"


# ---- a .pt2 from a stranger: nothing in it may run code --------------------------------------------------
#
# torch.export.load (torch 2.13, torch/export/pt2_archive/_package.py and torch/_export/serde/serialize.py)
# runs code from the archive on these paths, each closed here without --trust-pickle:
#   * torch.load(weights_only=False) for weights and constants whose payload config says use_pickle;
#   * torch.load(weights_only=False) as the fallback when the weights-only load of the sample inputs (or a
#     legacy weights/constants .pt, or the pre-2.8 archive's state dict) fails: serde's deserialize_torch_artifact;
#   * pickle.loads for opaque-object constants (data/constants/opaque_obj_*);
#   * sympy.sympify of the symbolic shape expressions in models/*.json, which parses them with eval();
#   * data/aotinductor/: compiled shared libraries, which load_pt2 dlopens (closed even with --trust-pickle).
# Custom-object constants (custom_obj_*) go through torch's C++ unpickler, which resolves only torch classes.
# The guard replaces those functions for the duration of the load: every torch.load is weights-only, plain
# pickle refuses, sympify takes only the expressions torch writes (sympy's srepr).

_PICKLED = ("holds pickled Python objects; unpickling runs arbitrary code from the file, so precaudit refuses it. "
            "Pass --trust-pickle if you trust where it came from")
_EXPRESSION = ("holds a symbolic shape expression that is not plain arithmetic ({}); torch would evaluate it as "
               "Python code, so precaudit refuses it. Pass --trust-pickle if you trust where it came from")


class _Refused(BaseException):
    """Raised inside torch's loader. A BaseException, so torch's own `except Exception` fallbacks (which retry
    with weights_only=False) cannot swallow it; the guard records it too, in case something catches it anyway."""


@contextlib.contextmanager
def _archive_guard(spec: str) -> Iterator[None]:
    """Functions, not classes, are replaced: torch imports modules lazily while loading, and one subclassing a
    replaced pickle.Unpickler would keep the replacement. A module that keeps a reference to a replacement
    gets the real function again once the load is over (`active`)."""
    refused: list[str] = []
    active = True
    real = {"load": torch.load, "loads": pickle.loads, "pickle_load": pickle.load, "sympify": sympy.sympify}

    def refuse(problem: str):
        refused.append(problem)
        raise _Refused(problem)

    def weights_only_load(f, *args: Any, **kwargs: Any):
        if active:
            kwargs["weights_only"] = True
        try:
            return real["load"](f, *args, **kwargs)
        except pickle.UnpicklingError:  # what the weights-only unpickler raises for anything but tensors
            if not active:
                raise
            refuse(_PICKLED)

    def no_pickle(name: str):
        def refused_or_real(*args: Any, **kwargs: Any):
            return refuse(_PICKLED) if active else real[name](*args, **kwargs)
        return refused_or_real

    def srepr_only(expr: Any, *args: Any, **kwargs: Any):
        known = kwargs.get("locals", args[0] if args else None) or {}
        if active and isinstance(expr, str) and not _plain_expression(expr, known):
            refuse(_EXPRESSION.format(_safe_str(repr(expr[:80]))))
        return real["sympify"](expr, *args, **kwargs)

    replaced = {(torch, "load"): weights_only_load, (torch.serialization, "load"): weights_only_load,
                (pickle, "loads"): no_pickle("loads"), (pickle, "load"): no_pickle("pickle_load"),
                (sympy, "sympify"): srepr_only}
    try:
        with _replaced(replaced):
            yield
    except BaseException:
        if refused:
            raise InputError(spec, refused[0]) from None
        raise
    finally:
        active = False
    if refused:
        raise InputError(spec, refused[0])


@contextlib.contextmanager
def _no_compiled_code() -> Iterator[None]:
    """AOTInductor runners are native code from the file, and precaudit audits the exported program only: skip them."""
    package = _pt2_package()
    if not hasattr(package, "_load_aoti"):
        yield
        return
    with _replaced({(package, "_load_aoti"): lambda *_a, **_k: None}):
        yield


def _pt2_package():
    return importlib.import_module("torch.export.pt2_archive._package")


@contextlib.contextmanager
def _replaced(attributes: dict[tuple[Any, str], Any]) -> Iterator[None]:
    saved = {key: getattr(*key) for key in attributes}
    try:
        for (owner, name), value in attributes.items():
            setattr(owner, name, value)
        yield
    finally:
        for (owner, name), value in saved.items():
            setattr(owner, name, value)


# The names torch's srepr expressions call (sympy classes, torch's sympy functions arrive in sympify's locals).
# Any other name must mean nothing to sympy's parser, which evaluates with sympy's namespace and Python's
# builtins (__import__, exec, open...): an unknown name becomes a Symbol or an undefined Function.
_SYMPY_NAMES = frozenset("""Add Mul Pow Mod Integer Rational Float Symbol Dummy Max Min Abs floor ceiling sqrt
    Eq Ne Lt Le Gt Ge Equality Unequality StrictLessThan LessThan StrictGreaterThan GreaterThan And Or Not
    Piecewise ExprCondPair true false oo zoo nan pi E""".split())
_NAMED_BY_STRING = ("Symbol", "Dummy", "Float")  # Symbol('s0', integer=True), Float('1.5', precision=53)
_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.BitAnd, ast.BitOr, ast.USub,
              ast.UAdd, ast.Not, ast.Invert, ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_STRUCTURE = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Tuple, ast.Load, ast.keyword,
              *_OPERATORS)


def _plain_expression(text: str, known: dict) -> bool:
    """Only calls of known names on numbers, symbols' names and each other: nothing sympy's eval() could misuse."""
    if not (text.isascii() and text.isprintable()):  # sympify drops newlines before parsing: refuse what differs
        return False
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    named = {id(call.args[0]) for call in ast.walk(tree) if isinstance(call, ast.Call) and call.args
             and isinstance(call.func, ast.Name) and call.func.id in _NAMED_BY_STRING}
    return all(_plain_node(node, known, named) for node in ast.walk(tree))


def _plain_node(node: ast.AST, known: dict, named: set[int]) -> bool:
    if isinstance(node, _STRUCTURE):
        return True
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and all(
            k.arg is not None and isinstance(k.value, ast.Constant) and not isinstance(k.value.value, (str, bytes))
            for k in node.keywords)
    if isinstance(node, ast.Constant):
        value = node.value
        return isinstance(value, (bool, int, float)) or value is None or (isinstance(value, str) and id(node) in named)
    if isinstance(node, ast.Name):
        return _plain_name(node.id, known)
    return False  # attributes, subscripts, lambdas, comprehensions, f-strings, walrus, starred...


def _plain_name(name: str, known: dict) -> bool:
    if name in known or name in _SYMPY_NAMES:
        return True
    if name.startswith("_") or keyword.iskeyword(name) or hasattr(builtins, name):
        return False
    return name not in _sympy_namespace()


@functools.lru_cache(maxsize=1)
def _sympy_namespace() -> frozenset[str]:
    """What `from sympy import *` brings into sympy's parser (parse_expr evaluates in that namespace)."""
    return frozenset(getattr(sympy, "__all__", None) or dir(sympy))


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
