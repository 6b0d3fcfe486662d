"""Run stretches of the plan on onnxruntime: the float32 reference and the emulation side by side in one session.

Each segment's session (ort_segment.py) rounds every float output of the emulated copy through a Cast pair into
the format it is held in: every op sees inputs that hold values of the format and leaves a value of the format,
the semantics of the numpy kernels at onnxruntime's speed. onnxruntime's own float16 kernels are never used, since
they keep chains of ops in float32 and hide overflow; only its Cast rounds, and it rounds float16 and bfloat16
exactly as ml_dtypes does (tested).

A segment is a run of consecutive steps. Its session returns every value the measurements read, so it holds
them all at once; segments are sized from the bytes the previous ones returned, so memory stays near a fixed
budget whatever the model. The values a segment returned are measured (numpy, meter.py) on a second thread while
the next segment runs, one segment behind at most. Steps onnxruntime cannot emulate faithfully (fp8, statistics
rounded inside a fused norm, unknown domains: ort_eligible.py), and steps onnxruntime refuses, run on the numpy
kernels instead.

Weights are fed to the session when it runs, read from the model then and dropped when it is done, unless the
hold budget keeps them for the next sample (Runner.may_hold): onnxruntime reads inputs where they are, while it
copies initializers and prepacks MatMul weights into yet another copy (ort_weights.py). Segments are also sized by
the weights they read (_WEIGHT_BUDGET, rounded copies included), so a one-batch run of a 7B-parameter model holds
about half a layer's weights at a time, never the model's. A weight several segments read (tied embeddings) is
read again by each.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from ..errors import InputError
from ..ir import Value
from .meter import reads_inputs
from .ort_eligible import refusal
from .ort_nodes import first_line
from .ort_segment import EMBED_BYTES, Segment, SegmentBuilder
from .ort_weights import WeightFeeder
from .plan import Plan, Runner, Step

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

    import onnxruntime as ort

__all__ = ["OrtSegments", "onnxruntime_available"]

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


class OrtSegments:
    """Drives a plan's steps through onnxruntime sessions where it can, for the run it serves; returns None where it
    cannot (the run then takes the step on numpy)."""

    def __init__(self, plan: Plan, runner: Runner):
        self.plan = plan
        self.runner = runner
        self.refusals: dict[int, str] = {}  # node id -> why onnxruntime does not run it (said if numpy cannot either)
        self.eligible = [self._eligible(s) for s in plan.steps]
        self._segments: dict[int, Segment | None] = {}  # by first step; None where numpy runs that step
        self._bytes_per_step = 1.0  # returned by the last segment run, reference and emulation together
        self._last_size = 0  # nodes in the last segment built
        self._feeder = WeightFeeder()
        self._builder = SegmentBuilder(plan, runner, self._feeder)
        # a segment's values are measured on a second thread while the next segment runs on onnxruntime
        self._worker: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None
        # one RunOptions for every segment's runs, so one timer per sample can stop whichever is running (--timeout)
        self._run_options: ort.RunOptions | None = None
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
            self._refused(i, segment, exc)
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
        self._measure_behind(start, end, emu, ref)
        return end

    def _refused(self, i: int, segment: Segment, exc: Exception) -> None:
        """onnxruntime refused these inputs; numpy runs the segment now and from now on (a real input error is then
        reported by the numpy kernels, in one line). Past the deadline, the run stops instead."""
        if self._stopper is not None and self._stopper.stopped:
            self.runner.check_time(self.plan.steps[segment.start].node)  # past the deadline: it raises
        self._segments[i] = None
        for k in range(segment.start, segment.end):
            self.eligible[k] = False
            self.refusals.setdefault(id(self.plan.steps[k].node), f"onnxruntime: {first_line(exc)}")

    def _measure_behind(self, start: int, end: int, emu: dict, ref: dict) -> None:
        """The segment before is measured; this one is measured while the next one runs."""
        self.wait()
        if self.runner.reference:
            if self._worker is None:
                from concurrent.futures import ThreadPoolExecutor

                self._worker = ThreadPoolExecutor(1, thread_name_prefix="precaudit-measure")
            self._pending = self._worker.submit(self._measure_steps, start, end, emu, ref)
        else:
            self._measure_steps(start, end, emu, ref)

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

    def _options(self) -> ort.RunOptions:
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

    def _weights(self, segment: Segment) -> dict[str, np.ndarray]:
        """The segment's weights as its session reads them, read from the model now."""
        return self._feeder.feeds(segment.weights, segment.clamps, segment.rounded)

    def _measure_step(self, step: Step, emu: dict, ref: dict) -> None:
        runner = self.runner
        for (vid, _) in step.outputs:  # a shared value is returned once: both runs hold the same numbers
            if vid in ref and vid not in emu:
                emu[vid] = ref[vid]
        if runner.reference:
            # only hooks and the elementwise noise floor read a node's inputs; the weights stay unrounded here
            reads_args = reads_inputs(step)
            ref_args = [self._get(v, ref, 1) for v in step.inputs] if reads_args else []
            emu_args = [self._get(v, emu, w) for v, w in zip(step.inputs, step.const_reads)] if reads_args else []
            runner.measure(step, ref_args, emu_args, [ref.get(vid) for vid, _ in step.outputs],
                           [emu.get(vid) for vid, _ in step.outputs])
        runner.free(step, emu, ref)

    def _get(self, v: Value | None, env: dict, which: int):
        if v is None:
            return None
        if v.is_const:
            return self.runner.const(v, which)
        return env.get(id(v))

    # ---- which steps, how many ---------------------------------------------------------------------------

    def _eligible(self, step: Step) -> bool:
        reason = refusal(step.node, step.spec, step.input_formats, step.rounds)
        if reason is not None:
            self.refusals[id(step.node)] = reason
        return reason is None

    def _segment_end(self, i: int) -> int:
        """Where the segment starting at step i ends: about _BUDGET bytes returned, judged from the segments so far.

        A segment may at most double the last one: the first nodes (embeddings, say) can return far fewer bytes
        per node than the blocks after them, and one oversized guess would hold the whole model's values at once.
        """
        steps = self.plan.steps
        size = _FIRST_SEGMENT
        if self._last_size:
            size = int(min(_MAX_SEGMENT, max(_MIN_SEGMENT, min(2 * self._last_size, _BUDGET // self._bytes_per_step))))
        end, weights, seen = i, 0, set()
        while end < len(steps) and end - i < size and self.eligible[end]:
            step = steps[end]
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
        if size is None or size * 4 <= EMBED_BYTES:
            return 0
        fmt = self.plan.held(v)
        rounded = fmt is not None and not fmt.wide and v.dtype != fmt.name
        return size * (8 if v.dtype == "fp64" else 4) * (2 if rounded else 1)

    def _build(self, i: int, emu: dict, ref: dict) -> Segment | None:
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
                    self.refusals[id(self.plan.steps[i].node)] = first_line(exc)
                    return None
                end = i + (end - i) // 2

    def _build_range(self, start: int, end: int, emu: dict, ref: dict) -> Segment:
        return self._builder.build(start, end, emu, ref, self._options())


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


def _nbytes(arrays: dict[str, np.ndarray]) -> int:
    return sum({id(a): a.nbytes for a in arrays.values()}.values())
