"""Recognize a PyTorch input on the command line (without importing torch) and load it into the IR."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from ..errors import InputError
from ..ir import Graph
from ..options import TorchOptions
from .torch_objects import REGISTERED as _REGISTERED
from .torch_objects import check_importable, factory_spec

__all__ = [
    "check_importable",
    "check_torch_installed",
    "factory_spec",
    "is_torch_input",
    "load_torch",
    "load_torch_for_trace",
    "torch_input_files",
]  # (the two last from torch_objects, which torch_graph reads too)

_FILES = (".pt2", ".pt", ".pth", ".ts")


def is_torch_input(spec: str) -> bool:
    """model.py:make_model, package.module:factory, a .pt2 / TorchScript file, or a module the API registered."""
    return spec in _REGISTERED or spec.lower().endswith(_FILES) or factory_spec(spec) is not None


def torch_input_files(spec: str) -> list[Path]:
    """The source files a PyTorch model spec reads, found without importing torch or running the model's code.

    A .pt2/.pt file, or any existing path, is itself; model.py:factory is model.py (what model.py imports is known
    only by running it); package.module:factory is the module's file when its top-level package is found on
    sys.path without importing it (find_spec of a dotted name would import the parent packages), else nothing.
    """
    if spec in _REGISTERED:
        return []
    if spec.lower().endswith(_FILES) or os.path.lexists(spec):
        return [Path(spec)]
    match = factory_spec(spec)
    if not match:
        return []
    target = match["target"]
    if target.endswith(".py"):
        return [Path(target)]
    found = _module_file(target)
    return [found] if found else []


def _module_file(dotted: str) -> Path | None:
    top, *rest = dotted.split(".")
    module = sys.modules.get(dotted)
    if module is not None:  # already imported: it says where it came from
        file = getattr(module, "__dict__", {}).get("__file__")
        return Path(file) if isinstance(file, str) else None
    try:
        spec = importlib.util.find_spec(top)  # a top-level name: searched for on sys.path, not imported
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not rest:
        return Path(spec.origin) if spec.has_location and spec.origin else None
    return _submodule_file(list(spec.submodule_search_locations or []), rest)


def _submodule_file(folders: list[str], parts: list[str]) -> Path | None:
    """pkg/sub/mod.py or pkg/sub/mod/__init__.py, looked up on disk (a package's own __init__ may change
    __path__ when run; that case is not followed)."""
    for folder in folders:
        base = Path(folder).joinpath(*parts)
        for candidate in (base.with_name(base.name + ".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def load_torch(spec: str, options: TorchOptions, target: str) -> Graph:
    """Import torch only now: ONNX audits and --version never pay for it."""
    _check_factories(spec, options)
    _require_torch(spec)
    from .torch_graph import load_torch_graph
    from .user_code import stopped_as_error

    with stopped_as_error(spec):
        return load_torch_graph(spec, options, target)


def load_torch_for_trace(spec: str, options: TorchOptions, target: str) -> Graph:
    """The model exported to ONNX, which traced mode's emulator runs."""
    _check_factories(spec, options)
    _require_torch(spec)
    from .torch_graph import load_torch_as_onnx
    from .user_code import stopped_as_error

    with stopped_as_error(spec):
        return load_torch_as_onnx(spec, options, target)


def _check_factories(spec: str, options: TorchOptions) -> None:
    """Before torch is imported: with --no-factories a factory spec is a missing file, whether torch is there or not
    (torch_graph checks again where it imports)."""
    if spec not in _REGISTERED and not spec.lower().endswith(_FILES):
        check_importable(spec, options.factories)


def _require_torch(spec: str) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise InputError(spec, "auditing a PyTorch model needs torch: pip install 'precaudit[torch]'") from None


def check_torch_installed(spec: str) -> None:
    """_require_torch without importing torch (seconds), for a model audited in a worker: said here, in one line."""
    import importlib.util

    try:
        found = sys.modules.get("torch", True) is not None and importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise InputError(spec, "auditing a PyTorch model needs torch: pip install 'precaudit[torch]'")
