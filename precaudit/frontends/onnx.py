"""Load an ONNX model into the IR without reading weights the audit does not need."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
import onnx.inliner

from ..errors import InputError
from ..files import open_regular
from ..ir import Graph
from .onnx_builder import ReadLater, Undeclared, build_graph
from .onnx_order import sort_for_bodies

__all__ = ["load_onnx"]


def load_onnx(path: str) -> Graph:
    """Parse the model file, inline its local functions, infer types and build the IR."""
    data = _read_bytes(path)
    model = _parse(path, data)
    model_dir = Path(path).resolve().parent
    inlined = bool(model.functions)  # then the model to infer is no longer the file's bytes
    if inlined:
        try:
            model = onnx.inliner.inline_local_functions(model)
        except Exception as exc:  # an inliner failure should not hide the rest of the graph
            raise InputError(path, f"cannot inline model-local functions: {exc}") from exc
    elif len(model.graph.value_info) + len(model.graph.output) >= len(model.graph.node):
        # Perhaps every value is declared with its type and shape, as the dynamo exporter writes them: then shape
        # inference (a tenth of a second and some 50 MB for 20,000 nodes) would only repeat the file. The builder
        # checks each output as it goes and gives up at the first one the file does not declare.
        try:
            return build_graph(path, model_dir, model, declared_only=True)
        except (Undeclared, ReadLater):  # (a body is never read from declarations alone)
            pass
    if inlined or _holds_weights(model):
        model = _infer_shapes(model)
    else:
        # The file's bytes are what inference would read: it gets them as they are, and one parsed model is held
        # at a time (the one read, then the one inferred), not both while inference holds its own copy.
        del model
        model = _infer_shapes_of_bytes(path, data)
    del data
    try:
        return build_graph(path, model_dir, model)
    except ReadLater:
        # a body reads an outer value that a later node of its parent makes: onnxruntime runs such a model (its
        # float16 converter writes one, the Cast back to float16 of a kept node's output placed last); read it
        # in the order onnxruntime runs it
        sort_for_bodies(model.graph)
        return build_graph(path, model_dir, _infer_shapes(model), resorted=True)


_WEIGHT_BYTES = 1 << 16


def _infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with inferred types and shapes, or as it is when inference fails.

    Shape inference copies the whole model in and out; the weights' bytes are taken out first (their dims are
    all it reads of them: shapes it reads from data, a Reshape's target say, are small) and put back after.
    """
    weights = {init.name: init.raw_data for init in model.graph.initializer if len(init.raw_data) > _WEIGHT_BYTES}
    for init in model.graph.initializer:
        if init.name in weights:
            init.ClearField("raw_data")
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        inferred = model  # types then come from the graph's own annotations and _fill_missing_dtype
    for init in inferred.graph.initializer:
        if init.name in weights:
            init.raw_data = weights[init.name]
    return inferred


def _holds_weights(model: onnx.ModelProto) -> bool:
    """Whether an initializer holds more than _WEIGHT_BYTES inline (the weights _infer_shapes takes out first)."""
    return any(len(init.raw_data) > _WEIGHT_BYTES for init in model.graph.initializer)


def _infer_shapes_of_bytes(path: str, data: bytes) -> onnx.ModelProto:
    """_infer_shapes for a model without inline weights or local functions, from the file's bytes."""
    try:
        return onnx.shape_inference.infer_shapes(data, strict_mode=False)
    except Exception:
        return _parse(path, data)  # types then come from the graph's own annotations and _fill_missing_dtype


# protobuf cannot parse a message above 2 GiB: a bigger file is not a model (its weights belong in external data)
_MAX_MODEL_BYTES = 2 << 30


def _read_bytes(path: str) -> bytes:
    with open_regular(path) as fh:
        if os.fstat(fh.fileno()).st_size > _MAX_MODEL_BYTES:
            raise InputError(path, "is larger than 2 GiB, the most an ONNX file can hold (weights above that live "
                                   "in external data files)")
        return fh.read()


def _parse(path: str, data: bytes) -> onnx.ModelProto:
    try:
        return _parse_model(data)
    except InputError as exc:
        raise InputError(path, exc.problem) from None
    except Exception as exc:
        raise InputError(path, f"not a readable ONNX model ({type(exc).__name__}: {_first_line(exc)})") from None


def _parse_model(data: bytes) -> onnx.ModelProto:
    model = onnx.load_model_from_string(data)
    if not model.HasField("graph") or (not model.graph.node and not model.graph.input):
        raise InputError(None, "not an ONNX model: the file parses but holds no graph")
    return model


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else "unknown error"
