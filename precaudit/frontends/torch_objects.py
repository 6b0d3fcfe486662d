"""What names a PyTorch model without importing torch: a factory spec (model.py:make), and the nn.Modules the Python
API hands over as objects (precaudit.audit(module, example_inputs=...)) by the name they run under: "<object 1>" is
no path and no factory spec, so nothing on disk is read for it. Recognizing an input (torch_input) and importing one
(torch_graph) both ask this."""

from __future__ import annotations

import os
import re

from ..errors import InputError

__all__ = ["REGISTERED", "check_importable", "factory_spec", "register_module", "registered", "unregister_module"]

_FACTORY = re.compile(r"^(?P<target>[^:]+\.py|[A-Za-z_][\w.]*):(?P<attr>[A-Za-z_]\w*)\Z")


REGISTERED: dict[str, tuple] = {}


def register_module(module, example_inputs) -> str:
    """A name the torch frontend loads this module by (with its example inputs), for one audit."""
    name = f"<object {len(REGISTERED) + 1}:{id(module):x}>"
    REGISTERED[name] = (module, example_inputs if isinstance(example_inputs, tuple) else (example_inputs,))
    return name


def unregister_module(name: str) -> None:
    REGISTERED.pop(name, None)


def registered(spec: str) -> tuple | None:
    """(module, example inputs) of a registered module, or None."""
    return REGISTERED.get(spec)


def factory_spec(spec: str) -> re.Match[str] | None:
    """model.py:make or package.module:make, taken apart by _FACTORY; None for anything else.

    An argument that names an existing file or folder (a dangling symlink too) is that path, never a factory: a
    pull request can add evil.py and a file named `evil.py:make` beside it, and a CI glob such as `models/*`
    hands that name over as a path to audit, not as code to import.
    """
    if spec in REGISTERED or os.path.lexists(spec):
        return None
    return _FACTORY.match(spec)


def check_importable(spec: str, factories: bool = True) -> None:
    """Refuse, as one InputError, to import a factory spec that names an existing path, or any factory when the
    user said --no-factories (then model.py:make is a missing model file, like any other)."""
    if os.path.lexists(spec):
        raise InputError(spec, "names a file, not a factory: precaudit reads a path it is given as a file, never "
                               "imports it as code")
    if not factories:
        raise InputError(spec, "no such file (--no-factories: precaudit imports no model.py:factory)")
