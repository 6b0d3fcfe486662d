"""Traced mode: run the model on inputs, emulate the target dtype op by op, and turn what happens into sites."""

from __future__ import annotations

from pathlib import Path

from ..analysis.compute_dtype import DtypeResolver
from ..analysis.sites import Site
from ..ir import Graph
from ..options import TraceOptions
from .emulator import Emulator
from .inputs import load_inputs, synthesize_inputs
from .measure import attach_probes
from .progress import progress_bar
from .sites import first_nonfinite_site, norm_sites, op_sites, value_sites

__all__ = ["traced_sites"]


def traced_sites(graph: Graph, resolver: DtypeResolver, options: TraceOptions) -> list[Site]:
    """Run every sample through the reference and the emulation, then one site per thing measured, in graph order."""
    emulator = Emulator(graph, resolver, engine=options.engine)
    probes = attach_probes(graph, resolver, emulator)
    # an .npz is one sample; synthesized inputs give --samples independent draws
    samples = 1 if options.inputs else max(1, options.samples)
    update, close = progress_bar(Path(graph.path).name, samples) if options.progress else (None, lambda: None)
    try:
        for i in range(samples):
            feeds = load_inputs(graph, options.inputs, options.dims) if options.inputs \
                else synthesize_inputs(graph, options.dims, options.seed + i)
            emulator.run(feeds, update)
    finally:
        close()
    sites = [*value_sites(graph, resolver, emulator.stats, samples), *norm_sites(probes, samples),
             *op_sites(probes, resolver, samples), *first_nonfinite_site(graph, resolver, emulator.stats, samples)]
    order = {id(node): i for i, node in enumerate(graph.nodes)}
    return sorted(sites, key=lambda s: order[id(s.node)])
