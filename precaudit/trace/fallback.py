"""Ops without a numpy kernel run through onnx's reference evaluator, one node at a time (slow, but complete)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import helper

from ..errors import InputError
from ..ir import Graph, Node

if TYPE_CHECKING:
    from onnx.reference import ReferenceEvaluator

__all__ = ["ReferenceFallback"]

_CONTROL_FLOW = {"If", "Loop", "Scan"}


class ReferenceFallback:
    """Builds a one-node model per op the first time it is met and keeps the evaluator for later calls."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self._evaluators: dict[tuple, ReferenceEvaluator] = {}

    def run(self, node: Node, args: list) -> list:
        if node.op_type in _CONTROL_FLOW or node.subgraph_path:
            raise InputError(self.graph.path, f"traced mode runs control flow on onnxruntime only: node "
                                              f"'{node.name}' ({node.op_type}); pip install 'precaudit[trace]' "
                                              f"and use --trace-engine auto, or audit it without --trace")
        key = (id(node), tuple(None if a is None else (a.dtype.str, a.ndim) for a in args))
        evaluator = self._evaluators.get(key)
        if evaluator is None:
            evaluator = self._evaluators[key] = self._build(node, args)
        feeds = {f"i{i}": a for i, a in enumerate(args) if a is not None}
        try:
            return list(evaluator.run(None, feeds))
        except Exception as exc:
            raise InputError(self.graph.path, f"traced mode cannot run node '{node.name}' ({node.op_type}): "
                                              f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc

    def _build(self, node: Node, args: list) -> ReferenceEvaluator:
        from onnx.reference import ReferenceEvaluator

        names = [f"i{i}" if a is not None else "" for i, a in enumerate(args)]
        inputs = [helper.make_tensor_value_info(f"i{i}", helper.np_dtype_to_tensor_dtype(a.dtype), None)
                  for i, a in enumerate(args) if a is not None]
        outs = [f"o{i}" for i in range(len(node.outputs))]
        try:  # an op type, domain or string attribute that is not UTF-8 (a surrogate) cannot even be a node here
            proto = helper.make_node(node.op_type, names, outs, domain=node.domain, **node.attrs)
            graph = helper.make_graph([proto], "one_node", inputs, [
                helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs])
            opsets = [helper.make_opsetid(node.domain, node.opset or 17)]
            if node.domain:
                opsets.append(helper.make_opsetid("", 17))
            model = helper.make_model(graph, opset_imports=opsets)
            return ReferenceEvaluator(model)
        except Exception as exc:
            raise InputError(self.graph.path, f"traced mode has no kernel for node '{node.name}' "
                                              f"({node.domain + '.' if node.domain else ''}{node.op_type})") from exc


_ML_FLOATS = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
# The reference runs in float32 (float64 where the graph casts to double): onnxruntime's CPU kernels run it at
# full speed, and its error (~6e-8 relative) is far below that of any format precaudit emulates.
REFERENCE = np.float32


def as_float(array: np.ndarray, dtype: type) -> np.ndarray:
    """Float arrays (ml_dtypes' bfloat16 and fp8 included) in the run's dtype; others unchanged."""
    if array.dtype.kind == "f" or array.dtype.name in _ML_FLOATS:
        return array.astype(dtype, copy=False)
    return array


def as_reference(array: np.ndarray) -> np.ndarray:
    """An array as the reference holds it: float32, or float64 where the graph computes in double."""
    return array if array.dtype == np.float64 else as_float(array, REFERENCE)
