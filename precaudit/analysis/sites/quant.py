"""Quantization sites: the constant scales of quantize and dequantize nodes (quant_scale), and scales computed from
an activation's largest |x| (dynamic_scale)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...dtypes import COMPUTED, ELEMENTS
from ...ir import Graph, Node, Value, shown_origin
from ..compute_dtype import DtypeResolver
from ..constants import resolve_scalar, skip_casts
from .base import Site
from .facts import dtype_facts
from .walks import feeding_op

__all__ = ["QUANTIZERS", "SCALE_INPUT", "find_quant_sites"]

# Quantize and dequantize ops (ONNX, onnxruntime's com.microsoft, ModelOpt's trt) and the input holding their scale.
SCALE_INPUT = {"QuantizeLinear": 1, "DequantizeLinear": 1, "TRT_FP8QuantizeLinear": 1, "TRT_FP8DequantizeLinear": 1,
               "TRT_MXFP8DequantizeLinear": 1, "TRT_INT4QuantizeLinear": 1, "TRT_INT4DequantizeLinear": 1,
               "TRT_FP4DynamicQuantize": 1}
QUANTIZERS = {"QuantizeLinear", "TRT_FP8QuantizeLinear", "TRT_INT4QuantizeLinear", "TRT_FP4DynamicQuantize"}
# what ModelOpt's FP8 quantizer makes: E4M3 bytes it types as uint8
_TRT_QUANTIZED = {"TRT_FP8QuantizeLinear": "fp8-e4m3", "TRT_FP4DynamicQuantize": "fp4-e2m1"}
_MAX_SCALE_ELEMENTS = 1 << 22  # scales larger than this (none are) are not read
_F32_NORMAL = float(np.finfo(np.float32).smallest_normal)


def find_quant_sites(graph: Graph, resolver: DtypeResolver) -> list[Site]:
    """A quant_scale site per quantize or dequantize node with a constant scale, and a dynamic_scale site per scale
    computed as amax / k (or amax * c) and divided by, with nothing flooring it on the way."""
    sites, seen_scales, seen_makers = [], set(), set()
    for node in graph.nodes:
        index = SCALE_INPUT.get(node.op_type)
        if index is not None and node.domain in ("", "ai.onnx", "com.microsoft", "trt"):
            scale = _constant_scale(node.input(index))
            if scale is not None:
                sites.append(_scale_site(node, scale, id(scale.stored) not in seen_scales, resolver))
                seen_scales.add(id(scale.stored))
                continue
        found = _dynamic_scale(node)
        if found is not None and id(found[0]) not in seen_makers:
            seen_makers.add(id(found[0]))
            site = _dynamic_site(node, *found, resolver)
            if site is not None:
                sites.append(site)
    return sites


@dataclass
class _Scale:
    """A constant scale: the tensor that stores it, its numbers as stored and as the node reads them (a two-level
    NVFP4 scale: its E4M3 block scales times the float32 global one), and where it comes from."""

    stored: Value
    data: np.ndarray  # as stored, float64
    values: np.ndarray  # as the node reads them, float64
    source: str


def _constant_scale(value: Value | None) -> _Scale | None:
    """The scale a node reads, if it is a constant: stored (through Casts), or a per-tensor DequantizeLinear of
    constants (ModelOpt's NVFP4 block scales, DQ(E4M3 scales, global scale))."""
    stored = skip_casts(value)
    if stored is None or (stored.const_size or 0) > _MAX_SCALE_ELEMENTS:
        return None
    if stored.is_const:
        data = _numbers(stored)
        return None if data is None else _Scale(stored, data, data, shown_origin(stored))
    maker = stored.producer
    if maker is None or maker.op_type != "DequantizeLinear" or maker.attr("block_size", 0):
        return None
    inner, outer = skip_casts(maker.input(0)), skip_casts(maker.input(1))
    if inner is None or outer is None or not inner.is_const or not outer.is_const or maker.input(2) is not None:
        return None
    data, factor = _numbers(inner), _numbers(outer)
    if data is None or factor is None or factor.size != 1:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        values = data * factor.reshape(())
    return _Scale(inner, data, values, f"{shown_origin(inner)} times {shown_origin(outer)}")


def _numbers(value: Value) -> np.ndarray | None:
    if (value.const_size or 0) > _MAX_SCALE_ELEMENTS:
        return None
    data = value.const()
    if data is None:
        return None
    try:
        return np.asarray(data).astype(np.float64)
    except (TypeError, ValueError):  # strings, a type numpy cannot widen
        return None


def _scale_site(node: Node, scale: _Scale, first: bool, resolver: DtypeResolver) -> Site:
    values, data = scale.values.reshape(-1), scale.data.reshape(-1)
    own = ELEMENTS.get(scale.stored.dtype or "")
    own_normal = own.smallest_normal if own is not None else 0.0
    with np.errstate(invalid="ignore"):
        # subnormal in its own type (float16 below 6.1e-5, e4m3 below 2**-6), or as float32 reads it (E8M0 2**-127)
        subnormal = (values != 0) & np.isfinite(values) & ((np.abs(data) < own_normal) | (np.abs(values) < _F32_NORMAL))
        counts = {"zero_count": int(np.count_nonzero(values == 0)), "subnormal_count": int(np.count_nonzero(subnormal)),
                  "nan_count": int(np.count_nonzero(np.isnan(values))),
                  "inf_count": int(np.count_nonzero(np.isinf(values)))}
    expected = _computes_in(node)
    dtype = scale.stored.dtype if scale.values is scale.data else None  # a folded scale is read as its DQ makes it
    mismatch = dtype in COMPUTED and expected in COMPUTED and dtype != expected
    first_bad = _first_bad(scale.values, own_normal if scale.values is scale.data else 0.0)
    facts: dict[str, Any] = {
        "op": node.op_type, "consumer": node.name, "scale_source": scale.source,
        "scale_dtype": _long(scale.stored.dtype), "expected_dtype": _long(expected), "dtype_mismatch": mismatch,
        "scale_count": int(values.size), **counts, "bad_count": sum(counts.values()), "first_reader": first,
        "problem": _problem(counts, first_bad, scale.stored.dtype, expected if mismatch else None),
        "first_bad": first_bad, "input_op": feeding_op(node.input(0)), "quantizes": node.op_type in QUANTIZERS,
        **_zeroed_below(node, values)}
    dtype_now = resolver.of_node(node)
    if dtype_now is not None:
        facts.update(dtype_facts(dtype_now, resolver))
    return Site("quant_scale", node, facts)


def _computes_in(node: Node) -> str | None:
    """The float type a quantize node reads (x's) or a dequantize node makes (its output's)."""
    value = node.input(0) if node.op_type in QUANTIZERS else (node.outputs[0] if node.outputs else None)
    return value.dtype if value is not None else None


def _long(dtype: str | None) -> str:
    return ELEMENTS[dtype].long_name if dtype in ELEMENTS else dtype or "an unknown type"


def _problem(counts: dict[str, int], first_bad: str, stored: str | None, expected: str | None) -> str:
    """What is wrong with the scale, in words."""
    parts = [f"{n} {word}" for word, n in (("zero", counts["zero_count"]), ("subnormal", counts["subnormal_count"]),
                                          ("NaN", counts["nan_count"]), ("inf", counts["inf_count"])) if n]
    text = ", ".join(parts) + (f" (first {first_bad})" if first_bad else "")
    if expected is not None:
        text += ("; " if text else "") + f"stored as {_long(stored)} while the node computes in {_long(expected)}"
    return text


def _first_bad(values: np.ndarray, own_normal: float) -> str:
    """The first scale entry that is 0, subnormal, NaN or inf, and where: "at [3, 1]: 0"."""
    if values.size == 0:
        return ""
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values) | (np.abs(values) < max(_F32_NORMAL, own_normal))
    hits = np.argwhere(bad)
    if not hits.size:
        return ""
    index = tuple(int(i) for i in hits[0])
    where = f"at [{', '.join(map(str, index))}]" if index else "at []"
    return f"{where}: {float(values[index]):.4g}"


def _zeroed_below(node: Node, values: np.ndarray) -> dict[str, Any]:
    """For a quantize node with one fixed scale: the type it quantizes to, and the |x| below which x becomes 0
    (half the smallest step times the scale: round to nearest even sends the tie to 0)."""
    out = node.outputs[0] if node.outputs else None
    target = _TRT_QUANTIZED.get(node.op_type) or (out.dtype if out is not None else None)
    element = ELEMENTS.get(target or "")
    facts: dict[str, Any] = {"quantized_to": _long(target), "scale": None, "zeroed_below": None}
    if node.op_type not in QUANTIZERS or node.op_type == "TRT_FP4DynamicQuantize" or values.size != 1:
        return facts
    scale = float(values[0])
    facts["scale"] = scale
    if math.isfinite(scale) and scale > 0:
        step = element.smallest_subnormal if element is not None else 1.0  # an integer type's step is 1
        facts["zeroed_below"] = scale * step / 2
    return facts


# ---- scales computed from an activation ----------------------------------------------------------------------------

_MOVES = {"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Expand", "Transpose", "Flatten"}
# the input a reader divides by: x / scale, QuantizeLinear(x, scale), ModelOpt's FP8 quantizer
_DIVIDES_BY = {"Div": 1, "QuantizeLinear": 1, "TRT_FP8QuantizeLinear": 1, "TRT_INT4QuantizeLinear": 1}


def _through_moves(value: Value | None) -> Node | None:
    """The node that made a value, looking through Casts, reshapes and the like."""
    for _ in range(16):
        if value is None or value.producer is None:
            return None
        if value.producer.op_type not in _MOVES:
            return value.producer
        value = value.producer.input(0)
    return None


def _amax(value: Value | None) -> Node | None:
    """The ReduceMax of an Abs that made the value (through moves); None otherwise."""
    node = _through_moves(value)
    if node is None or node.op_type != "ReduceMax":
        return None
    inner = _through_moves(node.input(0))
    return node if inner is not None and inner.op_type == "Abs" else None


def _scale_of_amax(value: Value | None) -> tuple[Node, Node, float] | None:
    """(the node, the ReduceMax, k) where value is amax / k or amax * (1 / k), with only moves between."""
    maker = _through_moves(value)
    if maker is None or maker.op_type not in ("Div", "Mul"):
        return None
    orders = [(0, 1)] if maker.op_type == "Div" else [(0, 1), (1, 0)]
    for a, c in orders:
        amax, const = _amax(maker.input(a)), resolve_scalar(maker.input(c))
        if amax is not None and const is not None and const.value != 0 and math.isfinite(const.value):
            return maker, amax, const.value if maker.op_type == "Div" else 1 / const.value
    return None


def _dynamic_scale(node: Node) -> tuple[Node, Node, float] | None:
    """For a node dividing by (or quantizing with) amax / k, or multiplying by its reciprocal (k / amax, or a
    Reciprocal of it): (the node that makes the scale, the ReduceMax, k); None when anything else (a Max, Clip or
    Add: a floor) stands between."""
    index = _DIVIDES_BY.get(node.op_type)
    if index is not None:
        return _scale_of_amax(node.input(index))
    if node.op_type != "Mul":
        return None
    for value in node.inputs:
        maker = _through_moves(value)
        if maker is None:
            continue
        if maker.op_type == "Reciprocal":
            found = _scale_of_amax(maker.input(0))
            if found is not None:
                return found
        elif maker.op_type == "Div":  # k / amax
            amax, const = _amax(maker.input(1)), resolve_scalar(maker.input(0))
            if amax is not None and const is not None and const.value != 0 and math.isfinite(const.value):
                return maker, amax, const.value
    return None


def _dynamic_site(reader: Node, maker: Node, amax: Node, k: float, resolver: DtypeResolver) -> Site | None:
    dtype = resolver.of_node(maker)
    if dtype is None:
        return None
    scale = maker.outputs[0].name if maker.outputs else maker.name
    facts = {"op": maker.op_type, "scale_name": scale, "amax_node": amax.name, "amax_op": amax.op_type,
             "divisor": k, "reader": reader.name, "reader_op": reader.op_type,
             "inverse": reader.op_type == "Mul", **dtype_facts(dtype, resolver)}
    return Site("dynamic_scale", maker, facts, span=[amax, maker, reader])

