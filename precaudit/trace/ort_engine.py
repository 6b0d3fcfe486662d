"""Run stretches of the graph on onnxruntime: the float32 reference and the emulation side by side in one session.

The emulated copy of each node computes in float32, and each float output goes through a round-trip Cast into
the format it is held in (Cast to float16, Cast back to float32). Every op therefore sees inputs that hold
values of the format and leaves a value of the format: the semantics of the numpy kernels, at onnxruntime's
speed. onnxruntime's own float16 kernels are never used, since they keep chains of ops in float32 and hide
overflow; only its Cast rounds, and it rounds float16 and bfloat16 exactly as ml_dtypes does (tested).

A segment is a run of consecutive nodes. Its session returns every value the measurements read, so it holds
them all at once; segments are sized from the bytes the previous ones returned, so memory stays near a fixed
budget whatever the model. The values a segment returned are measured (numpy, stats.py) on a second thread while
the next segment runs, one segment behind at most. Nodes onnxruntime cannot emulate faithfully (fp8, statistics
rounded inside a fused norm, unknown domains), and nodes onnxruntime refuses, run on the numpy kernels instead.

Weights (constants over _EMBED_BYTES) are not in the session: they are its inputs, read from the model (memory-mapped
external data) when the segment runs and dropped when it is done, unless the hold budget keeps them for the next
sample (Runner.may_hold). onnxruntime reads inputs where they are, while it copies initializers (even ones handed
over in memory) and prepacks MatMul weights into yet another copy. So a segment holds each of its weights once, in
float32: a float32 weight as the file's mapped pages, a float16 one widened from them by a one-Cast session into an
array precaudit frees (in the segment's session the Cast would leave its float32 copies in onnxruntime's arena for
the rest of the run). The emulation reads that same array where the weight is stored in the format it is held in (an
fp16 weight in an fp16 run). Elsewhere, in a one-batch run (or the last batch), a Cast pair rounds it in the session
just before its reader; when a batch follows, a Cast-pair session rounds it outside into an array fed beside the
weight, which the hold budget keeps with it: onnxruntime rounding every weight again in every batch cost a third of
the emulation's time (85M float32 weights of BERT-base). Segments are also sized by the weights they read
(_WEIGHT_BUDGET, rounded copies included), so a one-batch run of a 7B-parameter model holds about half a layer's
weights at a time, never the model's. A weight several segments read (tied embeddings) is read again by each.

If/Loop/Scan bodies go into the session too, rewritten the same way for the emulated copy (every name they
define gets the emu:: prefix, every float output inside is rounded); the outer values a body reads by name
are fed to the session like any other input.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generator, Literal, cast

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..analysis.constants import is_constant
from ..converters import Clamp
from ..dtypes import FORMATS, Format
from ..errors import InputError
from ..ir import Node, Value
from .fallback import as_reference
from .meter import reads_inputs
from .plan import Plan, Runner, Step
from .rounding import round_into
from .spec import ComputeSpec

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

    import onnxruntime as ort

__all__ = ["OrtSegments", "onnxruntime_available"]

# Formats a Cast pair rounds into; fp8 stays on numpy (onnxruntime's Cast saturates by default, and needs opset 19).
_ROUND_TO = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
_NARROW_FORMAT: dict[int, Format] = {TensorProto.FLOAT16: FORMATS["fp16"], TensorProto.BFLOAT16: FORMATS["bf16"]}
_HELD_AS_IS = {"fp32", "fp64"}
_NARROW = {TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ,
           TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ}
_DOMAINS = {"": "", "ai.onnx": "", "com.microsoft": "com.microsoft"}
# Ops whose output size comes from these inputs' values: onnxruntime would allocate whatever they ask (8 GB for a
# Range to 2**31 read from an int64 input), so where those values come from the graph's input data (not from shapes,
# which existing tensors bound) they run on numpy, which checks the size against traced mode's budget first
# (limits.made_elements)
_SIZED_BY = {"ConstantOfShape": (0,), "Expand": (1,), "Tile": (1,), "Range": (0, 1, 2), "OneHot": (1,), "Pad": (1,)}
_DEFAULT_OPSET = {"": 17, "com.microsoft": 1}
_EMBED_BYTES = 64 * 2 ** 10
# bytes a segment may return, reference and emulation together (two segments' values are alive at once: one being
# measured, the next one running); values measured sooner after they are made are also quicker to read again
_BUDGET = 64 * 2 ** 20
_WEIGHT_BUDGET = 512 * 2 ** 20  # bytes of weights a segment may read, as its runs hold them (float32, and rounded)
_FIRST_SEGMENT = 32  # nodes, before any size is known
_MIN_SEGMENT, _MAX_SEGMENT = 16, 2048


def onnxruntime_available() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class _Segment:
    start: int
    end: int
    session: "ort.InferenceSession"
    ref_feeds: list[tuple[str, int]]  # (graph input name, value id) fed from the reference env
    emu_feeds: list[tuple[str, int]]  # the same from the emulated env
    fetch: list[tuple[str, int, bool]]  # (output name, value id, emulated?)
    # quiet: a failed run falls back to numpy, which says what went wrong in one line
    run_options: "ort.RunOptions | None" = None
    weights: list[tuple[str, Value]] = field(default_factory=list)  # (input name, constant) fed at each run
    # (weight's input name, clamped copy's input name, clamp): a weight the --converter's clamp changes, fed clamped
    # beside itself for the emulated run
    clamps: list[tuple[str, str, Clamp]] = field(default_factory=list)
    # (rounded copy's input name, weight's input name, narrow type, clamp or None): a weight the emulated run reads
    # rounded, fed rounded (and kept with the weights for the next sample) rather than rounded in the session each run
    rounded: list[tuple[str, str, int, Clamp | None]] = field(default_factory=list)
    held: dict[str, np.ndarray] | None = None  # the weights, kept for the next sample; None: read at each run


class OrtSegments:
    """Drives a plan's steps through onnxruntime sessions where it can, for the run it serves; returns None where it
    cannot (the run then takes the step on numpy)."""

    def __init__(self, plan: Plan, runner: Runner):
        self.plan = plan
        self.runner = runner
        steps = plan.steps
        self.refusals: dict[int, str] = {}  # node id -> why onnxruntime does not run it (said if numpy cannot either)
        self.eligible = [self._eligible(s) for s in steps]
        self._segments: dict[int, _Segment | None] = {}  # by first step; None where numpy runs that step
        self._bytes_per_step = 1.0  # returned by the last segment run, reference and emulation together
        self._last_size = 0  # nodes in the last segment built
        self._shared = self._shared_values()
        self._outputs = {id(v) for v in plan.graph.outputs}
        # every value some measurement reads: its producer's segment must return it (a hooked LayerNorm's input
        # may come from a Transpose, whose own numbers are not measured)
        self._measured = self._measured_values()
        self._opsets = self._opset_imports()
        # a one-Cast session, made when the first float16 weight is fed
        self._widener: "ort.InferenceSession | Literal[False] | None" = None
        # per narrow type, a Cast-pair session that rounds weights
        self._rounders: dict[int, "ort.InferenceSession | Literal[False]"] = {}
        # a segment's values are measured on a second thread while the next segment runs on onnxruntime
        self._worker: "ThreadPoolExecutor | None" = None
        self._pending: "Future[None] | None" = None
        self._clamp_changes: dict[int, bool] = {}  # per weight under a --converter clamp: does the clamp change it
        # one RunOptions for every segment's runs, so one timer per sample can stop whichever is running (--timeout)
        self._run_options: "ort.RunOptions | None" = None
        self._stopper: _Stopper | None = None

    # ---- running -------------------------------------------------------------------------------------------

    def run_from(self, i: int, emu: dict, ref: dict) -> int | None:
        """Run and measure the segment starting at step i; the step after it, or None to run step i on numpy."""
        if not self.eligible[i]:
            return None
        if i in self._segments:
            segment = self._segments[i]
        else:
            segment = self._segments[i] = self._build(i, emu, ref)
            if segment is not None:
                self._last_size = segment.end - segment.start
        if segment is None:
            return None
        weights = segment.held if segment.held is not None else self._weights(segment)
        try:
            # (np.asarray: a numpy kernel may have given a numpy scalar, which onnxruntime does not take)
            outs = segment.session.run([name for name, _, _ in segment.fetch],
                                       {**{n: np.asarray(ref.get(vid, emu.get(vid))) for n, vid in segment.ref_feeds},
                                        **{n: np.asarray(emu[vid]) for n, vid in segment.emu_feeds}, **weights},
                                       segment.run_options)
        except Exception as exc:
            if self._stopper is not None and self._stopper.stopped:
                self.runner.check_time(self.plan.steps[segment.start].node)  # past the deadline: it raises
            # onnxruntime refused these inputs; numpy runs the segment now and from now on (a real input error
            # is then reported by the numpy kernels, in one line)
            self._segments[i] = None
            for k in range(segment.start, segment.end):
                self.eligible[k] = False
                self.refusals.setdefault(id(self.plan.steps[k].node), f"onnxruntime: {_first_line(exc)}")
            return None
        if self.runner.final:  # no sample follows: the session and its weights go now, not at the end of the run
            del self._segments[i]
        elif segment.held is None and weights and self.runner.may_hold(_nbytes(weights)):
            segment.held = weights
        del weights
        start, end, fetch = segment.start, segment.end, segment.fetch
        del segment
        returned = 0
        for (_, vid, emulated), array in zip(fetch, outs):
            (emu if emulated else ref)[vid] = array
            returned += array.nbytes
        del outs  # each value now lives in the environment only, until its last reader frees it
        self._bytes_per_step = max(1.0, returned / (end - start))
        self.wait()  # the segment before is measured; this one is measured while the next one runs
        if self.runner.reference:
            if self._worker is None:
                from concurrent.futures import ThreadPoolExecutor

                self._worker = ThreadPoolExecutor(1, thread_name_prefix="precaudit-measure")
            self._pending = self._worker.submit(self._measure_steps, start, end, emu, ref)
        else:
            self._measure_steps(start, end, emu, ref)
        return end

    def stop_at(self, deadline: float | None) -> None:
        """For the sample about to run: a timer that stops whichever session is running (RunOptions.terminate)
        when the deadline passes, since a Loop inside a session runs for as long as its trip count says."""
        if deadline is not None:
            self._stopper = _Stopper(max(0.0, deadline - time.monotonic()), self._options())
            self._stopper.start()

    def unstop(self) -> None:
        """After the sample: the timer cancelled, and the sessions free to run the next one."""
        if self._stopper is not None:
            self._stopper.cancel()
            self._stopper = None
            self._options().terminate = False

    def _options(self) -> "ort.RunOptions":
        if self._run_options is None:
            import onnxruntime as ort

            self._run_options = ort.RunOptions()
            self._run_options.log_severity_level = 4
        return self._run_options

    def _measure_steps(self, start: int, end: int, emu: dict, ref: dict) -> None:
        with np.errstate(all="ignore"):  # (errstate is per thread) inf and NaN are what traced mode looks for
            for k in range(start, end):
                self._measure_step(self.plan.steps[k], emu, ref)

    def wait(self) -> None:
        """Until the segment being measured on the second thread is measured (its error, if any, raised here)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def release(self) -> None:
        """Drop every session and the weights kept with them (after the last sample), and the measuring thread."""
        self._segments = {i: None for i, segment in self._segments.items() if segment is None}
        if self._worker is not None:
            self._worker.shutdown()
            self._worker = None

    def _weights(self, segment: _Segment) -> dict[str, np.ndarray]:
        """The segment's weights as its session reads them, read from the model now, one at a time: in the
        reference's dtype (float32 for narrow floats), anything else as it is. External data is memory-mapped, so a
        float32 weight is handed over as the file's pages, and a float16 one is widened straight from them."""
        feeds = {}
        clamp: Clamp | None
        for name, value in segment.weights:
            data = np.asarray(value.const())
            feeds[name] = self._widen(data) if data.dtype == np.float16 else _contiguous(as_reference(data))
            del data  # (its mapping goes with it)
        for name, clamped, clamp in segment.clamps:
            feeds[clamped] = clamp.array(feeds[name])
        for name, source, narrow, clamp in segment.rounded:
            feeds[name] = self._round(clamp.array(feeds[source]) if clamp is not None else feeds[source], narrow)
        return feeds

    def _round(self, data: np.ndarray, narrow: int) -> np.ndarray:
        """A float32 weight rounded into a narrow type and back, by onnxruntime's Cast pair (what the session would
        do), into an array precaudit owns."""
        session = self._rounders.get(narrow)
        if session is None:
            session = self._rounders[narrow] = _caster([(TensorProto.FLOAT, narrow), (narrow, TensorProto.FLOAT)])
        out = np.empty(data.shape, np.float32)
        if session is False or data.size == 0:
            np.copyto(out, round_into(data, _NARROW_FORMAT[narrow]))
            return out
        binding = session.io_binding()
        binding.bind_cpu_input("x", _contiguous(data))
        binding.bind_output("y", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
        session.run_with_iobinding(binding)
        return out

    def _changed_by(self, v: Value, clamp: Clamp) -> bool:
        """Whether the clamp changes any of a weight's numbers (read once, a few million at a time)."""
        known = self._clamp_changes.get(id(v))
        if known is None:
            flat = np.asarray(v.const()).reshape(-1)
            known = False
            for start in range(0, flat.size, 1 << 22):
                a = np.abs(flat[start:start + (1 << 22)].astype(np.float32))
                if ((a > 0) & (a < clamp.min_positive)).any() or ((a > clamp.max_finite) & np.isfinite(a)).any():
                    known = True
                    break
            del flat
            self._clamp_changes[id(v)] = known
        return known

    def _widen(self, data: np.ndarray) -> np.ndarray:
        """float16 → float32 (exact) by onnxruntime's Cast, into an array precaudit owns: 5x numpy's astype, and the
        float32 copy is freed with the segment, not kept in onnxruntime's arena for the rest of the run."""
        if self._widener is None:
            self._widener = _caster([(TensorProto.FLOAT16, TensorProto.FLOAT)])
        out = np.empty(data.shape, np.float32)
        if self._widener is False or data.size == 0:
            np.copyto(out, data)
            return out
        binding = self._widener.io_binding()
        binding.bind_cpu_input("x", _contiguous(data))
        binding.bind_output("y", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
        self._widener.run_with_iobinding(binding)
        return out

    def _measure_step(self, step: Step, emu: dict, ref: dict) -> None:
        runner = self.runner
        for (vid, _) in step.outputs:  # a shared value is returned once: both runs hold the same numbers
            if vid in ref and vid not in emu:
                emu[vid] = ref[vid]
        if runner.reference:
            # only hooks and the elementwise noise floor read a node's inputs; the weights stay unrounded here
            reads_args = reads_inputs(step)
            ref_args = [_get(v, ref, runner, 1) for v in step.inputs] if reads_args else []
            emu_args = [_get(v, emu, runner, w) for v, w in zip(step.inputs, step.const_reads)] if reads_args else []
            runner.measure(step, ref_args, emu_args, [ref.get(vid) for vid, _ in step.outputs],
                           [emu.get(vid) for vid, _ in step.outputs])
        runner.free(step, emu, ref)

    # ---- which steps, which values -------------------------------------------------------------------------

    def _eligible(self, step: Step) -> bool:
        reason = self._refusal(step.node, step.rounds, step.spec)
        if reason is not None:
            self.refusals[id(step.node)] = reason
        return reason is None

    def _refusal(self, node: Node, rounds: list, spec: ComputeSpec) -> str | None:
        """Why this node cannot be emulated faithfully on onnxruntime; None when it can."""
        plan = self.plan
        if node.domain not in _DOMAINS:
            return f"node '{node.name}' is in domain '{node.domain}', which onnxruntime does not run"
        sized = _SIZED_BY.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if sized and _sized_by_data(node, sized):
            return (f"node '{node.name}' ({node.op_type}) makes a tensor as large as the input data says: numpy "
                    f"runs it, checking the size against traced mode's budget first")
        if spec.accumulate is not None:
            return f"node '{node.name}' rounds its statistics into its stash_type, which runs on numpy only"
        formats = [fmt for fmt in rounds if fmt is not None]
        formats += [plan.held(v) for v in node.inputs if v is not None and v.is_const and plan.held(v) is not None]
        narrow = next((fmt for fmt in formats if fmt.name not in _ROUND_TO and fmt.name not in _HELD_AS_IS), None)
        if narrow is not None:
            return f"node '{node.name}' rounds into {narrow.name}, which runs on numpy only"
        return None

    def _shared_values(self) -> set[int]:
        """Values both runs hold alike: integer inputs and what integer-only nodes make of them (shape arithmetic)."""
        plan = self.plan
        shared = {id(v) for v in plan.graph.inputs if plan.graph_input_formats[id(v)] is None}
        for step in plan.steps:
            node = step.node
            floats_out = any(fmt is not None for _, fmt in step.outputs)
            if floats_out or node.domain not in _DOMAINS or node.bodies:  # a body may read floats by name
                continue
            # a Shape is shared only when its input is: a shape computed from data (NonZero, Compress) can differ
            if all(v is None or self._is_shared(v, shared) for v in node.inputs):
                shared.update(vid for vid, _ in step.outputs)
        return shared

    def _is_shared(self, v: Value, shared: set[int]) -> bool:
        if v.is_const:
            return self._const_is_shared(v)
        return id(v) in shared

    def _const_is_shared(self, v: Value) -> bool:
        fmt = self.plan.held(v)
        return fmt is None or fmt.name in _HELD_AS_IS

    def _measured_values(self) -> set[int]:
        """The values the measurements read: float outputs, and the inputs and outputs of nodes whose measuring
        reads their inputs (hooked ones, Add/Sub). A rearranged output reuses its input's sample instead."""
        plan = self.plan
        made_by_step = {vid for s in plan.steps for vid, fmt in s.outputs if fmt is not None}
        needed: set[int] = set()
        for step in plan.steps:  # (run() has attached the hooks by the time this engine is made)
            for vid, fmt in step.outputs:
                if fmt is not None and not (step.rearranges is not None and step.rearranges in made_by_step):
                    needed.add(vid)
            if reads_inputs(step):
                needed.update(id(v) for v in step.inputs if v is not None and not v.is_const)
                needed.update(vid for vid, _ in step.outputs)
        return needed

    # ---- building a segment --------------------------------------------------------------------------------

    def _segment_end(self, i: int) -> int:
        """Where the segment starting at step i ends: about _BUDGET bytes returned, judged from the segments so far.

        A segment may at most double the last one: the first nodes (embeddings, say) can return far fewer bytes
        per node than the blocks after them, and one oversized guess would hold the whole model's values at once.
        """
        steps = len(self.plan.steps)
        size = _FIRST_SEGMENT
        if self._last_size:
            size = int(min(_MAX_SEGMENT, max(_MIN_SEGMENT, min(2 * self._last_size, _BUDGET // self._bytes_per_step))))
        end, weights, seen = i, 0, set()
        while end < steps and end - i < size and self.eligible[end]:
            step = self.plan.steps[end]
            for v in [*step.inputs, *step.implicit]:
                if v is not None and v.is_const and id(v) not in seen:
                    seen.add(id(v))
                    weights += self._weight_bytes(v)
            if weights > _WEIGHT_BUDGET and end > i:  # this step's weights start the next segment
                break
            end += 1
        return end

    def _weight_bytes(self, v: Value) -> int:
        """What a constant costs a segment that feeds it, judged from its size and dtype (nothing is read)."""
        size = v.const_size
        if size is None or size * 4 <= _EMBED_BYTES:
            return 0
        fmt = self.plan.held(v)
        rounded = fmt is not None and fmt.name not in _HELD_AS_IS and v.dtype != fmt.name
        return size * (8 if v.dtype == "fp64" else 4) * (2 if rounded else 1)

    def _build(self, i: int, emu: dict, ref: dict) -> _Segment | None:
        end = self._segment_end(i)
        while True:
            try:
                return self._build_range(i, end, emu, ref)
            except InputError:
                raise
            except Exception as exc:
                # onnxruntime refused a node in here: halve the stretch until the node it refuses stands alone,
                # which then runs on numpy (one refused node must not send a whole segment there)
                if end - i <= 1:
                    self.eligible[i] = False
                    self.refusals[id(self.plan.steps[i].node)] = _first_line(exc)
                    return None
                end = i + (end - i) // 2

    def _build_range(self, start: int, end: int, emu: dict, ref: dict) -> _Segment:
        import onnxruntime as ort

        plan, runner = self.plan, self.runner
        steps = plan.steps[start:end]
        made_here = {vid for s in steps for vid, _ in s.outputs}
        nodes: list[onnx.NodeProto] = []
        inputs: dict[str, onnx.ValueInfoProto] = {}
        ref_feeds: list[tuple[str, int]] = []
        emu_feeds: list[tuple[str, int]] = []
        consts: dict[str, np.ndarray] = {}  # small constants, embedded in the session
        weights: list[tuple[str, Value]] = []  # large ones, fed when it runs
        clamps: list[tuple[str, str, Clamp]] = []  # weights fed clamped too (a --converter's clamp)
        rounded: list[tuple[str, str, int, Clamp | None]] = []  # weights fed rounded (see _Segment.rounded)
        # a sample follows: weights are rounded outside the session, so that their rounded copies can be kept with
        # them; a one-sample run rounds each in the session just before its reader, one at a time
        round_outside = not runner.final
        weight_names: set[str] = set()
        as_held: set[int] = set()  # weights stored in the format they are held in: their rounding changes nothing
        rounded_consts: set[int] = set()

        def feed(v: Value, emulated: bool) -> str:
            name = self._name(v, emulated)
            if name not in inputs:
                # a shared value made on numpy without a reference run is in the emulated env only
                array = np.asarray(emu[id(v)] if emulated else ref.get(id(v), emu.get(id(v))))
                inputs[name] = helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype),
                                                             None)
                (emu_feeds if emulated else ref_feeds).append((name, id(v)))
            return name

        def const(v: Value, emulated: bool, read: int) -> str:
            if v.name not in consts and v.name not in weight_names:
                data = np.asarray(v.const())  # (external data is mapped, not read: only its dtype and shape are used)
                ref_dtype = as_reference(np.empty(0, data.dtype)).dtype
                if data.size * ref_dtype.itemsize <= _EMBED_BYTES:
                    consts[v.name] = _reference_array(data)
                else:  # a weight: an input, read when the segment runs
                    weight_names.add(v.name)
                    inputs[v.name] = helper.make_tensor_value_info(
                        v.name, helper.np_dtype_to_tensor_dtype(ref_dtype), data.shape)
                    weights.append((v.name, v))
                    if plan.formats.stored_as_held(v, data):
                        as_held.add(id(v))
                del data
            # read as stored: the reference's copy (a converter leaves the constant float32 for this reader)
            if not emulated or read or self._const_is_shared(v) or id(v) in as_held:
                return v.name
            name = self._name(v, True)
            # rounded by a Cast pair: folded once where the constant is in the session, at each run for a weight;
            # clamped first where the --converter clamps it
            if id(v) not in rounded_consts:
                rounded_consts.add(id(v))
                source, clamp = v.name, plan.const_clamps.get(id(v))
                held = plan.held(v)
                assert held is not None  # not shared: it is held in a narrow format
                if round_outside and v.name in weight_names:
                    inputs[name] = onnx.ValueInfoProto()
                    inputs[name].CopyFrom(inputs[v.name])  # (a float32 weight: only those are rounded)
                    inputs[name].name = name
                    rounded.append((name, v.name, _ROUND_TO[held.name], clamp))
                    return name
                if clamp is not None and v.name in consts:
                    source = f"clamp::{v.name}"
                    consts[source] = clamp.array(consts[v.name])
                elif clamp is not None and self._changed_by(v, clamp):
                    source = f"clamp::{v.name}"
                    inputs[source] = onnx.ValueInfoProto()
                    inputs[source].CopyFrom(inputs[v.name])  # (a float32 weight: only float32 ones are converted)
                    inputs[source].name = source
                    clamps.append((v.name, source, clamp))
                nodes.extend(_round_trip(source, name, _ROUND_TO[held.name]))
            return name

        def arg(v: Value | None, emulated: bool, read: int = 0) -> str:
            if v is None:
                return ""
            if v.is_const:
                return const(v, emulated, read)
            if id(v) in made_here:
                return self._name(v, emulated)
            return feed(v, emulated and id(v) not in self._shared)

        fetch: list[tuple[str, int, bool]] = []
        for step in steps:
            node = step.node
            attrs = _float32_attrs(node)
            shared = all(vid in self._shared for vid, _ in step.outputs)
            if runner.reference or shared:  # without a reference (a benchmark of the emulation alone) only shared nodes
                # (a shape read off a float value reads the emulated one when there is no reference)
                ref_ins = _inference_inputs(node, [arg(v, not runner.reference) for v in node.inputs])
                bodies = self._bodies(node, {v.name: arg(v, False) for v in step.implicit}, emulated=False)
                nodes.append(helper.make_node(node.op_type, ref_ins, [o.name for o in node.outputs],
                                              domain=node.domain, **attrs, **bodies))
            if not shared:
                emu_ins = _inference_inputs(node, [arg(v, True, w) for v, w in zip(node.inputs, step.const_reads)])
                bodies = self._bodies(node, {v.name: arg(v, True) for v in step.implicit}, emulated=True)
                attrs = {**attrs, **bodies}
                raw = ["" if not o.name else f"raw::{o.name}" if fmt is not None and fmt.name in _ROUND_TO
                       else self._name(o, True) for o, fmt in zip(node.outputs, step.rounds)]
                nodes.append(helper.make_node(node.op_type, emu_ins, raw, domain=node.domain, **attrs))
                for o, fmt, r in zip(node.outputs, step.rounds, raw):
                    if r and fmt is not None and fmt.name in _ROUND_TO:
                        nodes.extend(_round_trip(r, self._name(o, True), _ROUND_TO[fmt.name]))
            for o in node.outputs:
                vid = id(o)
                if not o.name:
                    continue
                later = plan.last_read.get(vid, -1) >= end or vid in self._outputs
                if later or (vid in self._measured and runner.reference):
                    if runner.reference or vid in self._shared:
                        fetch.append((o.name, vid, False))
                    if vid not in self._shared:
                        fetch.append((self._name(o, True), vid, True))
        # shape inference reads small constants (axes, shapes) from the model
        initializers = [numpy_helper.from_array(array, name) for name, array in consts.items()]
        graph = helper.make_graph(nodes, "precaudit_segment", list(inputs.values()),
                                  [onnx.ValueInfoProto(name=name) for name, _, _ in fetch], initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in self._opsets.items()])
        model.ir_version = max(8, helper.find_min_ir_version_for(model.opset_import, ignore_unknown=True))
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

        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return _Segment(start, end, session, ref_feeds, emu_feeds, fetch, self._options(), weights, clamps=clamps,
                        rounded=rounded)

    # ---- control-flow bodies ------------------------------------------------------------------------------

    def _bodies(self, node: Node, outer: dict[str, str], emulated: bool) -> dict[str, onnx.GraphProto]:
        """A node's If/Loop/Scan bodies for one of the runs: float32 types; emulated, also renamed and rounded.

        outer maps each outer name a body reads to the name that value has in the segment for this run.
        Nested bodies are rewritten through an explicit stack of _body generators, not by recursion: each
        generator yields the (body, nodes, outer names) of a nested body it needs and is sent the rewritten
        graph back, in the order a recursive rewrite would make them.
        """
        built = {}
        for key, body in node.bodies.items():
            stack = [self._body(body, node.body_nodes.get(key, []), outer, emulated)]
            result: onnx.GraphProto | None = None
            while stack:
                try:
                    nested = stack[-1].send(result)
                except StopIteration as done:
                    stack.pop()
                    result = done.value
                    continue
                stack.append(self._body(*nested, emulated))
                result = None
            built[key] = cast(onnx.GraphProto, result)  # the stack empties as the outermost body returns
        return built

    def _body(self, body: onnx.GraphProto, node_list: list[Node], outer: dict[str, str],
              emulated: bool) -> Generator[tuple[onnx.GraphProto, list[Node], dict[str, str]], onnx.GraphProto | None,
                                           onnx.GraphProto]:
        """One body rewritten (a generator: it yields each nested body it needs, see _bodies)."""
        plan = self.plan
        inner = node_list  # the IR's copy of the body, node for node
        mine = {v.name for v in body.input} | {t.name for t in body.initializer} | {o for n in body.node for o in n.output}

        def name(n: str) -> str:
            if not n:
                return n
            if n in mine:
                return f"emu::{n}" if emulated else n
            if n not in outer:
                raise ValueError(f"a body reads '{n}', which precaudit cannot place in the graph")
            return outer[n]

        nested_outer = {**outer, **{n: name(n) for n in mine}}
        out = onnx.GraphProto(name=body.name)
        for source, target in ((body.input, out.input), (body.output, out.output)):
            for vi in source:
                widened = target.add()
                widened.CopyFrom(vi)
                widened.name = name(vi.name)
                if widened.type.tensor_type.elem_type in _NARROW:
                    widened.type.tensor_type.elem_type = TensorProto.FLOAT
        consts = {v.name: v for n in inner for v in n.inputs if v is not None and v.is_const}
        for t in body.initializer:
            array = _reference_array(numpy_helper.to_array(t))
            if emulated and t.name in consts:
                converted, clamp = _body_const(plan, consts[t.name])
                if converted:
                    array = np.asarray(round_into(clamp.array(array) if clamp is not None else array,
                                                  plan.held(consts[t.name])))
            out.initializer.append(numpy_helper.from_array(array, name(t.name)))
        if len(inner) != len(body.node):
            raise ValueError(f"a body of {len(body.node)} nodes has {len(inner)} in precaudit's graph")
        for proto, node in zip(body.node, inner):
            if emulated:
                outputs_fmt = [plan.held(o) if o.name else None for o in node.outputs]
                reason = self._refusal(node, outputs_fmt, plan.spec(node))
                if reason is not None:
                    raise ValueError(f"inside its body, {reason}")
            attrs = _float32_attrs(node)
            if emulated and node.op_type == "Constant" and isinstance(attrs.get("value"), TensorProto):
                clamp = _body_const(plan, node.outputs[0])[1] if node.outputs and node.outputs[0].is_const else None
                if clamp is not None:  # the --converter clamps a Constant's tensor
                    attrs["value"] = numpy_helper.from_array(clamp.array(numpy_helper.to_array(attrs["value"])),
                                                             attrs["value"].name)
            for key, nested in node.bodies.items():
                attrs[key] = yield nested, node.body_nodes.get(key, []), nested_outer
            outputs = [name(o) for o in proto.output]
            rounded = []
            for k, o in enumerate(node.outputs):
                fmt = plan.held(o) if emulated and o.name else None
                if fmt is not None and fmt.name in _ROUND_TO:
                    rounded.append((f"raw::{outputs[k]}", outputs[k], _ROUND_TO[fmt.name]))
                    outputs[k] = f"raw::{outputs[k]}"
            inputs = _inference_inputs(node, [name(i) for i in proto.input])
            out.node.append(helper.make_node(proto.op_type, inputs, outputs, domain=proto.domain, **attrs))
            for source, target, narrow in rounded:
                out.node.extend(_round_trip(source, target, narrow))
        return out

    def _name(self, v: Value, emulated: bool) -> str:
        if not emulated or (not v.is_const and id(v) in self._shared):
            return v.name
        return f"emu::{v.name}"

    def _opset_imports(self) -> dict[str, int]:
        opsets = dict(_DEFAULT_OPSET)
        seen: dict[str, int] = {}
        for node in self.plan.graph.nodes:
            domain = _DOMAINS.get(node.domain)
            if domain is not None and node.opset is not None:
                seen[domain] = max(seen.get(domain, 0), node.opset)
        opsets.update(seen)
        return opsets


def _sized_by_data(node: Node, indexes: tuple[int, ...], limit: int = 256) -> bool:
    """Whether the inputs that size the node's output are computed from a graph input's values: walking producers
    back (iteratively, at most limit nodes) and stopping at Shape and Size, whose values existing tensors bound, and
    at constants. A walk past the limit counts as shapes (an exported graph's shape arithmetic is long)."""
    todo = [node.input(i) for i in indexes]
    seen: set[int] = set()
    while todo and len(seen) < limit:
        value = todo.pop()
        if value is None or id(value) in seen or is_constant(value):
            continue
        seen.add(id(value))
        if value.is_graph_input:
            return True
        maker = value.producer
        if maker is None or maker.op_type in ("Shape", "Size"):
            continue
        todo.extend(maker.inputs)
    return False


class _Stopper(threading.Timer):
    """Sets terminate on the sessions' RunOptions after a delay; stopped says it did."""

    def __init__(self, delay: float, run_options):
        self.stopped = False
        self._options = run_options
        super().__init__(delay, self._stop)
        self.daemon = True

    def _stop(self) -> None:
        self.stopped = True
        self._options.terminate = True


def _caster(casts: list[tuple[int, int]]) -> "ort.InferenceSession | Literal[False]":
    """A session of Casts x → y (each (from, to)) without an arena: its outputs are precaudit's arrays (the widener
    of float16 weights, the rounders of float32 ones); False where onnxruntime will not build it (numpy does it then)."""
    import onnxruntime as ort

    names = ["x", *(f"c{k}" for k in range(len(casts) - 1)), "y"]
    nodes = [helper.make_node("Cast", [names[k]], [names[k + 1]], to=to) for k, (_, to) in enumerate(casts)]
    graph = helper.make_graph(nodes, "precaudit_cast", [helper.make_tensor_value_info("x", casts[0][0], None)],
                              [helper.make_tensor_value_info("y", casts[-1][1], None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = False
    try:
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception:
        return False


_ARENA: list = []


def _shared_arena(ort) -> None:
    """Register one CPU arena with onnxruntime's environment, once per process."""
    if not _ARENA:
        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, -1, -1, -1))
        _ARENA.append(info)


def _body_const(plan: Plan, v: Value) -> tuple[bool, Clamp | None]:
    """How a body's emulated copy holds a constant of the body, which one name serves every reader: converted if
    any reader reads it converted (Plan.const_read), with the clamp such a read applies."""
    reads = [plan.const_read(v, reader) for reader in v.consumers] or [(True, None)]
    return any(c for c, _ in reads), next((clamp for c, clamp in reads if c and clamp is not None), None)


def _inference_inputs(node: Node, names: list[str]) -> list[str]:
    """A node's input names as an inference run reads them: a Dropout without its training_mode input.

    An exporter run on a module left in training mode writes Dropout(x, ratio, training_mode=True); onnxruntime
    would then drop a different random part of x in the reference and in the emulation, and every value after it
    would differ by far more than rounding. A deployed model runs Dropout as the identity, as the numpy kernel does.
    """
    if node.op_type == "Dropout" and node.domain in ("", "ai.onnx") and len(names) > 2:
        return names[:2]
    return names


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _get(v: Value | None, env: dict, runner: Runner, which: int):
    if v is None:
        return None
    if v.is_const:
        return runner.const(v, which)
    return env.get(id(v))


def _nbytes(arrays: dict[str, np.ndarray]) -> int:
    return sum({id(a): a.nbytes for a in arrays.values()}.values())


def _contiguous(array: np.ndarray) -> np.ndarray:
    # np.ascontiguousarray would turn a 0-d array into a 1-d one
    return array if array.flags.c_contiguous else array.copy(order="C")


def _round_trip(source: str, target: str, narrow: int) -> list[onnx.NodeProto]:
    return [helper.make_node("Cast", [source], [f"narrow::{target}"], to=narrow),
            helper.make_node("Cast", [f"narrow::{target}"], [target], to=TensorProto.FLOAT)]


def _reference_array(data: np.ndarray) -> np.ndarray:
    """A constant as the reference holds it (narrow floats widened to float32), in one contiguous block."""
    array = as_reference(np.asarray(data))
    # np.ascontiguousarray would turn a 0-d array into a 1-d one (an index into a rank-1 one, say)
    return array if array.flags.c_contiguous else array.copy(order="C")


def _float32_attrs(node: Node) -> dict:
    """A node's attributes with every narrow float type replaced by float32: both runs compute in float32."""
    attrs = {}
    for key, value in node.attrs.items():
        if key in ("to", "dtype") and isinstance(value, int) and value in _NARROW:
            value = TensorProto.FLOAT
        elif isinstance(value, TensorProto) and value.data_type in _NARROW:
            value = numpy_helper.from_array(_reference_array(numpy_helper.to_array(value)), value.name)
        attrs[key] = value
    return attrs
