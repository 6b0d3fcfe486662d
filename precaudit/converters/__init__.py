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
    "kept_by_common",
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


def kept_by_common(op_type: str, index: int) -> bool:
    """Whether onnxruntime's and onnxconverter-common's converters both read this input of an op_type node in
    float32 (both block Range and TopK; onnxruntime's keeps Resize's scales, onnxconverter-common's blocks Resize):
    what an audit that names no converter need not lay at a conversion's door."""
    from . import onnxconverter_common, onnxruntime

    return all(c.keeps_input_float(op_type, index) for c in (onnxruntime.CONVERTER, onnxconverter_common.CONVERTER))
