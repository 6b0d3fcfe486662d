"""Type-support sites: a node of the default ONNX domain whose float input a conversion gives the target dtype, where
the operator's schema does not accept that type (DynamicQuantizeLinear takes float32 only, Range and
NonMaxSuppression no 16-bit float). The converted model is then invalid: onnx.checker rejects it and onnxruntime
refuses to load it ("Type (tensor(float16)) of input parameter ... is invalid")."""

from __future__ import annotations

import functools

import onnx

from ...converters import kept_by_common
from ...ir import Graph
from ..compute_dtype import DtypeResolver
from .base import Site
from .facts import dtype_facts

__all__ = ["find_type_support_sites"]


def find_type_support_sites(graph: Graph, resolver: DtypeResolver) -> list[Site]:
    """One site per node whose float input would be held in a narrow target type its schema does not allow."""
    target = resolver.target
    # float16 only: it is what converters write into any opset's graph. bfloat16 came to most schemas at opset 13
    # and an older graph converted to it fails nearly everywhere (the opset, not a node, is the problem); float8
    # reaches a graph through quantize/dequantize, never by converting an op's inputs
    if target.onnx_type != onnx.TensorProto.FLOAT16:
        return []
    # with no converter named, what onnxruntime's and onnxconverter-common's converters both read in float32 (Range,
    # TopK, Resize's scales ...) would be noise; a converter named answers for itself
    converter = resolver.converter
    kept = kept_by_common if converter.plain else converter.keeps_input_float
    sites = []
    for node in graph.nodes:
        if node.domain not in ("", "ai.onnx") or node.subgraph_path:
            continue
        allowed = _allowed(node.op_type, node.opset)
        if allowed is None:
            continue
        for index, value in enumerate(node.inputs):
            types = allowed[min(index, len(allowed) - 1)]  # (a variadic input repeats the last)
            if value is None or value.dtype != "fp32" or "tensor(float16)" in types or kept(node.op_type, index):
                continue
            dtype = resolver.of_node(node)
            if dtype is None or dtype.fmt is not target:
                break  # the node is kept (a converter's block list, --keep-fp32) or computes in another type
            sites.append(Site("type_support", node, {
                "op": node.op_type, "input_index": index, "input_name": value.name,
                "allowed_types": ", ".join(t[len("tensor("):-1] for t in types), **dtype_facts(dtype, resolver)}))
            break
    return sites


@functools.cache
def _allowed(op_type: str, opset: int | None) -> tuple[tuple[str, ...], ...] | None:
    """Per formal input, the tensor types the schema allows at this opset; None for an op no schema knows, or whose
    float inputs allow every float type (most ops: nothing to check)."""
    try:
        schema = onnx.defs.get_schema(op_type, opset if opset is not None and 0 < opset < 1 << 31 else 1 << 30, "")
    except Exception:
        return None
    constraints = {c.type_param_str: tuple(c.allowed_type_strs) for c in schema.type_constraints}
    per_input = tuple(constraints.get(i.type_str, (i.type_str,)) for i in schema.inputs)
    restricted = [types for types in per_input if "tensor(float)" in types and "tensor(float16)" not in types]
    return per_input if restricted else None
