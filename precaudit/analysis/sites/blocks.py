"""Block sites: weights a block-scaled format quantizes block by block, with what that does to them."""

from __future__ import annotations

import dataclasses

import numpy as np

from ...dtypes import COMPUTED, FORMATS, Format
from ...ir import Graph, Node, Value, shown_origin
from ..compute_dtype import ComputeDtype, DtypeResolver
from ..constants import resolve_scalar
from ..quantized import GEMMS, BlockCounts, block_attr, gemm_axes
from .base import Site
from .facts import dtype_facts

__all__ = ["BLOCK_SITES", "find_block_weight_sites"]

BLOCK_SITES = ("block_weight",)


def find_block_weight_sites(graph: Graph, resolver: DtypeResolver, load) -> list[Site]:
    """A site per float weight quantized block by block: with --dtype mxfp8|mxfp4|nvfp4, those MatMul, Gemm and
    Conv read (blocks along the axis the product sums over; not the ones --keep-fp32 keeps), and in any model the
    weight of ModelOpt's TRT_FP4QDQ (NVFP4 along the last axis). load(value) reads a weight without keeping it."""
    sites = []
    target = resolver.target
    for node in graph.nodes:
        if node.op_type == "TRT_FP4QDQ" and node.domain == "trt":
            block = block_attr(node, 16)
            if block is None:
                continue
            fmt = dataclasses.replace(FORMATS["nvfp4"], block=block)
            reads = [(node.input(0), -1)]
            why = f"TRT_FP4QDQ '{node.name}' quantizes it to NVFP4 in blocks of {block}"
        elif target.blocked and node.op_type in GEMMS and node.domain in ("", "ai.onnx") \
                and resolver.kept_by(node) is None:
            fmt = target
            ranks = [len(v.shape) if v is not None and v.shape is not None else 2 for v in node.inputs]
            reads = [(v, axis) for v, axis in zip(node.inputs, gemm_axes(node, ranks)) if axis is not None]
            why = f"--dtype {target.name}: {node.op_type} reads its inputs in {target.long_name} blocks of {target.block}"
        else:
            continue
        for value, axis in reads:
            site = _site(node, value, axis, fmt, why, resolver, load)
            if site is not None:
                sites.append(site)
    return sites


def _site(node: Node, value: Value | None, axis: int, fmt: Format, why: str, resolver: DtypeResolver,
          load) -> Site | None:
    if value is None or not value.is_const or value.dtype not in COMPUTED or resolve_scalar(value) is not None:
        return None
    data = load(value)
    if data is None or np.asarray(data).ndim == 0 or not np.asarray(data).size:
        return None
    counts = BlockCounts(fmt)
    axis %= np.asarray(data).ndim
    counts.add(np.asarray(data, dtype=np.float32), axis, value.name)
    del data
    facts = {"op": node.op_type, "name": value.name, "source": shown_origin(value),
             "consumer": node.name, "axis": axis, **counts.facts(), **dtype_facts(ComputeDtype(fmt, why), resolver)}
    return Site("block_weight", node, facts)
