"""Fused normalization sites (ONNX and onnxruntime ops): the op's eps, where it adds it, and the dtype of its
statistics. Decomposed chains are analysis/decomposed.py's."""

from __future__ import annotations

import numpy as np

from ...dtypes import FORMATS
from ...errors import MissingFile
from ...ir import Graph, Node
from ..compute_dtype import ComputeDtype, DtypeResolver
from ..fused_norms import FUSED_NORMS, NormSpec
from .base import Site
from .facts import dtype_facts, eps_facts

__all__ = ["MAX_CHANNELS", "find_norm_sites"]


def find_norm_sites(graph: Graph, resolver: DtypeResolver) -> list[Site]:
    """A site for every fused normalization op (ONNX and onnxruntime), with its eps and statistics dtype."""
    sites = []
    for node in graph.nodes:
        spec = FUSED_NORMS.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))
        if spec is not None:
            site = _norm_site(node, spec, resolver)
            if site is not None:
                sites.append(site)
    return sites


def _norm_site(node: Node, spec: NormSpec, resolver: DtypeResolver) -> Site | None:
    dtype = _norm_dtype(node, spec, resolver)
    if dtype is None:
        return None
    if spec.fixed_eps is not None:
        eps, source = spec.fixed_eps, "fixed by the ONNX spec"
    elif spec.eps_attr is None:
        eps, source = None, "the op has no eps"
    elif spec.eps_attr in node.attrs:
        eps, source = float(node.attrs[spec.eps_attr]), f"attribute {spec.eps_attr}"
    else:
        eps, source = spec.eps_default, f"attribute {spec.eps_attr} absent: default {spec.eps_default:g}"
    # a fused kernel chooses its own accumulation; a runtime model may say it squares in a narrow dtype
    narrow = dtype.fact is not None and dtype.fmt.is_narrow
    facts = {"norm": _family(node, spec), "op": node.op_type, "eps_source": source, "eps_role": spec.eps_role,
             "keep_hint": node.op_type, "eps_placement": spec.placement, "missing_note": "",
             "stat_dtype": dtype.fmt.long_name if narrow else None,
             "stat_square_overflow": dtype.fmt.square_overflow if narrow else None,
             "stat_floor": _running_var_floor(node), **eps_facts(eps, dtype), **dtype_facts(dtype, resolver)}
    return Site("norm", node, facts)


MAX_CHANNELS = 65536  # running statistics are one number per channel: small enough to read (weight.py too)


def _running_var_floor(node: Node) -> float | None:
    """BatchNormalization in inference divides by sqrt(running_var + eps): the smallest running variance
    decides whether the eps matters at all (it does only for channels whose variance is about 0)."""
    var = node.input(4) if node.op_type == "BatchNormalization" else None
    if var is None or not var.is_const or (var.const_size or 0) > MAX_CHANNELS:
        return None
    try:
        data = var.const()
    except MissingFile:  # weights never downloaded: the static audit reads none it does not have
        return None
    return float(np.min(data)) if data is not None and data.size else None


def _family(node: Node, spec: NormSpec) -> str:
    """torch exports GroupNorm as Reshape → InstanceNormalization → Reshape: name it as the user wrote it."""
    x = node.input(0)
    if node.op_type == "InstanceNormalization" and x is not None:
        before = x.producer
        after = [c.op_type for c in node.outputs[0].consumers]
        if before is not None and before.op_type == "Reshape" and after == ["Reshape"]:
            return "GroupNorm"
    return spec.norm


def _norm_dtype(node: Node, spec: NormSpec, resolver: DtypeResolver) -> ComputeDtype | None:
    decided = resolver.statistics_by_runtime(node)  # the runtime's kernel, where the model knows it
    if decided is not None:
        return decided
    # a stash_type on an op whose spec has none comes from the torch frontend (PyTorch's float32 statistics)
    torch_stash = spec.stash_since is None and "stash_type" in node.attrs
    if torch_stash or (spec.stash_since is not None and (node.opset is None or node.opset >= spec.stash_since)):
        stash = node.attrs.get("stash_type")
        return resolver.of_stash(node, None if stash is None else int(stash), "")
    if spec.fp32_accumulate is not None and resolver.kept_by(node) is None:
        inner = resolver.of_node(node)
        if inner is not None and inner.fmt.name != "fp64":
            return ComputeDtype(FORMATS["fp32"], f"{node.op_type}: {spec.fp32_accumulate}")
    return resolver.of_node(node)
