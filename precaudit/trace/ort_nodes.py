"""ONNX nodes and arrays as onnxruntime segments take them: Cast pairs that round, float32 attributes and inputs."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..dtypes import FORMATS, Format
from ..ir import Node
from .fallback import as_reference

__all__ = [
    "DOMAINS",
    "NARROW",
    "NARROW_FORMAT",
    "ROUND_TO",
    "contiguous",
    "first_line",
    "float32_attrs",
    "inference_inputs",
    "reference_array",
    "round_trip",
]

# Formats a Cast pair rounds into; fp8 stays on numpy (onnxruntime's Cast saturates by default, and needs opset 19).
ROUND_TO = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
NARROW_FORMAT: dict[int, Format] = {TensorProto.FLOAT16: FORMATS["fp16"], TensorProto.BFLOAT16: FORMATS["bf16"]}
NARROW = {TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ,
          TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ}
DOMAINS = {"": "", "ai.onnx": "", "com.microsoft": "com.microsoft"}


def round_trip(source: str, target: str, narrow: int) -> list[onnx.NodeProto]:
    """The Cast pair that rounds source into a narrow type and back to float32, as target."""
    return [helper.make_node("Cast", [source], [f"narrow::{target}"], to=narrow),
            helper.make_node("Cast", [f"narrow::{target}"], [target], to=TensorProto.FLOAT)]


def float32_attrs(node: Node) -> dict:
    """A node's attributes with every narrow float type replaced by float32: both runs compute in float32."""
    attrs = {}
    for key, value in node.attrs.items():
        if key in ("to", "dtype") and isinstance(value, int) and value in NARROW:
            attrs[key] = TensorProto.FLOAT
        elif isinstance(value, TensorProto) and value.data_type in NARROW:
            attrs[key] = numpy_helper.from_array(reference_array(numpy_helper.to_array(value)), value.name)
        else:
            attrs[key] = value
    return attrs


def reference_array(data: np.ndarray) -> np.ndarray:
    """A constant as the reference holds it (narrow floats widened to float32), in one contiguous block."""
    return contiguous(as_reference(np.asarray(data)))


def contiguous(array: np.ndarray) -> np.ndarray:
    """The array in one C-ordered block (np.ascontiguousarray would turn a 0-d array into a 1-d one)."""
    return array if array.flags.c_contiguous else array.copy(order="C")


def inference_inputs(node: Node, names: list[str]) -> list[str]:
    """A node's input names as an inference run reads them: a Dropout without its training_mode input.

    An exporter run on a module left in training mode writes Dropout(x, ratio, training_mode=True); onnxruntime
    would then drop a different random part of x in the reference and in the emulation, and every value after it
    would differ by far more than rounding. A deployed model runs Dropout as the identity, as the numpy kernel does.
    """
    if node.op_type == "Dropout" and node.domain in ("", "ai.onnx") and len(names) > 2:
        return names[:2]
    return names


def first_line(exc: Exception) -> str:
    """What onnxruntime said, in one line."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
