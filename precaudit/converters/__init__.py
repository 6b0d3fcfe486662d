"""What each fp16 converter does to a float32 ONNX graph, so an audit can judge the model it will really make.

A converter model says, for one released version of one converter (each module cites the code it follows):

- which ops it keeps in float32 by default (its default block list, and for modelopt the chains it fuses);
- what it does to the float32 constants it converts (onnxconverter-common clamps them into [1e-7, 1e4]);
- what becomes of a ``Cast(to=float32)`` outside the block list (no converter keeps an upcast: it is rewritten,
  retyped or removed);
- how its block-list arguments name nodes (``keep-list`` prints them ready to paste).

``plain`` is no converter: every float32 tensor runs in the target dtype, constants are rounded as they are, and
a Cast that widens an activation starts a float32 island (precaudit's behaviour before ``--converter``).
"""

from __future__ import annotations

from .base import CONTROL_FLOW_CAVEAT, PLAIN, Clamp, Converter, KeepArgs, py_list

__all__ = [
    "CONTROL_FLOW_CAVEAT",
    "CONVERTER_NAMES",
    "PLAIN",
    "Clamp",
    "Converter",
    "KeepArgs",
    "converter_named",
    "py_list",
]


def _registry() -> dict[str, Converter]:
    from . import modelopt, onnxconverter_common, onnxruntime

    return {c.name: c for c in (PLAIN, onnxconverter_common.CONVERTER, onnxruntime.CONVERTER, onnxruntime.OLIVE,
                                modelopt.CONVERTER)}


CONVERTER_NAMES = ("plain", "onnxconverter-common", "onnxruntime", "olive", "modelopt")


def converter_named(name: str | Converter | None) -> Converter:
    """The converter model for a --converter value; KeyError with the choices for an unknown one."""
    if isinstance(name, Converter):
        return name
    if name is None:
        return PLAIN
    found = _registry().get(name)
    if found is None:
        raise KeyError(f"unknown converter {name!r}; choose one of {', '.join(CONVERTER_NAMES)}")
    return found
