"""Options a run passes down to the frontends and the traced mode, and the one check of each value a user gives.

The command line, the Python API and the pyproject all give the same values (a dtype, a trace engine, a number of
samples); each is checked here, once, by a function that names it as its caller does: `--samples` on the command
line, `samples` or `trace['samples']` in Python, `[tool.precaudit] fail-on` in a pyproject. A wrong value is an
InputError of one line that says what is allowed, raised before any model is read.
"""

from __future__ import annotations

import math
import numbers
import os
import reprlib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from .errors import InputError

__all__ = [
    "AUTOCAST",
    "FAIL_ON",
    "FORMATS",
    "TRACE_ENGINES",
    "TorchOptions",
    "TraceOptions",
    "argument",
    "check_bool",
    "check_choice",
    "check_int",
    "check_number",
    "check_path",
    "check_paths",
    "check_strings",
    "check_trace_option",
    "flag",
    "shown",
]

# auto: onnxruntime where it is installed and the node allows, numpy kernels elsewhere
TRACE_ENGINES = ("auto", "onnxruntime", "numpy")
FAIL_ON = ("error", "warning", "info", "never")
FORMATS = ("text", "concise", "json", "sarif", "github", "junit", "html")
AUTOCAST = ("cuda", "cpu")


def flag(name: str) -> str:
    """How the command line names a value: keep_fp32 is --keep-fp32, for_ is --for."""
    return "--" + name.rstrip("_").replace("_", "-")


def argument(name: str) -> str:
    """How the Python API names a value: the keyword argument itself."""
    return name


# ---- one check per kind of value: each returns the value as the run takes it, or raises "where: problem" --------

class _Short(reprlib.Repr):
    """A repr cut short (a message quotes a value, never a whole list); an object other than a number or a path by
    its type alone: the repr of a model or a tensor may be its every weight."""

    def repr_instance(self, x: Any, level: int) -> str:
        if isinstance(x, (numbers.Number, os.PathLike, type(None))):
            return super().repr_instance(x, level)
        return f"<{type(x).__name__}>"


_SHORT = _Short()
_SHORT.maxstring, _SHORT.maxother = 60, 40


def shown(value: Any) -> str:
    """A value as an error quotes it: its repr, cut short."""
    return _SHORT.repr(value)


def _fail(where: str, problem: str, file: str | None = None) -> InputError:
    return InputError(file, f"{where}: {problem}" if where else problem)


def _got(value: Any) -> str:
    if isinstance(value, str):  # a bare string where a list belongs would be read as its characters
        return f"got the string {shown(value)} (write [{shown(value)}])"
    return f"got {shown(value)}"


def check_bool(value: Any, where: str, file: str | None = None) -> bool:
    if not isinstance(value, bool):
        raise _fail(where, f"must be true or false, got {shown(value)}", file)
    return value


def check_choice(value: Any, choices: tuple[str, ...], where: str, file: str | None = None) -> str:
    if not isinstance(value, str) or value not in choices:
        raise _fail(where, f"must be one of {', '.join(choices)}, got {shown(value)}", file)
    return value


def check_int(value: Any, where: str, minimum: int) -> int:
    """A whole number (a numpy integer too, never a bool) at least minimum."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _fail(where, f"must be a whole number, got {shown(value)}")
    if value < minimum:
        raise _fail(where, f"must be at least {minimum}, got {value}")
    return int(value)


def check_number(value: Any, where: str, minimum: float = -math.inf, above: bool = False) -> float:
    """A finite real number (never a bool) at least minimum, or above it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _fail(where, f"must be a number, got {shown(value)}")
    number = float(value)
    if not math.isfinite(number):
        raise _fail(where, f"must be a finite number, got {number}")
    if number < minimum or (above and number == minimum):
        raise _fail(where, f"must be {'above' if above else 'at least'} {minimum:g}, got {number:g}")
    return number


def check_strings(value: Any, where: str, file: str | None = None) -> list[str]:
    """A list (or tuple) of strings; a bare string is refused, not read as a list of its characters."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise _fail(where, f"must be a list of strings, {_got(value)}", file)
    return list(value)


def _is_path(value: Any) -> bool:
    if not isinstance(value, (str, os.PathLike)):
        return False
    text = os.fspath(value)
    return isinstance(text, str) and bool(text)


def check_path(value: Any, where: str, file: str | None = None) -> str:
    """A path: a str or an os.PathLike (of a str), not empty."""
    if not _is_path(value):
        raise _fail(where, f"must be a path (str or os.PathLike), got {shown(value)}", file)
    return os.fspath(value)


def check_paths(value: Any, where: str, file: str | None = None) -> list[str]:
    """A list (or tuple) of paths; a bare string is refused, as for check_strings."""
    if not isinstance(value, (list, tuple)) or not all(_is_path(v) for v in value):
        raise _fail(where, f"must be a list of paths (str or os.PathLike), {_got(value)}", file)
    return [os.fspath(v) for v in value]


def _check_dims(value: Any, where: str) -> dict[str, int]:
    """{dim name: size >= 1}: --dim batch=2, trace={'dims': {'batch': 2}}."""
    if not isinstance(value, dict):
        raise _fail(where, f"must be a dict of dim name to size, got {shown(value)}")
    for name, size in value.items():
        if not isinstance(name, str) or not name:
            raise _fail(where, f"a dim name must be a non-empty string, got {shown(name)}")
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
            raise _fail(where, f"{shown(name)} must be a whole number >= 1, got {shown(size)}")
    return {name: int(size) for name, size in value.items()}


def _check_ranges(value: Any, where: str) -> dict[str, tuple[float, float]]:
    """{input name: (LO, HI)} with finite LO <= HI: --range x=0:1, trace={'ranges': {'x': (0, 1)}}."""
    if not isinstance(value, dict):
        raise _fail(where, f"must be a dict of input name to (LO, HI), got {shown(value)}")
    out = {}
    for name, span in value.items():
        if not isinstance(name, str) or not name:
            raise _fail(where, f"an input name must be a non-empty string, got {shown(name)}")
        ends = list(span) if isinstance(span, (list, tuple)) and len(span) == 2 else []
        if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) for v in ends) \
                or not ends or ends[0] > ends[1]:
            raise _fail(where, f"{shown(name)} must be a pair of finite numbers LO <= HI, got {shown(span)}")
        out[name] = (float(ends[0]), float(ends[1]))
    return out


def _check_timeout(value: Any, where: str) -> float | None:
    return None if value is None else check_number(value, where, minimum=0.0)


# each TraceOptions field's check, by field name
_TRACE_CHECKS: dict[str, Callable[[Any, str], Any]] = {
    "inputs": check_paths, "samples": lambda v, w: check_int(v, w, 1), "dims": _check_dims,
    "seed": lambda v, w: check_int(v, w, 0), "engine": lambda v, w: check_choice(v, TRACE_ENGINES, w),
    "progress": check_bool, "ranges": _check_ranges, "timeout": _check_timeout,
}


def check_trace_option(name: str, value: Any, where: str) -> Any:
    """One TraceOptions field's value, checked and named as where (a flag, trace['samples'])."""
    return _TRACE_CHECKS[name](value, where)


@dataclass
class TorchOptions:
    """How to turn a PyTorch input into a graph: example inputs when the factory gives none, and trust."""

    input_shapes: list[tuple[int, ...]] = field(default_factory=list)  # one per forward() argument
    input_dtype: str = "fp32"
    trust_pickle: bool = False  # unpickling runs arbitrary code: only with the user's explicit word
    # run the float32 module under torch.autocast on this device ("cuda", "cpu"), --dtype its autocast dtype;
    # None: --dtype means model.to(dtype)
    autocast: str | None = None
    # False (--no-factories): import no model.py:factory, so no Python code from the models' side runs
    factories: bool = True


@dataclass
class TraceOptions:
    """Traced mode: run the model on inputs and emulate the target dtype op by op."""

    inputs: list[str] = field(default_factory=list)  # .npz files, one batch each (one array per graph input)
    samples: int = 1
    dims: dict[str, int] = field(default_factory=dict)  # values for symbolic dims (--dim batch=2)
    seed: int = 0
    engine: str = "auto"  # onnxruntime where it is installed (numpy kernels for what it cannot run), or numpy only
    progress: bool = False  # a progress bar on a terminal; never in CI or with machine-readable output
    ranges: dict[str, tuple[float, float]] = field(default_factory=dict)  # --range NAME=LO:HI of synthesized inputs
    # --timeout: seconds a model's traced run may take (a Loop with an absurd trip count would run for ever); None: no
    # limit. The run stops between nodes on numpy and inside a session on onnxruntime (RunOptions.terminate)
    timeout: float | None = 1800.0

    def __post_init__(self) -> None:
        """Options made with a wrong value fail here, naming the field, not deep inside a run (the command line and
        the API check each value first, under the name their user gave it)."""
        for f in fields(self):
            setattr(self, f.name, check_trace_option(f.name, getattr(self, f.name), f.name))
