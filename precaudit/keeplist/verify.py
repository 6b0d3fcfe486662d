"""Verify a keep-list by emulation: run the model with the list kept in float32, add the chain the trouble comes
from until every output is finite and within the tolerance, then try to drop each added entry again."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..deployment import Deployment
from ..ir import Graph, Node
from .chains import NormChains, error_entry, overflow_closure, producers, with_constant_nodes

__all__ = ["Run", "Verification", "emulate", "verify"]


@dataclass
class Run:
    """One emulation of the model with a set of nodes kept in float32, over every batch."""

    kept: int  # nodes kept
    finite: bool  # every output finite wherever the float32 reference is
    error: float  # the largest output error relative to that output's largest |value|
    first_nonfinite: Node | None = None  # where the first inf/NaN that reaches an output starts
    entry: Node | None = None  # where the worst output's error enters
    rel_error: dict[int, float] = field(default_factory=dict, repr=False)
    too_large: set[int] = field(default_factory=set, repr=False)  # values whose reference |x| passes the target
    absmax: dict[int, float] = field(default_factory=dict, repr=False)  # per value, the reference's largest |x|

    def ok(self, tolerance: float) -> bool:
        return self.finite and self.error <= tolerance


def emulate(graph: Graph, deployment: Deployment, kept: list[Node],
            batches: list[dict[str, np.ndarray]], engine: str, keep_io: bool = False, timeout: float | None = None) -> Run:
    """One run: the reference and the emulated target dtype, with `kept` (and keep_fp32) in float32, and the graph
    inputs float32 where keep_io (keep_io_types=True) and only kept nodes read them."""
    from ..trace import Emulator  # the numpy emulation loads only when a list is verified
    from ..trace.sites import first_nonfinite_site

    resolver = deployment.resolver(graph, keep_nodes=kept, keep_io=keep_io)
    emulator = Emulator(graph, resolver, engine=engine)
    emulator.limit_time(timeout)  # --timeout, per run
    for i, feeds in enumerate(batches):
        emulator.run(feeds, final=i == len(batches) - 1)  # the last batch keeps no weights for a next one
    stats = emulator.stats
    finite, error = True, 0.0
    for value in graph.outputs:
        s = stats.get(id(value))
        if s is None:
            continue
        if s.nonfinite > s.ref_nonfinite:
            finite = False
        error = max(error, s.rel_error if math.isfinite(s.rel_error) else math.inf)
    origin = first_nonfinite_site(graph, resolver, stats, len(batches)) if not finite else []
    rel = {vid: s.rel_error for vid, s in stats.items() if not s.nonfinite}
    absmax = {vid: s.absmax for vid, s in stats.items()}
    # values a narrow target holds overflow it; a block-scaled one holds them in float32 (its scales absorb range)
    limit = math.inf if deployment.fmt.blocked else deployment.fmt.overflow_threshold
    too_large = {vid for vid, top in absmax.items() if top >= limit}
    return Run(len(kept), finite, error, origin[0].node if origin else None, rel_error=rel, too_large=too_large,
               absmax=absmax)


@dataclass
class Added:
    """An entry the loop added: why, and its nodes."""

    reason: str
    nodes: list[Node]
    dropped: bool = False
    keep_io: bool = False  # the entry also keeps the graph inputs float32 (keep_io_types=True)


@dataclass
class Verification:
    runs: int = 0
    final: Run | None = None
    added: list[Added] = field(default_factory=list)
    stopped: str = ""  # why the loop gave up, when it did

    @property
    def keep_io(self) -> bool:
        """Whether the verified list needs the graph inputs and outputs kept float32."""
        return any(a.keep_io and not a.dropped for a in self.added)


def verify(graph: Graph, deployment: Deployment, static: list[Node],
           chains: NormChains, batches: list[dict[str, np.ndarray]], engine: str, tolerance: float,
           max_runs: int, progress: Callable[[str], None] | None = None, timeout: float | None = None) -> Verification:
    """Add what the first inf/NaN (else the largest error) comes from until the list verifies, then prune."""
    out = Verification()

    def run(nodes: list[Node], keep_io: bool) -> Run:
        out.runs += 1
        if progress is not None:
            progress(f"emulation run {out.runs}: {len(nodes)} nodes kept")
        return emulate(graph, deployment, nodes, batches, engine, keep_io, timeout)

    kept = _unique(static)
    current = run(kept, False)
    while not current.ok(tolerance):
        if out.runs >= max_runs:
            out.stopped = f"stopped after {max_runs} emulation runs (--max-runs)"
            break
        entry = _next_entry(current, kept, chains, tolerance)
        if entry is None and not out.keep_io:
            entry = _inputs_entry(graph, kept)
        if entry is None:
            out.stopped = _measured_stop(run, graph, current, tolerance)
            break
        # with the Constant nodes they read (not kept yet), which the converter converts otherwise
        held = {id(n) for n in kept} - {id(n) for n in entry.nodes}
        entry.nodes = [n for n in with_constant_nodes(entry.nodes, deployment.converter) if id(n) not in held]
        out.added.append(entry)
        kept = _unique([*kept, *entry.nodes])
        current = run(kept, out.keep_io)
    if current.ok(tolerance):
        for entry in list(out.added):
            if out.runs >= max_runs:
                break
            rest = [e for e in out.added if e is not entry and not e.dropped]
            without = _unique([*static, *(n for e in rest for n in e.nodes)])
            trial = run(without, any(e.keep_io for e in rest))
            if trial.ok(tolerance):
                entry.dropped, kept, current = True, without, trial
    out.final = current
    return out


def _measured_stop(run: Callable[[list[Node], bool], Run], graph: Graph, current: Run, tolerance: float) -> str:
    """Why the loop stops, measured: the model once more with every node and the graph inputs float32. Within
    the tolerance there, the error is the narrow dtype's and the loop could not place it; beyond it, what remains
    is not the narrow dtype's (a converter's constant clamp, a rounding the model itself does)."""
    every = run(list(graph.nodes), True)
    remaining = f"error {current.error:.3g}" if current.finite else "inf/NaN outputs"
    if every.ok(tolerance):
        return (f"nothing left to add: with every node, input and output kept in float32 the output error is "
                f"{every.error:.3g}, within the tolerance, so the remaining {remaining} is the narrow dtype's but no "
                "single chain carries it; keep more (--keep-fp32) or raise --tolerance")
    still = f"error is still {every.error:.3g}" if every.finite else "outputs are still inf/NaN"
    return (f"nothing left to add: with every node, input and output kept in float32 the output {still}: what "
            "remains is not the narrow dtype's (a constant the converter clamps, or rounding the model itself does)")


def _inputs_entry(graph: Graph, kept: list[Node]) -> Added | None:
    """The error enters with the graph inputs themselves: with keep_io_types=False the converter makes each float
    input float16, so int16-scale audio is rounded (to a spacing of 16 at 32767) before any kept node reads it.
    Keep the inputs float32 (keep_io_types=True) and every node that reads them."""
    floats = [v for v in graph.inputs if v.dtype in ("fp32", "fp64") and v.consumers]
    if not floats:
        return None
    held = {id(n) for n in kept}
    readers = _unique([c for v in floats for c in v.consumers])
    names = ", ".join(f"'{v.name}'" for v in floats[:3]) + (" and more" if len(floats) > 3 else "")
    return Added(f"what remains enters or leaves with the graph's float inputs ({names}) and outputs, which "
                 "keep_io_types=False makes narrow (an input rounded before any node reads it, an output past its "
                 "range): keep_io_types=True, and the inputs' readers kept",
                 [n for n in readers if id(n) not in held] or readers, keep_io=True)


def _next_entry(current: Run, kept: list[Node], chains: NormChains, tolerance: float) -> Added | None:
    """The chain to add: the first inf/NaN's overflow closure or norm chain, else where the largest error enters;
    widened to the producers of what is already kept when that is all kept."""
    held = {id(n) for n in kept}
    if not current.finite and current.first_nonfinite is not None:
        origin = current.first_nonfinite
        nodes = chains.of(origin) or overflow_closure(origin, current.too_large)
        why = f"the first inf/NaN starts at '{origin.name}' ({origin.op_type})"
    else:
        entry = error_entry(chains.graph, current.rel_error, tolerance)
        if entry is None:
            return None
        origin = entry
        nodes = chains.of(origin) or [origin]
        why = f"the output error ({current.error:.3g}) enters at '{origin.name}' ({origin.op_type})"
    fresh = [n for n in nodes if id(n) not in held]
    depth = 0
    while not fresh and depth < 4:  # all kept already: its inputs come in narrow; keep what makes them
        depth += 1
        nodes = _unique([p for n in nodes for p in producers(n)] + nodes)
        fresh = [n for n in nodes if id(n) not in held]
    if not fresh:
        return None
    return Added(why, fresh)


def _unique(nodes) -> list[Node]:
    seen: dict[int, Node] = {}
    for node in nodes:
        seen.setdefault(id(node), node)
    return list(seen.values())
