"""What names a PyTorch model without importing torch: a factory spec (model.py:make), and the nn.Modules the Python
API hands over as objects (precaudit.audit(module, example_inputs=...)) by the name they run under: "<object 1>" is
no path and no factory spec, so nothing on disk is read for it. Recognizing an input (torch_input) and importing one
(torch_graph) both ask this.

And the one contract for a model's example inputs, whoever gives them (a factory for check, match, keep-list and
train; example_inputs= and train_audit's inputs in the API): a tuple of positional inputs, a dict of keyword inputs,
or both, `return model, (x,), {"mask": m}` (one value: `((x,), {"mask": m})`); any other value is the one
positional input. factory_parts takes a factory's return value apart, call_inputs makes the inputs (args, kwargs).
"""

from __future__ import annotations

import os
import re
from typing import Any

from ..errors import InputError
from .user_code import safe_str

__all__ = [
    "REGISTERED",
    "call_inputs",
    "check_importable",
    "factory_parts",
    "factory_spec",
    "register_module",
    "registered",
    "unregister_module",
]

_FACTORY = re.compile(r"^(?P<target>[^:]+\.py|[A-Za-z_][\w.]*):(?P<attr>[A-Za-z_]\w*)\Z")


REGISTERED: dict[str, tuple[Any, tuple, dict]] = {}


def register_module(module, example_inputs) -> str:
    """A name the torch frontend loads this module by (with its example inputs), for one audit."""
    name = f"<object {len(REGISTERED) + 1}:{id(module):x}>"
    REGISTERED[name] = (module, *call_inputs(name, example_inputs))
    return name


def unregister_module(name: str) -> None:
    REGISTERED.pop(name, None)


def registered(spec: str) -> tuple[Any, tuple, dict] | None:
    """(module, args, kwargs) of a registered module, or None."""
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


def factory_parts(spec: str, made: Any, more: int = 0) -> tuple[Any, Any, list]:
    """A factory's return value taken apart: the model, its inputs as call_inputs takes them (None: none given), and
    up to `more` items after them (train's loss_fn and optimizer). A value that is no tuple is the model alone."""
    attr = spec.rpartition(":")[2]
    if not isinstance(made, tuple):
        return made, None, []
    if len(made) < 2:
        raise InputError(spec, _shape(attr, made))
    model, inputs, *rest = made
    if rest and isinstance(rest[0], dict):  # (model, args, kwargs)
        if isinstance(inputs, dict):
            raise InputError(spec, f"{attr}() returned two dicts: give the positional inputs as a tuple, then the "
                                   "keyword inputs as a dict")
        inputs = (inputs if isinstance(inputs, tuple) else (inputs,), rest.pop(0))
    if len(rest) > more:
        raise InputError(spec, _shape(attr, made))
    return model, inputs, rest


def _shape(attr: str, made: tuple) -> str:
    return (f"{attr}() must return a module, (module, inputs) or (module, args, kwargs): inputs a tuple of positional "
            f"inputs, a dict of keyword inputs, or one input; not a tuple of {len(made)}")


def call_inputs(spec: str, inputs: Any) -> tuple[tuple, dict]:
    """(args, kwargs) of example inputs: a dict is keyword inputs, a tuple positional ones, a pair of a tuple and a
    dict both; anything else (a tensor) the one positional input."""
    if isinstance(inputs, dict):
        args, kwargs = (), inputs
    elif isinstance(inputs, tuple) and len(inputs) == 2 and isinstance(inputs[0], tuple) \
            and isinstance(inputs[1], dict):
        args, kwargs = inputs
    else:
        args, kwargs = (inputs if isinstance(inputs, tuple) else (inputs,)), {}
    for key in kwargs:
        if not isinstance(key, str):
            raise InputError(spec, f"a keyword input is named {safe_str(repr(key))[:80]}: keyword inputs are named by "
                                   "forward()'s parameters, as strings")
    return tuple(args), dict(kwargs)
