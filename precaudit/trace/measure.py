"""Hooks that measure norm statistics and the inputs of exp, log, sqrt and division while a traced run goes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..analysis.compute_dtype import DtypeResolver
from ..analysis.constants import resolve_scalar
from ..analysis.decomposed import find_decomposed_norms
from ..analysis.signs import SignAnalysis
from ..analysis.sites.base import Site
from ..analysis.sites.norm import find_norm_sites
from ..ir import Graph, Node
from .emulator import Emulator
from .stats import InputStats, VarianceStats

__all__ = ["Probes", "attach_probes"]

# Ops whose input decides whether they blow up, and which input that is.
WATCHED_INPUT = {"Exp": 0, "Softmax": 0, "LogSoftmax": 0, "Log": 0, "Sqrt": 0, "Reciprocal": 0, "Div": 1}


@dataclass
class Probes:
    """Everything measured besides per-value stats, keyed by the node it belongs to."""

    norms: list[tuple[Site, VarianceStats]] = field(default_factory=list)
    ops: list[tuple[Node, InputStats]] = field(default_factory=list)
    claimed: set[int] = field(default_factory=set)  # nodes a recognized norm chain accounts for
    signs: SignAnalysis = field(default_factory=SignAnalysis)


def attach_probes(graph: Graph, resolver: DtypeResolver, emulator: Emulator) -> Probes:
    """Find the static norm sites (so both modes agree on what a norm is) and hook a measurement onto each."""
    chains = find_decomposed_norms(graph, resolver)
    probes = Probes(claimed=set(chains.claimed), signs=SignAnalysis(resolver))
    static = find_norm_sites(graph, resolver) + chains.sites
    for site in static:
        hook = _variance_hook(site, emulator)
        if hook is not None:
            stats = VarianceStats()
            emulator.hooks.setdefault(id(hook[0]), []).append(hook[1](stats))
            probes.norms.append((site, stats))
    for node in graph.nodes:
        index = WATCHED_INPUT.get(node.op_type)
        if index is not None and node.domain in ("", "ai.onnx") and node.input(index) is not None:
            op_stats = InputStats()
            emulator.hooks.setdefault(id(node), []).append(_input_hook(op_stats, index))
            probes.ops.append((node, op_stats))
    return probes


def _input_hook(stats: InputStats, index: int):
    def hook(ref_args, emu_args, ref_outs, emu_outs):
        if ref_args[index].dtype.kind == "f":
            stats.add(ref_args[index], emu_args[index], emu_outs[0])
    return hook


def _variance_hook(site: Site, emulator: Emulator):
    """(node to hook, factory of the hook) for the norms whose per-row statistic traced mode can observe."""
    node = site.node
    if node.op_type in ("LayerNormalization", "RMSNormalization") and node.domain in ("", "ai.onnx"):
        rms = node.op_type == "RMSNormalization"
        round_stat = emulator.plan.stat_rounding(node)

        def fused(stats):
            def hook(ref_args, emu_args, ref_outs, emu_outs):
                x_ref, x_emu = ref_args[0], emu_args[0]
                axes = tuple(range(int(node.attr("axis", -1)) % x_ref.ndim, x_ref.ndim))
                stats.add(_row_variance(x_ref, axes, rms, lambda a: a), _row_variance(x_emu, axes, rms, round_stat))
            return hook
        return node, fused
    placement = site.facts.get("eps_placement")
    if placement == "inside_sqrt" and node.op_type == "Add":
        index = next((i for i in (0, 1) if resolve_scalar(node.input(i)) is None), None)
    elif placement == "missing" and node.op_type in ("Sqrt", "Pow"):
        index = 0
    else:
        return None
    if index is None:
        return None

    def statistic(stats):
        def hook(ref_args, emu_args, ref_outs, emu_outs):
            stats.add(ref_args[index], emu_args[index])
        return hook
    return node, statistic


def _row_variance(x: np.ndarray, axes: tuple, rms: bool, r) -> np.ndarray:
    """Each row's variance (mean square for RMSNorm), rounded step by step as the kernel computes it."""
    if rms:
        return r(np.mean(r(x * x), axis=axes))
    centred = r(x - r(np.mean(x, axis=axes, keepdims=True)))
    return r(np.mean(r(centred * centred), axis=axes))
