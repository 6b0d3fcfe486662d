"""Run a graph op by op twice in lockstep: a float32 reference, and the target dtype emulated with ml_dtypes.

Each emulated op computes in float32 (float64 where the graph casts to double) on inputs that already hold
values of their format, and its float outputs are rounded into the format the resolver says they are held
in. That is what a GPU kernel does (fp32 accumulation, a narrow result), and what onnxruntime's CPU
kernels do not: they keep chains of fp16 ops in fp32 and hide overflow. The steps come from the plan (plan.py);
stretches of them run on onnxruntime (ort_engine.py) where it is installed, the rest on the numpy kernels here.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from ..analysis.compute_dtype import DtypeResolver
from ..errors import InputError
from ..ir import Graph, Node, Value
from ..options import TRACE_ENGINES
from .consts import ConstStore
from .fallback import REFERENCE, ReferenceFallback, as_float, as_reference
from .kernels import KernelContext
from .limits import check_made_size
from .meter import Meter
from .ort_engine import OrtSegments, onnxruntime_available
from .plan import Hook, Plan, Step
from .rounding import round_into
from .stats import ValueStats

__all__ = ["Emulator"]


class Emulator:
    """Runs samples through the graph and keeps only the measurements; every intermediate is freed after its last use.

    It is the Runner (plan.py) the onnxruntime engine serves: const, measure, free, may_hold, check_time.
    """

    def __init__(self, graph: Graph, resolver: DtypeResolver, reference: bool = True, engine: str = "auto"):
        self.graph = graph
        self.resolver = resolver
        self.reference = reference
        self.hooks: dict[int, list[Hook]] = {}  # measurements keyed by id(node), attached to the plan at each run
        self._fallback = ReferenceFallback(graph)
        self._ref_ctx = KernelContext(REFERENCE)
        self.plan = Plan(graph, resolver)
        self.consts = ConstStore(self.plan)
        self.meter = Meter(graph)
        if engine not in TRACE_ENGINES:
            raise ValueError(f"unknown traced-mode engine {engine!r}")
        if engine == "onnxruntime" and not onnxruntime_available():
            raise InputError(graph.path, "--trace-engine onnxruntime needs onnxruntime: pip install 'precaudit[trace]'")
        self.engine = engine if engine != "auto" else "onnxruntime" if onnxruntime_available() else "numpy"
        self._ort: OrtSegments | None = None  # made at the first run, once the probes have hooked on
        self.ran_on = {"onnxruntime": 0, "numpy": 0}  # nodes per engine in the last sample
        # time.monotonic() past which the run stops (--timeout), over every sample; None: no limit
        self.deadline: float | None = None
        self.timeout: float | None = None

    @property
    def stats(self) -> dict[int, ValueStats]:
        """Per value id, what the samples so far measured."""
        return self.meter.stats

    @property
    def final(self) -> bool:
        """The sample running is the last: keep nothing for a next one."""
        return self.consts.final

    @property
    def held_bytes(self) -> int:
        """Bytes of weights kept for the next sample: rounded constants and onnxruntime's kept segments."""
        return self.consts.held_bytes

    def limit_time(self, timeout: float | None) -> None:
        """From now on, runs stop after timeout seconds (all samples together); None: no limit."""
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout if timeout else None

    def check_time(self, where: Node | None = None) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            at = f" at node '{where.name}' ({where.op_type})" if where is not None else ""
            raise InputError(self.graph.path, f"traced mode stopped after {self.timeout:g} s{at} (--timeout; 0 for no "
                                              f"limit): a Loop may run for ever on these inputs, or the model needs "
                                              f"longer")

    def run(self, feeds: dict[str, np.ndarray], progress: Callable[[int, int], None] | None = None,
            final: bool = False) -> None:
        """One sample through the graph; measurements accumulate in self.stats and the hooks.

        final: no sample follows, so weights are dropped after their last reader even where the hold budget
        would keep them (a one-batch run then holds one segment's weights at a time).
        """
        self.consts.final = final
        emu, ref = self._inputs(feeds)
        self.meter.samples = {}
        self.plan.attach(self.hooks)  # hooks attached after construction
        if self.engine == "onnxruntime" and self._ort is None:
            self._ort = OrtSegments(self.plan, self)
        self.ran_on = {"onnxruntime": 0, "numpy": 0}
        if self._ort is not None:
            self._ort.stop_at(self.deadline)
        try:
            with np.errstate(all="ignore"):  # inf and NaN are what traced mode is looking for
                self._run_steps(emu, ref, progress)
        finally:
            if self._ort is not None:
                self._ort.unstop()
                self._ort.wait()
        self.meter.samples = {}
        if final:
            self.release()

    def _inputs(self, feeds: dict[str, np.ndarray]) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
        """The two runs' environments, holding the graph's inputs: rounded into their formats for the emulation."""
        emu: dict[int, np.ndarray] = {}
        ref: dict[int, np.ndarray] = {}
        formats = self.plan.graph_input_formats
        for value in self.graph.inputs:
            emu[id(value)] = round_into(as_float(feeds[value.name], np.float32), formats[id(value)])
            if self.reference or formats[id(value)] is None:  # integer inputs feed both runs alike
                array = feeds[value.name]
                # the reference computes in float32 unless the graph itself takes doubles here
                ref[id(value)] = as_reference(array) if value.dtype == "fp64" else as_float(array, REFERENCE)
        return emu, ref

    def _run_steps(self, emu: dict, ref: dict, progress: Callable[[int, int], None] | None) -> None:
        """Every step in order: a segment on onnxruntime where it takes one, else the step on numpy."""
        steps = self.plan.steps
        total = len(steps)
        i = 0
        while i < total:
            self.check_time(steps[i].node)
            after = self._ort.run_from(i, emu, ref) if self._ort is not None else None
            if after is None:
                if self._ort is not None:
                    self._ort.wait()  # measurements go in graph order
                self._run_step(steps[i], emu, ref)
                after = i + 1
                self.ran_on["numpy"] += 1
            else:
                self.ran_on["onnxruntime"] += after - i
            i = after
            if progress is not None:
                progress(i, total)

    def release(self) -> None:
        """Drop every weight kept for later samples: rounded constants and onnxruntime's kept segments."""
        self.consts.release()
        if self._ort is not None:
            self._ort.release()

    def may_hold(self, nbytes: int) -> bool:
        """Whether weights of nbytes may be kept for the next sample (and count them if so); thread-safe."""
        return self.consts.may_hold(nbytes)

    def const(self, value: Value, which: int) -> np.ndarray:
        """A constant as a run reads it: which 0 the emulated copy, 1 the reference's."""
        return self.consts.read(value, which)

    def measure(self, step: Step, ref_args: list, emu_args: list, ref_outs: list, emu_outs: list) -> None:
        """Fold one step's outputs into the per-value stats and call its hooks."""
        self.meter.measure(step, ref_args, emu_args, ref_outs, emu_outs)

    def free(self, step: Step, emu: dict, ref: dict) -> None:
        """Drop the values and constants the step was the last to read (constants kept for a next sample stay)."""
        for vid in step.frees:
            emu.pop(vid, None)
            ref.pop(vid, None)
        if step.frees_consts:
            self.consts.drop(step.frees_consts)

    def _run_step(self, step: Step, emu: dict, ref: dict) -> None:
        emu_args = [self._arg(v, emu, w) for v, w in zip(step.inputs, step.const_reads)]
        spec = step.spec
        if spec.reads is not None or spec.weights is not None:  # the runtime's kernel reads them rounded
            emu_args = [a if a is None or v is None else round_into(a, spec.weights if v.is_const else spec.reads)
                        for v, a in zip(step.inputs, emu_args)]
        emu_outs = self._call(step, emu_args, step.emu_ctx)
        if spec.writes is not None:  # written in its own format, then converted to the held one
            emu_outs = [round_into(a, spec.writes) if fmt is not None else a for a, fmt in zip(emu_outs, step.rounds)]
        emu_outs = [a if fmt is None else round_into(a, fmt) for a, fmt in zip(emu_outs, step.rounds)]
        if self.reference:
            ref_args = [self._arg(v, ref, 1) for v in step.inputs]
            ref_outs = [as_reference(a) for a in self._call(step, ref_args, self._ref_ctx)]
            self.measure(step, ref_args, emu_args, ref_outs, emu_outs)
            for (vid, _), r in zip(step.outputs, ref_outs):
                ref[vid] = r
        for (vid, _), e in zip(step.outputs, emu_outs):
            emu[vid] = e
        self.free(step, emu, ref)

    def _call(self, step: Step, args: list, ctx: KernelContext) -> list:
        node = step.node
        check_made_size(self.graph, node, args)
        if ctx.prepare is not None:  # the emulated run's inputs as the target format gives them to the kernel
            args = ctx.prepare(node, args)
        if step.kernel is not None:
            try:
                return step.kernel(node, args, ctx)
            except NotImplementedError:  # a variant the kernel leaves to the reference evaluator
                pass
            except MemoryError:
                raise InputError(self.graph.path, f"traced mode ran out of memory at node '{node.name}' "
                                                  f"({node.op_type}): give smaller inputs (--inputs, --dim)") from None
            except (ValueError, TypeError, IndexError) as exc:  # shapes or types the inputs cannot have
                raise InputError(self.graph.path, f"traced mode cannot run node '{node.name}' ({node.op_type}): "
                                                  f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
        refusal = self._ort.refusals.get(id(node)) if self._ort is not None and node.bodies else None
        if refusal is not None:  # control flow runs on onnxruntime only: say why it did not
            raise InputError(self.graph.path, f"traced mode cannot run node '{node.name}' "
                                              f"({node.op_type}) on onnxruntime: {refusal}")
        return [as_float(a, ctx.float_dtype) for a in self._fallback.run(node, args)]

    def _arg(self, value: Value | None, env: dict, which: int) -> np.ndarray | None:
        if value is None:
            return None
        if value.is_const:
            return self.consts.read(value, which)
        try:
            return env[id(value)]
        except KeyError:
            raise InputError(self.graph.path, f"traced mode: value '{value.name}' is read before any node "
                                              f"makes it") from None
