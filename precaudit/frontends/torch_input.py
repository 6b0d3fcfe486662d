"""Recognize a PyTorch input on the command line (without importing torch) and load it into the IR."""

from __future__ import annotations

import re

from ..errors import InputError
from ..ir import Graph
from ..options import TorchOptions

__all__ = ["is_torch_input", "load_torch", "load_torch_for_trace"]

_FACTORY = re.compile(r"^(?P<target>[^:]+\.py|[A-Za-z_][\w.]*):(?P<attr>[A-Za-z_]\w*)$")
_FILES = (".pt2", ".pt", ".pth", ".ts")


def is_torch_input(spec: str) -> bool:
    """model.py:make_model, package.module:factory, or a .pt2 / TorchScript file."""
    return spec.lower().endswith(_FILES) or bool(_FACTORY.match(spec))


def load_torch(spec: str, options: TorchOptions, target: str) -> Graph:
    """Import torch only now: ONNX audits and --version never pay for it."""
    _require_torch(spec)
    from .torch_graph import load_torch_graph

    return load_torch_graph(spec, options, target)


def load_torch_for_trace(spec: str, options: TorchOptions, target: str) -> Graph:
    """The model exported to ONNX, which traced mode's emulator runs."""
    _require_torch(spec)
    from .torch_graph import load_torch_as_onnx

    return load_torch_as_onnx(spec, options, target)


def _require_torch(spec: str) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise InputError(spec, "auditing a PyTorch model needs torch: pip install 'precaudit[torch]'") from None
