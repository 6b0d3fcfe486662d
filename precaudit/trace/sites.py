"""Turn what a traced run measured into sites with facts, for the PA9xx rules."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

from ..analysis.compute_dtype import ComputeDtype, DtypeResolver
from ..analysis.constants import is_constant
from ..analysis.sites.angle import angle_site
from ..analysis.sites.base import Site
from ..analysis.sites.facts import dtype_facts
from ..analysis.sites.integer_float import integer_site

# feeding_op and selected_by_where_only: one definition of "what feeds this" and "only a Where branch", shared
# with static mode so both modes judge a node alike
from ..analysis.sites.walks import feeding_op, selected_by_where_only
from ..dtypes import Format
from ..ir import Graph, Node, Value, implicit_inputs
from .formats import HeldFormats
from .measure import WATCHED_INPUT, Probes
from .stats import ValueStats

__all__ = ["first_nonfinite_site", "hazard_sites", "norm_sites", "op_sites", "silent_failure_sites", "value_sites"]

_CHAIN_SHOWN = 8  # nodes of the chain to the outputs printed before eliding the middle


def _held_dtype(value: Value, fmt: Format, resolver: DtypeResolver) -> ComputeDtype:
    dtype = resolver.of_value(value)
    if dtype is not None and dtype.fmt == fmt:
        return dtype
    return ComputeDtype(fmt, "made and read inside a --keep-fp32 block" if fmt.name == "fp32"
                        else f"the dtype node '{value.producer.name if value.producer else '?'}' computes in")


def value_sites(graph: Graph, resolver: DtypeResolver, stats: dict[int, ValueStats], samples: int) -> list[Site]:
    """One site per float value a node made: its range against its format, and the emulated run's damage."""
    sites = []
    for node in graph.nodes:
        inputs = [stats[id(v)] for v in node.inputs if v is not None and id(v) in stats]
        for value in node.outputs:
            s = stats.get(id(value))
            if s is None or s.elements == 0 or is_constant(value):
                continue  # constants (an eps cast to fp16) are the static rules' business
            facts = {"op": node.op_type, "value": value.name, "elements": s.elements, "samples": samples,
                     "absmax": s.absmax, "min_nonzero": s.min_nonzero if math.isfinite(s.min_nonzero) else None,
                     "overflow_fraction": s.fraction(s.overflow), "underflow_fraction": s.fraction(s.underflow),
                     "subnormal_fraction": s.fraction(s.subnormal), "nonfinite_fraction": s.fraction(s.nonfinite),
                     "ref_nonfinite_fraction": s.fraction(s.ref_nonfinite), "rel_error": s.rel_error,
                     "input_overflow_fraction": max((i.fraction(i.overflow) for i in inputs), default=0.0),
                     "input_underflow_fraction": max((i.fraction(i.underflow) for i in inputs), default=0.0),
                     "constant_input_overflows": _constant_overflows(node, s.fmt),
                     **dtype_facts(_held_dtype(value, s.fmt, resolver), resolver)}
            sites.append(Site("traced_value", node, facts))
    return sites


def _constant_overflows(node: Node, fmt: Format) -> bool:
    """A constant input already beyond the format (a finfo(float32).min attention mask): the overflow is the
    constant's, set when the model was written, not an activation that grew."""
    for value in node.inputs:
        if value is not None and is_constant(value):
            while not value.is_const:  # through the Cast/Expand/Reshape to the stored constant
                producer = value.producer
                assert producer is not None  # is_constant: moves all the way down to a stored constant
                value = producer.input(0)  # noqa: PLW2901 -- walks down to the constant it checks
                assert value is not None  # (the same)
            data = value.const()
            if data is not None and data.dtype.kind == "f" and data.size and \
                    _absmax_reaches(np.asarray(data), fmt.overflow_threshold):
                return True
    return False


# Per IEEE float dtype: the unsigned integer of its bits, and the bits of +inf (|x| above it is a NaN).
_BITS: dict[np.dtype, tuple[type[np.unsignedinteger], int]] = {
    np.dtype(np.float16): (np.uint16, 0x7C00), np.dtype(np.float32): (np.uint32, 0x7F800000),
    np.dtype(np.float64): (np.uint64, 0x7FF0000000000000)}
_CHUNK = 1 << 22


def _absmax_reaches(data: np.ndarray, threshold: float) -> bool:
    """Whether max |x| of a float constant is at least threshold; False where it holds a NaN (as max(max, -min),
    which a NaN makes NaN, said before).

    An IEEE float's magnitude orders as its bits without the sign, so the largest |x| is an integer max, a chunk
    at a time: numpy reduces integers with SIMD but float16 one element at a time, 20 times slower on a model's
    fp16 weights, which this reads once more after the run.
    """
    bits = _BITS.get(data.dtype)
    if bits is None or not data.flags.c_contiguous:  # max(max, -min) is max(|data|) without an |data| copy
        return max(float(data.max()), -float(data.min())) >= threshold
    uint, inf = bits
    flat = data.reshape(-1).view(uint)
    mask, top = uint(inf | (inf >> 1) | (inf - 1)), 0  # every bit but the sign
    for start in range(0, flat.size, _CHUNK):
        top = max(top, int(np.bitwise_and(flat[start:start + _CHUNK], mask).max()))
    if top > inf:
        return False
    return float(np.array(top, dtype=uint).view(data.dtype)) >= threshold


def norm_sites(probes: Probes, samples: int) -> list[Site]:
    """The static norm facts (eps as written and rounded) with the per-row variance the run observed."""
    sites = []
    for site, stats in probes.norms:
        observed = stats.summary(site.facts.get("eps"))
        if observed:
            sites.append(Site("traced_norm", site.node, {**site.facts, **observed, "samples": samples}))
    return sites


def op_sites(probes: Probes, resolver: DtypeResolver, samples: int, stats: dict[int, ValueStats]) -> list[Site]:
    """Exp, softmax, log, sqrt and division sites with what their sensitive input did."""
    sites = []
    for node, s in probes.ops:
        dtype = resolver.of_node(node)
        if s.elements == 0 or dtype is None:
            continue
        n = s.elements
        watched = node.input(WATCHED_INPUT[node.op_type])
        facts: dict[str, Any] = {
            "op": node.op_type, "input_op": feeding_op(node.input(0)), "in_norm_chain": id(node) in probes.claimed,
            "selected_by_where": selected_by_where_only(node), "samples": samples,
            "input_max": s.max, "input_min": s.min, "input_min_abs": s.min_abs,
            "zero_fraction": s.zero / n, "negative_fraction": s.negative / n, "ref_zero_fraction": s.ref_zero / n,
            "ref_negative_fraction": s.ref_negative / n,
            "output_nonfinite_fraction": s.output_nonfinite / n,
            "input_rel_error": _relative_error(stats.get(id(watched))),
            # its error then passed through that op, and was judged at its input already
            "input_from_sensitive_op": feeding_op(watched) in _SENSITIVE,
            **dtype_facts(dtype, resolver)}
        sites.append(Site("traced_op", node, facts))
    return sites


_SENSITIVE = {"Sqrt", "Div", "Reciprocal", "Log", "Pow"}


def hazard_sites(graph: Graph, resolver: DtypeResolver, stats: dict[int, ValueStats], samples: int) -> list[Site]:
    """The static angle and integer sites (the same recognition, so both modes agree on what an angle is) with what
    the run measured there: the largest angle and how far the emulated angle and its Sin/Cos were from the float32
    reference; the largest integer and how far the emulated one moved. Errors are absolute: a sine's scale is 1, an
    integer's step is 1."""
    sites = []
    for node in graph.nodes:
        if node.domain not in ("", "ai.onnx") or not node.outputs:
            continue
        if node.op_type in ("Sin", "Cos"):
            site = angle_site(node, resolver)
            angle, out = stats.get(id(node.input(0))), stats.get(id(node.outputs[0]))
            if site is None or angle is None or out is None or not angle.elements or angle.nonfinite:
                continue
            sites.append(Site("traced_angle", node, {**site.facts, "samples": samples, "angle_max": angle.absmax,
                                                     "angle_error": angle.max_error, "output_error": out.max_error},
                              span=site.span))
        elif node.op_type in ("Range", "CumSum", "Cast"):
            site = integer_site(node, resolver)
            made = stats.get(id(node.outputs[0]))
            if site is None or made is None or not made.elements or made.nonfinite:
                continue
            sites.append(Site("traced_integer", node, {**site.facts, "samples": samples, "int_max": made.absmax,
                                                       "int_error": made.max_error}))
    return sites


def _relative_error(s: ValueStats | None) -> float:
    """The emulated value's largest error against its own size; 0 where the reference is cancellation noise itself
    (its size then says nothing) or the emulated run is already inf/NaN (the other rules' business)."""
    if s is None or s.nonfinite or s.absmax <= 10 * s.noise_floor:
        return 0.0
    return s.rel_error


_DOMAIN_OPS = {"Log", "Sqrt", "Pow"}


def _outside_domain(node, s: ValueStats) -> bool:
    """A Log, Sqrt or Pow whose NaN the float reference has too: its input left the op's domain (the negative
    numbers synthesized N(0, 1) inputs hold, fed to a Log) in every dtype. That is the data's doing, not the
    dtype's. An inf the reference has too stays: exp(100) overflows float32 as well, 0/0 after an eps stored
    as 0.0 is the dtype's."""
    return node.op_type in _DOMAIN_OPS and s.nonfinite <= s.ref_nan


def first_nonfinite_site(graph: Graph, resolver: DtypeResolver, stats: dict[int, ValueStats],
                         samples: int) -> list[Site]:
    """The first node whose emulated output turns inf/NaN from finite inputs, and its chain to an output.

    Origins whose inf never reaches an output (an additive -inf mask that a softmax absorbs) come last.
    """
    bad = {vid for vid, s in stats.items() if s.nonfinite}
    if not bad:
        return []
    outputs = {id(v): v for v in graph.outputs}
    best: tuple | None = None
    for index, node in enumerate(graph.nodes):
        made = [v for v in node.outputs if id(v) in bad and not _outside_domain(node, stats[id(v)])]
        reads = [*node.inputs, *implicit_inputs(node)] if node.bodies else node.inputs  # bodies read by name too
        if not made or any(id(v) in bad for v in reads if v is not None and not v.is_const):
            continue
        chain, output = _chain_to_output(made[0], bad, outputs)
        rank = (output is None, index)
        if best is None or rank < best[0]:
            best = (rank, node, made[0], chain, output)
    if best is None:
        return []
    _, node, value, chain, output = best
    s = stats[id(value)]
    inputs = [stats[id(v)].absmax for v in node.inputs if v is not None and id(v) in stats]
    shown = chain if len(chain) <= _CHAIN_SHOWN else [*chain[:4], "...", *chain[-3:]]
    facts = {"op": node.op_type, "value": value.name, "samples": samples, "nonfinite_fraction": s.fraction(s.nonfinite),
             "ref_nonfinite_fraction": s.fraction(s.ref_nonfinite), "input_absmax": max(inputs, default=None),
             "chain": " → ".join(shown) + (f" → graph output '{output.name}'" if output is not None else ""),
             "chain_length": len(chain), "reaches_output": output is not None,
             "output": output.name if output is not None else "",
             **dtype_facts(_held_dtype(value, s.fmt, resolver), resolver)}
    return [Site("traced_first_nonfinite", node, facts)]


def silent_failure_sites(graph: Graph, resolver: DtypeResolver, stats: dict[int, ValueStats],
                         samples: int, formats: HeldFormats | None = None) -> list[Site]:
    """One site per graph output the emulated run leaves finite (no inf or NaN beyond the reference's), with how far
    it strays from the reference and the first value upstream that overflowed or went inf/NaN on the way: a
    statistic that saturated while the outputs stayed finite (whisper on WebGPU: |x - mean| 795 squared to 630,025,
    the variance +inf, every row 0 — and 0 inf, 0 NaN in the outputs). With `formats` (how the run reads each
    constant), a small constant read converted with values beyond the format counts too: a BatchNormalization
    variance of 9.79e7 in a Constant node, clamped to 65504 by the converter though the node is kept."""
    sites = []
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    for value in graph.outputs:
        s = stats.get(id(value))
        if s is None or not s.elements or s.nonfinite > s.ref_nonfinite or value.producer is None:
            continue
        cause = _first_damage_upstream(value, stats, order, formats)
        facts: dict = {"value": value.name, "op": value.producer.op_type, "samples": samples,
                       "rel_error": _relative_error(s), "max_error": s.max_error, "absmax": s.absmax,
                       "cause_node": None, "cause_op": None, "cause_value": None, "cause_overflow_fraction": 0.0,
                       "cause_nonfinite_fraction": 0.0,
                       **dtype_facts(_held_dtype(value, s.fmt, resolver), resolver)}
        if cause is not None:
            node, c, overflow, nonfinite = cause
            facts.update(cause_node=node.name, cause_op=node.op_type, cause_value=c.name,
                         cause_overflow_fraction=overflow, cause_nonfinite_fraction=nonfinite)
        sites.append(Site("traced_output", value.producer, facts))
    return sites


# (the node to name, the value, the fraction of it beyond the format's max, the fraction the run holds as inf/NaN)
_Damage = tuple[Node, Value, float, float]
_MAX_CONST_CAUSE = 1 << 16  # elements of a constant read for a cause: a norm's statistics, an eps, a scale


def _first_damage_upstream(output: Value, stats: dict[int, ValueStats], order: dict[int, int],
                           formats: HeldFormats | None = None) -> _Damage | None:
    """The earliest value (in graph order) upstream of output whose emulated run overflowed the format or turned
    inf/NaN where the reference did not; with formats, or a small constant a node on the way reads converted from
    numbers beyond the format (named by its Constant node, else by the reader)."""
    best: tuple[int, _Damage] | None = None
    todo, seen = [output], {id(output)}
    while todo:
        value = todo.pop()
        producer = value.producer
        if producer is None:
            continue
        s = stats.get(id(value))
        rank = order.get(id(producer), 0)
        if s is not None and (s.overflow or s.nonfinite > s.ref_nonfinite) and (best is None or rank < best[0]):
            best = (rank, (producer, value, s.fraction(s.overflow), s.fraction(max(0, s.nonfinite - s.ref_nonfinite))))
        for v in producer.inputs:
            if v is None or id(v) in seen:
                continue
            seen.add(id(v))
            if not v.is_const:
                todo.append(v)
            elif formats is not None and (best is None or rank < best[0]):
                found = _converted_beyond(v, producer, formats)
                best = (rank, found) if found is not None else best
    return best[1] if best is not None else None


def _converted_beyond(value: Value, reader: Node, formats: HeldFormats) -> _Damage | None:
    """A float32 constant `reader` reads converted (into a narrow format) that holds numbers beyond the format's
    max: clamped by the converter, else inf."""
    fmt = formats.of(value)
    if value.dtype != "fp32" or fmt is None or fmt.wide or (value.const_size or 0) > _MAX_CONST_CAUSE:
        return None
    converted, clamp = formats.const_read(value, reader)
    data = value.const() if converted else None
    if data is None or not data.size:
        return None
    beyond = int(np.count_nonzero(np.abs(data.astype(np.float64)) >= fmt.overflow_threshold))
    if not beyond:
        return None
    maker = value.producer if value.producer is not None and value.producer.op_type == "Constant" else reader
    fraction = beyond / data.size
    return maker, value, fraction, 0.0 if clamp is not None else fraction


def _chain_to_output(start: Value, bad: set[int], outputs: dict[int, Value]) -> tuple[list[str], Value | None]:
    """The shortest path of nodes from the value's producer to a graph output, through non-finite values only."""
    first = start.producer
    assert first is not None  # start is an output of the node whose inf/NaN it is
    queue = deque([(start, [first.name])])
    seen = {id(start)}
    fallback = [first.name]
    while queue:
        value, path = queue.popleft()
        if id(value) in outputs:
            return path, value
        for reader in value.consumers:
            user = reader
            while user.parent is not None:  # read inside an If/Loop/Scan body: it flows on through that node
                user = user.parent
            for out in user.outputs:
                if id(out) in bad and id(out) not in seen:
                    seen.add(id(out))
                    queue.append((out, [*path, user.name]))
                    fallback = fallback if len(fallback) >= len(path) + 1 else [*path, user.name]
    return fallback, None
