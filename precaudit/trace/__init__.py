"""Traced mode: run the model on inputs, emulate the target dtype op by op, and turn what happens into sites."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from ..analysis.compute_dtype import DtypeResolver
from ..analysis.sites.base import Site
from ..errors import InputError
from ..ir import Graph
from ..options import TraceOptions
from .blocks import attach_block_probes, block_sites
from .emulator import Emulator
from .inputs import iter_batches
from .limits import check_loop_trips
from .measure import attach_probes
from .profile import TraceProfile, build_profile
from .progress import progress_bar
from .sites import first_nonfinite_site, hazard_sites, norm_sites, op_sites, silent_failure_sites, value_sites

__all__ = ["TraceRun", "traced_sites"]


@dataclass
class TraceRun:
    """What a traced run fed the model and what ran it: a finding from traced mode holds only for these inputs."""

    inputs: list[str]  # the .npz files as given, one batch each; empty when synthesized
    seed: int | None  # of the first synthesized sample
    samples: int
    source: str = "user"  # "user" (the .npz files) or "synthesized": what every traced number here rests on
    guessed_dims: dict[str, int] = field(default_factory=dict)  # symbolic dims precaudit chose, synthesized only
    masks: list[str] = field(default_factory=list)  # inputs synthesized as masks in every state, row by row
    shapes: dict[str, list[int]] = field(default_factory=dict)  # per graph input, in the first sample
    engine: str = ""  # onnxruntime or numpy, as --trace-engine resolved
    nodes: dict[str, int] = field(default_factory=dict)  # nodes each engine ran, in the last sample
    # what was measured, for the HTML report's charts (the JSON report carries the findings, not every value)
    profile: TraceProfile | None = field(default=None, repr=False, compare=False)

    def record(self) -> dict:
        """What the JSON report says about the run: every field but the profile."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "profile"}

    @property
    def synthesized(self) -> bool:
        return self.source == "synthesized"

    def describe(self) -> str:
        given = f"inputs from {', '.join(self.inputs)}" if self.inputs else \
            f"{self.samples} synthesized sample{'s' * (self.samples != 1)} (seed {self.seed})"
        if self.guessed_dims:
            given += " with guessed dims " + ", ".join(f"{k}={v}" for k, v in self.guessed_dims.items())
        shapes = ", ".join(f"{name} {tuple(shape)}" for name, shape in self.shapes.items())
        ran = ", ".join(f"{n} nodes on {engine}" for engine, n in self.nodes.items() if n)
        return f"{given}; {shapes}; {ran or 'no nodes'}"


def traced_sites(graph: Graph, resolver: DtypeResolver, options: TraceOptions) -> tuple[list[Site], TraceRun]:
    """Run every sample through the reference and the emulation, then one site per thing measured, in graph order."""
    check_loop_trips(graph)
    emulator = Emulator(graph, resolver, engine=options.engine)
    probes = attach_probes(graph, resolver, emulator)
    blocks = attach_block_probes(graph, emulator.plan, emulator.hooks)
    emulator.limit_time(options.timeout)
    # each .npz is one sample; synthesized inputs give --samples independent draws
    source, batches = iter_batches(graph, options)
    samples = source.samples
    run = TraceRun(list(source.files), source.seed, samples, source.kind, dict(source.guessed), list(source.masks),
                   engine=emulator.engine)
    update, close = progress_bar(Path(graph.path).name, samples) if options.progress else (None, lambda: None)
    try:
        for i, feeds in enumerate(batches):
            if i == 0:
                run.shapes = {name: list(np.shape(array)) for name, array in feeds.items()}
            emulator.run(feeds, update, final=i == samples - 1)  # the last sample keeps no weights
    except InputError as exc:
        # a node that cannot run on inputs whose symbolic dims precaudit chose: most likely a size the model
        # cannot take (an image side its strides do not divide), which the user sets
        if source.guessed and exc.problem.startswith("traced mode cannot run node"):
            raise InputError(exc.file, exc.problem.rstrip() + source.shape_hint(), exc.line) from exc
        raise
    finally:
        close()
    sites = [*value_sites(graph, resolver, emulator.stats, samples), *norm_sites(probes, samples),
             *op_sites(probes, resolver, samples, emulator.stats), *hazard_sites(graph, resolver, emulator.stats, samples),
             *first_nonfinite_site(graph, resolver, emulator.stats, samples),
             *silent_failure_sites(graph, resolver, emulator.stats, samples, emulator.plan.formats),
             *block_sites(blocks, resolver, emulator.stats, samples)]
    order = {id(node): i for i, node in enumerate(graph.nodes)}
    run.nodes = dict(emulator.ran_on)
    run.profile = build_profile(graph, emulator.stats, sites)
    return sorted(sites, key=lambda s: order[id(s.node)]), run
