"""One onnxruntime session for a stretch of the plan's steps: the float32 reference and the emulation side by side.

The emulated copy of each node computes in float32, and each float output goes through a round-trip Cast into
the format it is held in (Cast to float16, Cast back to float32). Weights (constants over EMBED_BYTES) are not in
the session but its inputs, fed when it runs (ort_weights.py); a weight the emulation reads rounded is rounded by a
Cast pair just before its reader in a one-batch run (or the last batch), and fed rounded beside the weight when a
batch follows, so that the hold budget keeps the rounded copy with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..converters import Clamp
from ..ir import Graph, Value
from .fallback import as_reference
from .ort_bodies import BodyRewriter
from .ort_eligible import const_is_shared, measured_values, shared_values
from .ort_nodes import DOMAINS, ROUND_TO, float32_attrs, inference_inputs, reference_array, round_trip
from .ort_weights import WeightFeeder
from .plan import Plan, Runner, Step

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = ["EMBED_BYTES", "Segment", "SegmentBuilder"]

_DEFAULT_OPSET = {"": 17, "com.microsoft": 1}
# constants up to this many bytes (as the reference holds them) are in the session; larger ones are fed when it runs
EMBED_BYTES = 64 * 2 ** 10


@dataclass
class Segment:
    """A session that runs steps start to end (exclusive), and what it is fed and returns."""

    start: int
    end: int
    session: ort.InferenceSession
    ref_feeds: list[tuple[str, int]]  # (graph input name, value id) fed from the reference env
    emu_feeds: list[tuple[str, int]]  # the same from the emulated env
    fetch: list[tuple[str, int, bool]]  # (output name, value id, emulated?)
    # quiet: a failed run falls back to numpy, which says what went wrong in one line
    run_options: ort.RunOptions | None = None
    weights: list[tuple[str, Value]] = field(default_factory=list)  # (input name, constant) fed at each run
    # (weight's input name, clamped copy's input name, clamp): a weight the --converter's clamp changes, fed clamped
    # beside itself for the emulated run
    clamps: list[tuple[str, str, Clamp]] = field(default_factory=list)
    # (rounded copy's input name, weight's input name, narrow type, clamp or None): a weight the emulated run reads
    # rounded, fed rounded (and kept with the weights for the next sample) rather than rounded in the session each run
    rounded: list[tuple[str, str, int, Clamp | None]] = field(default_factory=list)
    held: dict[str, np.ndarray] | None = None  # the weights, kept for the next sample; None: read at each run


class SegmentBuilder:
    """Builds the sessions of a plan's segments; what every segment shares is worked out once, here."""

    def __init__(self, plan: Plan, runner: Runner, feeder: WeightFeeder):
        self.plan = plan
        self.runner = runner
        self.feeder = feeder
        self.bodies = BodyRewriter(plan)
        self.shared = shared_values(plan)
        self.outputs = {id(v) for v in plan.graph.outputs}
        # every value some measurement reads: its producer's segment must return it (a hooked LayerNorm's input
        # may come from a Transpose, whose own numbers are not measured)
        self.measured = measured_values(plan)
        self.opsets = _opset_imports(plan.graph)

    def build(self, start: int, end: int, emu: dict, ref: dict, run_options: ort.RunOptions) -> Segment:
        """The segment of steps start to end; raises where onnxruntime refuses it."""
        draft = _Draft(self, self.plan.steps[start:end], emu, ref)
        for step in self.plan.steps[start:end]:
            draft.add_step(step, end)
        session = _session(draft.model(self.opsets))
        return Segment(start, end, session, draft.ref_feeds, draft.emu_feeds, draft.fetch, run_options, draft.weights,
                       clamps=draft.clamps, rounded=draft.rounded)

    def name(self, v: Value, emulated: bool) -> str:
        """A value's name in a segment: the emulated copy's gets the emu:: prefix, unless both runs share it."""
        if not emulated or (not v.is_const and id(v) in self.shared):
            return v.name
        return f"emu::{v.name}"


class _Draft:
    """One segment's model as it is built: its nodes, inputs and what it is fed and returns."""

    def __init__(self, builder: SegmentBuilder, steps: list[Step], emu: dict, ref: dict):
        self.builder, self.plan, self.emu, self.ref = builder, builder.plan, emu, ref
        self.reference = builder.runner.reference
        self.made_here = {vid for s in steps for vid, _ in s.outputs}
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: dict[str, onnx.ValueInfoProto] = {}
        self.ref_feeds: list[tuple[str, int]] = []
        self.emu_feeds: list[tuple[str, int]] = []
        self.consts: dict[str, np.ndarray] = {}  # small constants, embedded in the session
        self.weights: list[tuple[str, Value]] = []  # large ones, fed when it runs
        self.clamps: list[tuple[str, str, Clamp]] = []  # weights fed clamped too (a --converter's clamp)
        self.rounded: list[tuple[str, str, int, Clamp | None]] = []  # weights fed rounded (see Segment.rounded)
        self.fetch: list[tuple[str, int, bool]] = []
        # a sample follows: weights are rounded outside the session, so that their rounded copies can be kept with
        # them; a one-sample run rounds each in the session just before its reader, one at a time
        self.round_outside = not builder.runner.final
        self.weight_names: set[str] = set()
        self.as_held: set[int] = set()  # weights stored in the format they are held in: their rounding changes nothing
        self.rounded_consts: set[int] = set()

    def add_step(self, step: Step, end: int) -> None:
        """A step's node for each run that computes it, and the outputs the segment returns."""
        node, builder = step.node, self.builder
        attrs = float32_attrs(node)
        shared = all(vid in builder.shared for vid, _ in step.outputs)
        if self.reference or shared:  # without a reference (a benchmark of the emulation alone) only shared nodes
            # (a shape read off a float value reads the emulated one when there is no reference)
            ref_ins = inference_inputs(node, [self.arg(v, not self.reference) for v in node.inputs])
            bodies = builder.bodies.bodies(node, {v.name: self.arg(v, False) for v in step.implicit}, emulated=False)
            self.nodes.append(helper.make_node(node.op_type, ref_ins, [o.name for o in node.outputs],
                                               domain=node.domain, **attrs, **bodies))
        if not shared:
            emu_ins = inference_inputs(node, [self.arg(v, True, w) for v, w in zip(node.inputs, step.const_reads)])
            bodies = builder.bodies.bodies(node, {v.name: self.arg(v, True) for v in step.implicit}, emulated=True)
            raw = ["" if not o.name else f"raw::{o.name}" if fmt is not None and fmt.name in ROUND_TO
                   else builder.name(o, True) for o, fmt in zip(node.outputs, step.rounds)]
            self.nodes.append(helper.make_node(node.op_type, emu_ins, raw, domain=node.domain, **{**attrs, **bodies}))
            for o, fmt, r in zip(node.outputs, step.rounds, raw):
                if r and fmt is not None and fmt.name in ROUND_TO:
                    self.nodes.extend(round_trip(r, builder.name(o, True), ROUND_TO[fmt.name]))
        for o in node.outputs:
            vid = id(o)
            if not o.name:
                continue
            later = self.plan.last_read.get(vid, -1) >= end or vid in builder.outputs
            if later or (vid in builder.measured and self.reference):
                if self.reference or vid in builder.shared:
                    self.fetch.append((o.name, vid, False))
                if vid not in builder.shared:
                    self.fetch.append((builder.name(o, True), vid, True))

    def arg(self, v: Value | None, emulated: bool, read: int = 0) -> str:
        """The name a node of the segment reads v by, in one of the runs (read: the step's const_reads entry)."""
        if v is None:
            return ""
        if v.is_const:
            return self._const(v, emulated, read)
        if id(v) in self.made_here:
            return self.builder.name(v, emulated)
        return self._feed(v, emulated and id(v) not in self.builder.shared)

    def _feed(self, v: Value, emulated: bool) -> str:
        name = self.builder.name(v, emulated)
        if name not in self.inputs:
            # a shared value made on numpy without a reference run is in the emulated env only
            array = np.asarray(self.emu[id(v)] if emulated else self.ref.get(id(v), self.emu.get(id(v))))
            self.inputs[name] = helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), None)
            (self.emu_feeds if emulated else self.ref_feeds).append((name, id(v)))
        return name

    def _const(self, v: Value, emulated: bool, read: int) -> str:
        if v.name not in self.consts and v.name not in self.weight_names:
            self._place(v)
        # read as stored: the reference's copy (a converter leaves the constant float32 for this reader)
        if not emulated or read or const_is_shared(self.plan, v) or id(v) in self.as_held:
            return v.name
        name = self.builder.name(v, True)
        if id(v) not in self.rounded_consts:
            self.rounded_consts.add(id(v))
            self._round(v, name)
        return name

    def _place(self, v: Value) -> None:
        """A constant in the session if small, else among the weights fed when it runs."""
        data = np.asarray(v.const())  # (external data is mapped, not read: only its dtype and shape are used)
        ref_dtype = as_reference(np.empty(0, data.dtype)).dtype
        if data.size * ref_dtype.itemsize <= EMBED_BYTES:
            self.consts[v.name] = reference_array(data)
        else:  # a weight: an input, read when the segment runs
            self.weight_names.add(v.name)
            self.inputs[v.name] = helper.make_tensor_value_info(v.name, helper.np_dtype_to_tensor_dtype(ref_dtype),
                                                                data.shape)
            self.weights.append((v.name, v))
            if self.plan.formats.stored_as_held(v, data):
                self.as_held.add(id(v))

    def _round(self, v: Value, name: str) -> None:
        """The emulated copy of a constant, as name: rounded by a Cast pair, folded once where the constant is in
        the session, at each run for a weight (or fed rounded, when a sample follows); clamped first where the
        --converter clamps it."""
        source, clamp = v.name, self.plan.const_clamps.get(id(v))
        held = self.plan.held(v)
        assert held is not None  # not shared: it is held in a narrow format
        if self.round_outside and v.name in self.weight_names:
            self._input_like(v.name, name)  # (a float32 weight: only those are rounded)
            self.rounded.append((name, v.name, ROUND_TO[held.name], clamp))
            return
        if clamp is not None and v.name in self.consts:
            source = f"clamp::{v.name}"
            self.consts[source] = clamp.array(self.consts[v.name])
        elif clamp is not None and self.builder.feeder.changed_by(v, clamp):
            source = f"clamp::{v.name}"
            self._input_like(v.name, source)  # (a float32 weight: only float32 ones are converted)
            self.clamps.append((v.name, source, clamp))
        self.nodes.extend(round_trip(source, name, ROUND_TO[held.name]))

    def _input_like(self, weight: str, name: str) -> None:
        self.inputs[name] = onnx.ValueInfoProto()
        self.inputs[name].CopyFrom(self.inputs[weight])
        self.inputs[name].name = name

    def model(self, opsets: dict[str, int]) -> onnx.ModelProto:
        # shape inference reads small constants (axes, shapes) from the model
        initializers = [numpy_helper.from_array(array, name) for name, array in self.consts.items()]
        graph = helper.make_graph(self.nodes, "precaudit_segment", list(self.inputs.values()),
                                  [onnx.ValueInfoProto(name=name) for name, _, _ in self.fetch], initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
        model.ir_version = max(8, helper.find_min_ir_version_for(model.opset_import, ignore_unknown=True))
        return model


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    # one arena for every session: memory peaks at the largest segment, not at the sum of them all
    _shared_arena(ort)
    options.add_session_config_entry("session.use_env_allocators", "1")
    # nodes in the order given (the Cast pair that rounds a weight just before its reader), not the default
    # order, which runs every node whose inputs are ready first: all of a segment's rounded weights alive at once
    if hasattr(ort, "ExecutionOrder"):
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    # a session's threads spin after its run; the next segment's session would have to run beside them
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


_ARENA: list = []


def _shared_arena(ort) -> None:
    """Register one CPU arena with onnxruntime's environment, once per process."""
    if not _ARENA:
        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, -1, -1, -1))
        _ARENA.append(info)


def _opset_imports(graph: Graph) -> dict[str, int]:
    opsets = dict(_DEFAULT_OPSET)
    seen: dict[str, int] = {}
    for node in graph.nodes:
        domain = DOMAINS.get(node.domain)
        if domain is not None and node.opset is not None:
            seen[domain] = max(seen.get(domain, 0), node.opset)
    opsets.update(seen)
    return opsets
