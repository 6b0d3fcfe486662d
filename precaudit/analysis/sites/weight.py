"""Weight sites: float32 weights (initializers, Constant tensors) measured against the dtype a conversion gives
them."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...dtypes import Format, format_of_onnx_type
from ...ir import Graph, Node, Value
from ..compute_dtype import ComputeDtype, DtypeResolver
from ..constants import resolve_fill, resolve_scalar
from .base import Site
from .blocks import find_block_weight_sites
from .facts import dtype_facts
from .walks import feeds_softmax

__all__ = ["find_weight_sites", "weight_stats"]


_WEIGHT_CHUNK = 1 << 20  # elements measured at a time: the temporaries stay at a few MB, whatever the tensor


def find_weight_sites(graph: Graph, resolver: DtypeResolver) -> list[Site]:
    """A site for every float32 weight (initializer or Constant tensor) that a conversion would change the dtype of.

    Reads the tensors one at a time and keeps only their numbers, so memory stays bounded by the largest one.
    A tensor is converted to the narrowest dtype any of its readers computes in (a Cast reader: the dtype it casts
    to); one read only by --keep-fp32 nodes, or by float32 islands, stays float32 and is skipped. Single-valued
    constants are the constant sites' (PA209). Weights a block-scaled format quantizes come as block_weight sites
    (blocks.py).
    """
    sites, seen = [], set()
    for node in graph.nodes:
        for value in node.inputs:
            if value is None or id(value) in seen or not value.is_const or value.dtype != "fp32":
                continue
            seen.add(id(value))
            converted = _converted_by(value, resolver)
            if converted is None or resolve_scalar(value) is not None or _mask_fill(value):
                continue
            dtype, reader = converted
            data = _weight_data(value)
            if data is None or data.dtype.kind != "f":
                continue
            facts = {"op": reader.op_type, "name": value.name, "source": value.const_origin or f"constant '{value.name}'",
                     "consumer": reader.name, **weight_stats(data, dtype.fmt), **dtype_facts(dtype, resolver)}
            del data  # before the next tensor is read
            sites.append(Site("weight", reader, facts))
    return sites + find_block_weight_sites(graph, resolver, _weight_data)


def _mask_fill(value: Value) -> bool:
    """A 0-or-fill mask tensor that reaches a Softmax: the constant sites' (PA209, PA215), as a scalar fill is."""
    return any(feeds_softmax(reader) for reader in value.consumers) and resolve_fill(value) is not None


def _converted_by(value: Value, resolver: DtypeResolver) -> tuple[ComputeDtype, Node] | None:
    """The narrowest dtype a reader of the value computes in, and that reader; None when every reader keeps float32."""
    best = None
    for reader in value.consumers:
        if reader.op_type == "Cast":
            fmt = format_of_onnx_type(reader.attr("to", 0))
            dtype = ComputeDtype(fmt, f"Cast to {fmt.long_name} at node '{reader.name}'") if fmt is not None else None
        else:
            dtype = resolver.of_node(reader)
        if dtype is None or dtype.fmt.wide:
            continue
        if best is None or _narrowness(dtype.fmt) < _narrowness(best[0].fmt):
            best = (dtype, reader)
    return best


def _narrowness(fmt: Format) -> tuple[float, float]:
    return fmt.max, -fmt.ulp_at_1


def _weight_data(value: Value) -> np.ndarray | None:
    """The tensor's data: the copy traced mode already loaded, else read afresh and not kept (Value.const() would
    cache every weight of the model)."""
    cached = value._const_cache
    if cached is not None:
        return cached
    assert value.const_loader is not None  # asked only of constants
    return value.const_loader()


def weight_stats(data: np.ndarray, fmt: Format) -> dict[str, Any]:
    """What rounding a float array into fmt does to it, measured a chunk at a time.

    Round to nearest even: |w| up to half the smallest subnormal becomes 0 (the tie goes to the even 0), |w| below
    the smallest normal less half a subnormal step becomes subnormal, a finite |w| from max + half an ulp becomes
    inf (NaN in formats without inf). ±inf and NaN are already what they are (a mask table's -inf row): no
    overflow, and not the largest |w| either, except that a format without inf (float8_e4m3fn) makes inf NaN.
    """
    zero_up_to = fmt.smallest_subnormal / 2
    normal_from = fmt.smallest_normal - fmt.smallest_subnormal / 2
    flat = data.reshape(-1)
    absmax, nonzero, overflow, underflow, subnormal = 0.0, 0, 0, 0, 0
    for start in range(0, flat.size, _WEIGHT_CHUNK):
        a = np.abs(flat[start:start + _WEIGHT_CHUNK], dtype=np.float64)
        if not np.isfinite(a).all():
            if not fmt.has_inf:
                overflow += int(np.count_nonzero(np.isinf(a)))
            a = np.where(np.isfinite(a), a, 0.0)
        nonzero += int(np.count_nonzero(a > 0))
        tiny = a <= zero_up_to
        underflow += int(np.count_nonzero(tiny)) - int(np.count_nonzero(a == 0))
        subnormal += int(np.count_nonzero(a < normal_from)) - int(np.count_nonzero(tiny))
        absmax = max(absmax, float(a.max(initial=0.0)))
        overflow += int(np.count_nonzero(a >= fmt.overflow_threshold))
    return {"elements": int(flat.size), "nonzero": nonzero, "absmax": absmax, "overflow_count": overflow,
            "underflow_count": underflow, "underflow_fraction": underflow / nonzero if nonzero else 0.0,
            "subnormal_fraction": subnormal / nonzero if nonzero else 0.0}
