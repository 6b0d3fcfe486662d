"""Constant sites: small float constants (scalars, masks' fill values) as the op that reads them holds them."""

from __future__ import annotations

from typing import Any

from ...dtypes import FORMATS, classify, round_to_format
from ...ir import Graph
from ..compute_dtype import DtypeResolver
from ..constants import is_constant, resolve_fill, resolve_scalar
from .base import Site
from .facts import dtype_facts
from .walks import feeds_softmax

__all__ = ["find_constant_sites"]


_UNASKED = object()


def find_constant_sites(graph: Graph, resolver: DtypeResolver) -> list[Site]:
    """Small float constants (up to 64 values: scalars, masks' fill values) as the first op that uses them
    holds them: a finfo(float32).min becomes -inf in fp16, a 1e-30 becomes 0."""
    sites, seen = [], set()
    for node in graph.nodes:
        if node.op_type in ("Cast", "CastLike", "Identity", "Shape", "Constant"):
            continue
        dtype: Any = _UNASKED  # the node's dtype, asked at its first float constant (most nodes have none)
        to_softmax: bool | None = None  # whether the node feeds a Softmax, asked where it matters
        for value in node.inputs:
            if value is None or value.dtype not in FORMATS:
                continue  # an int64 Slice end of 2**63 - 1 is no float constant
            const = resolve_scalar(value)
            if const is None and is_constant(value) and id(value) not in seen:
                # a mask tensor of 0 and one fill (a causal mask the dynamo exporter folded) is that fill, used
                # where a mask is: as TorchScript's Where(mask, scores, fill) gives it
                if to_softmax is None:
                    to_softmax = feeds_softmax(node)
                const = resolve_fill(value) if to_softmax else None
            if const is None or id(value) in seen or const.value == 0:
                continue
            if dtype is _UNASKED:
                dtype = resolver.of_node(node)
            if dtype is None:
                break
            seen.add(id(value))
            converted = dtype.constant(const.value, const.source)
            facts = {"op": node.op_type, "value": const.value, "value_converted": converted,
                     "converted_by": dtype.clamp.by if converted != const.value else "",
                     "value_rounded": round_to_format(converted, dtype.fmt),
                     "value_class": classify(converted, dtype.fmt), "source": const.source, "consumer": node.name,
                     "mask_fill": feeds_softmax(node) if to_softmax is None else to_softmax,
                     **dtype_facts(dtype, resolver)}
            sites.append(Site("constant", node, facts))
    return sites
