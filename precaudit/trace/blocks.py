"""Traced block sites: what a block-scaled format does to the activations it quantizes, counted while the run goes.

With --dtype mxfp8|mxfp4|nvfp4 the activations MatMul, Gemm and Conv multiply are quantized block by block before
the kernel reads them (spec.py); in any model, ModelOpt's TRT_FP4DynamicQuantize and TRT_MXFP8DynamicQuantize
quantize theirs. Each such input gets a probe that counts, sample by sample, its zeroed and saturated values and
its block scales (analysis/quantized.BlockCounts, the static weights' count).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..analysis.compute_dtype import ComputeDtype, DtypeResolver
from ..analysis.constants import is_constant
from ..analysis.quantized import BlockCounts, block_attr, gemm_axes
from ..analysis.sites.base import Site
from ..analysis.sites.facts import dtype_facts
from ..dtypes import FORMATS, Format
from ..ir import Graph, Node
from .plan import Plan
from .stats import ValueStats

__all__ = ["BlockProbe", "attach_block_probes", "block_sites"]

# ModelOpt's dynamic quantizers: the format, its default block, and the input holding the global scale (None: MX)
_DYNAMIC = {"TRT_FP4DynamicQuantize": ("nvfp4", 16, 1), "TRT_MXFP8DynamicQuantize": ("mxfp8", 32, None)}


@dataclass
class BlockProbe:
    """One quantized activation: the node that reads it, which input, and what the samples did to it."""

    node: Node
    index: int
    counts: BlockCounts
    reason: str  # why it is quantized in that format, as the finding prints it
    global_input: int | None = None  # the input holding NVFP4's global scale; None: computed from each sample
    axis: int | None = None  # the axis its blocks run along (set at the first sample)


def attach_block_probes(graph: Graph, plan: Plan, hooks: dict[int, list]) -> list[BlockProbe]:
    """A probe per activation a block-scaled format quantizes, hooked onto its reader (hooks: keyed by id(node))."""
    probes = []
    for step in plan.steps:
        node = step.node
        dynamic = _DYNAMIC.get(node.op_type) if node.domain == "trt" else None
        if dynamic is not None:
            name, default, global_input = dynamic
            block = block_attr(node, default)
            if block is None:  # the kernel refuses it, in one line
                continue
            fmt = dataclasses.replace(FORMATS[name], block=block)
            reads = [(0, fmt, f"{node.op_type} '{node.name}' quantizes it to {fmt.long_name} in blocks of {block}")]
        elif step.spec.blocks is not None:
            fmt, global_input = step.spec.blocks, None
            why = f"--dtype {fmt.name}: {node.op_type} reads its inputs in {fmt.long_name} blocks of {fmt.block}"
            reads = [(i, fmt, why) for i, v in enumerate(node.inputs[:2]) if v is not None and not is_constant(v)]
        else:
            continue
        for index, fmt, why in reads:
            probe = BlockProbe(node, index, BlockCounts(fmt), why, global_input)
            hooks.setdefault(id(node), []).append(_hook(probe))
            probes.append(probe)
    return probes


def _hook(probe: BlockProbe):
    node = probe.node

    def hook(ref_args, emu_args, ref_outs, emu_outs):
        data = emu_args[probe.index]
        if data is None or np.asarray(data).dtype.kind != "f" or not np.size(data):
            return
        if probe.axis is None:
            probe.axis = _axis(node, probe.index, emu_args)
        global_scale = None
        if probe.global_input is not None and emu_args[probe.global_input] is not None:
            global_scale = float(np.asarray(emu_args[probe.global_input], np.float32).reshape(-1)[0])
        source = node.input(probe.index)
        probe.counts.add(np.asarray(data, np.float32), probe.axis, source.name if source is not None else "x",
                         global_scale)
    return hook


def _axis(node: Node, index: int, args: list) -> int:
    ndim = np.ndim(args[index])
    if node.op_type in _DYNAMIC:
        return int(node.attr("axis", -1)) % max(ndim, 1)
    axis = gemm_axes(node, [np.ndim(a) if a is not None else 0 for a in args])[index]
    return (axis or 0) % max(ndim, 1)


def block_sites(probes: list[BlockProbe], resolver: DtypeResolver, stats: dict[int, ValueStats],
                samples: int) -> list[Site]:
    """A traced_blocks site per probe that saw data: its counts, and the error of its reader's output."""
    sites = []
    for probe in probes:
        if not probe.counts.elements:
            continue
        node, value = probe.node, probe.node.input(probe.index)
        name = value.name if value is not None else ""
        out = stats.get(id(node.outputs[0])) if node.outputs else None
        fmt: Format = probe.counts.fmt
        facts = {"op": node.op_type, "value": name, "name": name, "source": f"activation '{name}'",
                 "consumer": node.name, "samples": samples, "axis": probe.axis,
                 "output_rel_error": out.rel_error if out is not None and not out.nonfinite else None,
                 **probe.counts.facts(), **dtype_facts(ComputeDtype(fmt, probe.reason), resolver)}
        sites.append(Site("traced_blocks", node, facts))
    return sites
