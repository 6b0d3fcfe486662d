"""nn.Modules the Python API hands over as objects (precaudit.audit(module, example_inputs=...)), by the name they
run under: "<object 1>" is no path and no factory spec, so nothing on disk is read for it. No torch imported here:
recognizing an input (torch_input) asks this too."""

from __future__ import annotations

__all__ = ["REGISTERED", "register_module", "unregister_module", "registered"]

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
