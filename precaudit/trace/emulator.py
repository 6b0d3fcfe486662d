"""Run a graph op by op twice in lockstep: a float32 reference, and the target dtype emulated with ml_dtypes.

Each emulated op computes in float32 (float64 where the graph casts to double) on inputs that already hold
values of their format, and its float outputs are rounded into the format the resolver says they are held
in. That is what a GPU kernel does (fp32 accumulation, a narrow result), and what onnxruntime's CPU
kernels do not: they keep chains of fp16 ops in fp32 and hide overflow.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, cast

import numpy as np

from ..analysis.compute_dtype import DtypeResolver
from ..converters import Clamp
from ..dtypes import FORMATS, Format
from ..errors import InputError
from ..ir import Graph, Node, Value, implicit_inputs
from ..options import TRACE_ENGINES
from .fallback import REFERENCE, ReferenceFallback, as_float, as_reference
from .kernels import KERNELS, MS_KERNELS, KernelContext
from .limits import check_made_size
from .ort_engine import OrtSegments, onnxruntime_available
from .rounding import round_into
from .stats import ValueStats

__all__ = ["Emulator", "Hook", "HOLD_BYTES", "SMALL_CONST_BYTES"]

# Weights a run keeps from one sample to the next (rounded copies, onnxruntime segments with their weights): the
# first ones met, up to this many bytes; the rest are read again, from the file, in every sample. The last sample
# keeps nothing past its last reader, so a one-batch run holds one segment's weights at a time.
HOLD_BYTES = 1 << 30
# Constants this small (eps, axes, shapes, biases) are kept for the whole run whatever the budget.
SMALL_CONST_BYTES = 1 << 20

_FLOAT_DTYPES = {"fp16", "bf16", "fp32", "fp64", "fp8-e4m3", "fp8-e5m2"}

# hook(ref_args, emu_args, ref_outs, emu_outs): a measurement taken while a node's inputs are still alive
Hook = Callable[[list, list, list, list], None]
_STASH_NORMS = {"LayerNormalization": 17, "RMSNormalization": 23}
# Ops whose outputs are some of their inputs' numbers, moved: rounding them again changes nothing when the
# inputs are already held in the output's format, so the hot path skips it.
_MOVES_VALUES = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Flatten", "Gather", "GatherElements",
                 "Slice", "Split", "Concat", "Expand", "Max", "Min", "Relu", "Neg", "Abs", "Where", "Dropout",
                 "ReduceMax", "ReduceMin"}


_CANCELLING = {"Add", "Sub", "Sum", "ReduceMean", "ReduceSum", "MatMul", "Gemm", "Conv", "Einsum"}
_CARRIES_NOISE = {"Identity", "Cast", "Reshape", "Expand", "Squeeze", "Unsqueeze", "Transpose", "Flatten", "Mul", "Div",
                  "Neg", "Abs", "Concat", "Slice", "Gather", "Split"}
# A sum or difference smaller than this fraction of its inputs is float32 cancellation noise. It is also below
# every narrow format's own rounding error of those inputs (bf16: 4e-3, fp16: 5e-4), so it cannot be a value
# that the format should have kept: calling it an underflow would be wrong.
_NOISE = 1e-5



# Elementwise sums and differences: their noise floor is judged per element, from their inputs.
_LOCAL_FLOOR_OPS = ("Add", "Sub")


def reads_inputs(step: "_Step") -> bool:
    """Whether measuring a node reads its inputs, not only its outputs: its hooks, or an elementwise noise floor."""
    return bool(step.hooks) or step.node.op_type in _LOCAL_FLOOR_OPS


def _local_floor(step: "_Step", ref_args: list) -> Callable[[np.ndarray], np.ndarray] | None:
    """An elementwise sum or difference, per element: noise only where it is small against its own inputs.

    Adding an eps to a variance of exactly 0 gives the eps, exactly, however large other rows are.
    """
    if step.node.op_type not in _LOCAL_FLOOR_OPS or len(ref_args) != 2 or any(a is None for a in ref_args):
        return None
    a, b = ref_args

    def floor(mask: np.ndarray) -> np.ndarray:  # only where the mask (the tiny outputs) says: a few elements
        pick_a, pick_b = np.broadcast_to(a, mask.shape)[mask], np.broadcast_to(b, mask.shape)[mask]
        return _NOISE * np.maximum(np.abs(pick_a), np.abs(pick_b))
    return floor


@dataclass
class _Step:
    """One node, prepared once: its kernel, its inputs, its outputs' formats, and the values it frees."""

    node: Node
    kernel: Callable | None
    inputs: list[Value | None]
    outputs: list[tuple[int, Format | None]]
    emu_ctx: KernelContext
    rounds: list[Format | None]  # the format each output is rounded into; None where it already holds it
    frees: list[int] = field(default_factory=list)
    frees_consts: list[Value] = field(default_factory=list)  # large constants this step is the last to read
    hooks: list[Hook] = field(default_factory=list)
    implicit: list[Value] = field(default_factory=list)  # outer values an If/Loop/Scan body reads by name
    # the value whose numbers this node only rearranges (a Reshape, a Transpose): its output's counts are
    # the input's, so a sample measured once is merged twice
    rearranges: int | None = None
    # per input, which copy of a constant the emulated run reads: 0 the converted one (rounded into its format,
    # clamped where the --converter clamps it), 1 the numbers as stored (a converter leaves it float32 here)
    const_reads: list[int] = field(default_factory=list)


_SEQUENCE_OPS = {"SplitToSequence", "ConcatFromSequence", "SequenceConstruct", "SequenceAt", "SequenceInsert",
                 "SequenceErase", "SequenceLength", "SequenceEmpty", "SequenceMap"}

# Ops whose single output holds exactly the numbers of their first input, rearranged.
_REARRANGES = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Flatten"}


class Emulator:
    """Runs samples through the graph and keeps only the measurements; every intermediate is freed after its last use."""

    def __init__(self, graph: Graph, resolver: DtypeResolver, reference: bool = True, engine: str = "auto"):
        self.graph = graph
        self.resolver = resolver
        self.reference = reference
        self.stats: dict[int, ValueStats] = {}
        self.hooks: dict[int, list[Hook]] = {}
        self._fallback = ReferenceFallback(graph)
        self._ref_ctx = KernelContext(REFERENCE)
        self._emu_ctx = KernelContext(np.float32)
        # constants as the runs read them, (emulated, reference): small ones for the whole run, large ones until
        # their last reader in a sample, or across samples within the hold budget
        self._consts: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._held_consts: set[int] = set()  # kept across samples
        self._small_consts: set[int] = set()
        self.held_bytes = 0  # of weights kept across samples: these constants and onnxruntime's kept segments
        self._hold_lock = threading.Lock()
        self.final = False  # the sample running is the last: keep nothing for a next one
        self._held_cache: dict[int, Format | None] = {}
        # constants whose converted copy the --converter clamps (Clamp.array before rounding), and those no node
        # reads converted (their emulated copy is never made)
        self._const_clamps: dict[int, Clamp] = {}
        self._unconverted: set[int] = set()
        self._readers_blocked: dict[int, list[bool]] = {}
        self._input_fmt = {id(v): self._held(v) for v in graph.inputs}
        self._steps = self._plan()
        self._samples: dict[int, tuple[float, tuple]] = {}  # this sample's counts per value, for _REARRANGES
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
        self.final = final
        emu: dict[int, np.ndarray] = {}
        ref: dict[int, np.ndarray] = {}
        for value in self.graph.inputs:
            emu[id(value)] = round_into(as_float(feeds[value.name], np.float32), self._input_fmt[id(value)])
            if self.reference or self._input_fmt[id(value)] is None:  # integer inputs feed both runs alike
                array = feeds[value.name]
                # the reference computes in float32 unless the graph itself takes doubles here
                ref[id(value)] = as_reference(array) if value.dtype == "fp64" else as_float(array, REFERENCE)
        self._samples = {}
        total = len(self._steps)
        for step in self._steps:  # hooks attached after construction
            step.hooks = self.hooks.get(id(step.node), [])
        if self.engine == "onnxruntime" and self._ort is None:
            self._ort = OrtSegments(self)
        i = 0
        self.ran_on = {"onnxruntime": 0, "numpy": 0}
        if self._ort is not None:
            self._ort.stop_at(self.deadline)
        try:
            with np.errstate(all="ignore"):  # inf and NaN are what traced mode is looking for
                while i < total:
                    self.check_time(self._steps[i].node)
                    after = self._ort.run_from(i, emu, ref) if self._ort is not None else None
                    if after is None:
                        if self._ort is not None:
                            self._ort.wait()  # measurements go in graph order
                        self._run_step(self._steps[i], emu, ref)
                        after = i + 1
                        self.ran_on["numpy"] += 1
                    else:
                        self.ran_on["onnxruntime"] += after - i
                    i = after
                    if progress is not None:
                        progress(i, total)
        finally:
            if self._ort is not None:
                self._ort.unstop()
                self._ort.wait()
        self._samples = {}
        if final:
            self.release()

    def release(self) -> None:
        """Drop every weight kept for later samples: rounded constants and onnxruntime's kept segments."""
        for vid in self._held_consts:
            if vid not in self._small_consts:
                self._consts.pop(vid, None)
        self._held_consts = set(self._small_consts)
        if self._ort is not None:
            self._ort.release()
        self.held_bytes = 0

    def may_hold(self, nbytes: int) -> bool:
        """Whether weights of nbytes may be kept for the next sample (and count them if so). Thread-safe: onnxruntime's
        segments ask from the main thread while their measurements, on a second thread, read constants."""
        with self._hold_lock:
            if self.final or self.held_bytes + nbytes > HOLD_BYTES:
                return False
            self.held_bytes += nbytes
            return True

    def _run_step(self, step: _Step, emu: dict, ref: dict) -> None:
        emu_args = [self._arg(v, emu, w) for v, w in zip(step.inputs, step.const_reads)]
        emu_outs = self._call(step, emu_args, step.emu_ctx)
        emu_outs = [a if fmt is None else round_into(a, fmt) for a, fmt in zip(emu_outs, step.rounds)]
        if self.reference:
            ref_args = [self._arg(v, ref, 1) for v in step.inputs]
            ref_outs = [as_reference(a) for a in self._call(step, ref_args, self._ref_ctx)]
            self._measure(step, ref_args, emu_args, ref_outs, emu_outs)
            for (vid, _), r in zip(step.outputs, ref_outs):
                ref[vid] = r
        for (vid, _), e in zip(step.outputs, emu_outs):
            emu[vid] = e
        self._free(step, emu, ref)

    def _measure(self, step: _Step, ref_args: list, emu_args: list, ref_outs: list, emu_outs: list) -> None:
        """Fold one node's outputs into the per-value stats and call its hooks.

        An output given as None was not fetched: only a node that rearranges its input's numbers (whose
        sample is its input's) may leave its outputs out.
        """
        floor = self._noise_floor(step)
        local = _local_floor(step, ref_args)
        for (vid, fmt), r, e in zip(step.outputs, ref_outs, emu_outs):
            if fmt is None or (r is not None and r.dtype.kind != "f"):
                continue
            # a rearranged value holds its input's numbers: its input's sample, measured once, counts for both
            known = self._samples.get(step.rearranges) if step.rearranges is not None else None
            if r is None and known is None:
                continue
            if known is None and e is not None and np.shape(e) != np.shape(r):
                raise InputError(self.graph.path, f"traced mode: node '{step.node.name}' ({step.node.op_type}) gives "
                                                  f"shape {np.shape(r)} in the float reference and {np.shape(e)} "
                                                  f"in {fmt.long_name}: the emulated run took another path (a "
                                                  f"shape or a loop count computed from data, as NonZero or a Loop "
                                                  f"condition do)")
            stats = self.stats.get(vid)
            if stats is None:
                stats = self.stats[vid] = ValueStats(fmt)
            value_floor, sample = known if known is not None else (floor, stats.measure(r, e, floor, local))
            stats.merge(sample, value_floor)
            self._samples[vid] = (value_floor, sample)
        for hook in step.hooks:
            hook(ref_args, emu_args, ref_outs, emu_outs)

    def _free(self, step: _Step, emu: dict, ref: dict) -> None:
        for vid in step.frees:
            emu.pop(vid, None)
            ref.pop(vid, None)
        for value in step.frees_consts:  # a weight no later step reads, unless kept for the next sample
            if id(value) not in self._held_consts or self.final and id(value) not in self._small_consts:
                self._consts.pop(id(value), None)

    def _call(self, step: _Step, args: list, ctx: KernelContext) -> list:
        check_made_size(self.graph, step.node, args)
        if step.kernel is not None:
            try:
                return step.kernel(step.node, args, ctx)
            except NotImplementedError:  # a variant the kernel leaves to the reference evaluator
                pass
            except MemoryError:
                node = step.node
                raise InputError(self.graph.path, f"traced mode ran out of memory at node '{node.name}' "
                                                  f"({node.op_type}): give smaller inputs (--inputs, --dim)") from None
            except (ValueError, TypeError, IndexError) as exc:  # shapes or types the inputs cannot have
                node = step.node
                raise InputError(self.graph.path, f"traced mode cannot run node '{node.name}' ({node.op_type}): "
                                                  f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
        refusal = self._ort.refusals.get(id(step.node)) if self._ort is not None and step.node.bodies else None
        if refusal is not None:  # control flow runs on onnxruntime only: say why it did not
            raise InputError(self.graph.path, f"traced mode cannot run node '{step.node.name}' "
                                              f"({step.node.op_type}) on onnxruntime: {refusal}")
        return [as_float(a, ctx.float_dtype) for a in self._fallback.run(step.node, args)]

    def _noise_floor(self, step: _Step) -> float:
        """Below this, a sum or difference of the inputs is float32 rounding noise, not a value that underflows.

        The mean of a normalized row is ~1e-8 in the reference: calling that an fp16 underflow would be wrong.
        Only ops that add or subtract can cancel; an exp of -30 is genuinely tiny. Input ranges come from the
        stats already gathered, so this costs no pass over the data.
        """
        known = [self.stats[id(v)] for v in step.inputs if v is not None and id(v) in self.stats]
        if step.node.op_type in _CANCELLING:
            return max((s.absmax for s in known), default=0.0) * _NOISE
        if step.node.op_type in _CARRIES_NOISE:  # noise moved or scaled is still noise
            return max((s.noise_floor for s in known), default=0.0)
        return 0.0

    def _arg(self, value: Value | None, env: dict, which: int) -> np.ndarray | None:
        if value is None:
            return None
        if value.is_const:
            pair = self._consts.get(id(value))
            if pair is None:
                pair = self._consts[id(value)] = self._const_pair(value)
                nbytes = sum({id(a): a.nbytes for a in pair}.values())
                if nbytes <= SMALL_CONST_BYTES:
                    self._small_consts.add(id(value))
                    self._held_consts.add(id(value))
                elif self.may_hold(nbytes):
                    self._held_consts.add(id(value))
            return pair[which]
        try:
            return env[id(value)]
        except KeyError:
            raise InputError(self.graph.path, f"traced mode: value '{value.name}' is read before any node "
                                              f"makes it") from None

    def _const_pair(self, value: Value) -> tuple[np.ndarray, np.ndarray]:
        """A constant as the emulated run holds it (clamped where the --converter clamps it, rounded into its
        format) and as the reference does; one array for both where that changes nothing (an fp16 weight held in
        fp16) or where no node reads the converted copy."""
        data = np.asarray(value.const())
        reference = as_reference(data)
        if self.stored_as_held(value, data) or id(value) in self._unconverted:
            return reference, reference
        clamp = self._const_clamps.get(id(value))
        return round_into(clamp.array(data) if clamp is not None else as_float(data, np.float32),
                          self._held(value)), reference

    def const_read(self, value: Value, reader: Node) -> tuple[bool, Clamp | None]:
        """How `reader` reads a constant in the emulated run, as the --converter leaves it: (converted, clamp).

        converted: the copy rounded into the format the constant is held in, after `clamp` where the converter
        clamps it; otherwise the numbers as stored (a converter leaves a constant only blocked nodes read in
        float32: converters/ says which). Without a converter (or a constant it does not convert: stored in another
        dtype, held in float32) every reader reads the constant rounded as it is.
        """
        resolver = self.resolver
        fmt = self._held(value)
        if not resolver.converting or value.dtype != "fp32" or fmt is None or fmt.name in ("fp32", "fp64"):
            return True, None
        dtype = resolver.of_value(value)
        maker = value.producer
        initializer = maker is None or maker.op_type != "Constant"
        readers = self._readers_blocked.get(id(value))
        if readers is None:
            readers = self._readers_blocked[id(value)] = [resolver.kept_by(c) is not None for c in value.consumers]
        converted, clamped = resolver.converter.reads_converted(
            initializer, maker is not None and resolver.kept_by(maker) is not None, readers,
            resolver.kept_by(reader) is not None)
        clamp = dtype.clamp if dtype is not None else None
        if not clamped or clamp is None or not clamp.applies_to(value.const_origin or ""):
            clamp = None
        return converted, clamp

    def stored_as_held(self, value: Value, data: np.ndarray) -> bool:
        """Whether a constant's stored numbers are already those of the format it is held in (an fp16 weight held
        in fp16): its emulated copy is then its float32 reference, number for number."""
        fmt = self._held(value)
        return fmt is not None and data.dtype == fmt.np_dtype and fmt.name not in ("fp64",)

    def _plan(self) -> list[_Step]:
        """Kernels, output formats and last uses, worked out once for every sample."""
        # nodes inside If/Loop/Scan bodies run with their control-flow node, which reads what they read outside
        nodes = [n for n in self.graph.nodes
                 if not n.subgraph_path and (not all(o.is_const for o in n.outputs) or not n.outputs)]
        implicit = {id(n): implicit_inputs(n) for n in nodes if n.bodies}
        kept = {id(v) for v in self.graph.outputs}
        # the last step that reads each value, inside a control-flow body included
        last: dict[int, int] = {}
        self.last_read = last
        last_const: dict[int, tuple[int, Value]] = {}
        for i, node in enumerate(nodes):
            for v in [*node.inputs, *implicit.get(id(node), [])]:
                if v is not None and not v.is_const:
                    last[id(v)] = i
                elif v is not None:
                    last_const[id(v)] = (i, v)
        steps = []
        read_converted: dict[int, bool] = {}  # per constant, whether some node reads its converted copy
        for i, node in enumerate(nodes):
            kernel = (KERNELS.get(node.op_type) if node.domain in ("", "ai.onnx")
                      else MS_KERNELS.get(node.op_type) if node.domain == "com.microsoft" else None)
            if node.op_type in _SEQUENCE_OPS:
                raise InputError(self.graph.path, f"traced mode does not run sequence ops yet: node '{node.name}' "
                                                  f"({node.op_type}); audit it without --trace")
            # an omitted optional output (no name) holds nothing to measure
            outputs = [(id(v), self._held(v) if v.name else None) for v in node.outputs]
            step = _Step(node, kernel, list(node.inputs), outputs, self._stat_ctx(node), self._rounds(node, outputs))
            step.const_reads = [self._plan_const_read(v, node, read_converted) if v is not None and v.is_const else 0
                                for v in node.inputs]
            step.implicit = implicit.get(id(node), [])
            reads = [*node.inputs, *step.implicit]
            frees = [id(v) for v in reads if v is not None and last.get(id(v)) == i and id(v) not in kept]
            # an output nobody reads is measured, then dropped at once
            frees += [vid for vid, _ in outputs if vid not in last and vid not in kept]
            step.frees = list(dict.fromkeys(frees))
            step.frees_consts = list({id(v): v for v in reads if v is not None and v.is_const
                                      and last_const[id(v)][0] == i}.values())
            data = node.inputs[0] if node.inputs else None
            if (node.op_type in _REARRANGES and node.domain in ("", "ai.onnx") and len(outputs) == 1
                    and step.rounds == [None] and data is not None and not data.is_const):
                step.rearranges = id(data)
            steps.append(step)
        # implicit reads (an If body's) read the converted copy, as onnxruntime's rewritten bodies do
        for step in steps:
            for v in step.implicit:
                if v.is_const:
                    self._plan_const_read(v, step.node, read_converted)
        self._unconverted = {vid for vid, converted in read_converted.items() if not converted}
        return steps

    def _plan_const_read(self, value: Value, reader: Node, read_converted: dict[int, bool]) -> int:
        converted, clamp = self.const_read(value, reader)
        if clamp is not None:
            self._const_clamps[id(value)] = clamp
        read_converted[id(value)] = read_converted.get(id(value), False) or converted
        return 0 if converted else 1

    def _rounds(self, node: Node, outputs: list[tuple[int, Format | None]]) -> list[Format | None]:
        if node.op_type not in _MOVES_VALUES or node.domain not in ("", "ai.onnx"):
            return [fmt for _, fmt in outputs]
        held = {self._held(v) for v in node.inputs if v is not None and v.dtype in _FLOAT_DTYPES}
        return [None if fmt is not None and held == {fmt} else fmt for _, fmt in outputs]

    def _held(self, value: Value) -> Format | None:
        """The format a value is held in: the resolver's answer, except inside a --keep-fp32 block.

        A converter with an op block list casts only at the block's edges, so a value made by a kept node
        and read only by kept nodes stays float32.
        """
        held = self._held_cache.get(id(value), self)
        if held is self:
            held = self._held_cache[id(value)] = self._held_uncached(value)
        return cast("Format | None", held)  # (self only marks a value not seen yet, and is replaced above)

    def _held_uncached(self, value: Value) -> Format | None:
        node = value.producer
        dtype = self.resolver.of_value(value)
        if dtype is None and value.dtype is None and node is not None:
            dtype = self.resolver.of_node(node)
        if dtype is None:
            return None
        if (node is not None and self.resolver.kept_by(node)
                and all(self.resolver.kept_by(c) for c in value.consumers)
                and ((value.consumers and value not in self.graph.outputs)
                     or (self.resolver.keep_io and value in self.graph.outputs))):
            return FORMATS["fp32"]  # keep_io_types=True: a kept node's graph output stays float32 too
        if (node is None and self.resolver.keep_io and value in self.graph.inputs and value.consumers
                and all(self.resolver.kept_by(c) for c in value.consumers)):
            return FORMATS["fp32"]  # keep_io_types=True: a float32 input, cast only before readers not kept
        return dtype.fmt

    def stat_rounding(self, node: Node) -> Callable[[np.ndarray], np.ndarray]:
        """How a node rounds its inner statistics in the emulated run (identity when they are float32)."""
        return self._stat_ctx(node).round_stat

    def _stat_ctx(self, node: Node) -> KernelContext:
        """A fused norm computes its statistics in its stash_type dtype (float32 by default), not the input's."""
        since = _STASH_NORMS.get(node.op_type)
        if since is None or node.domain not in ("", "ai.onnx"):
            return self._emu_ctx
        stash = node.attrs.get("stash_type")
        if node.opset is not None and node.opset < since:
            dtype = self.resolver.of_node(node)
        else:
            dtype = self.resolver.of_stash(node, None if stash is None else int(stash), "")
        fmt = dtype.fmt if dtype is not None else None
        if fmt is None or fmt.name in ("fp32", "fp64"):
            return self._emu_ctx

        def round_stat(a: np.ndarray, f: Format = fmt) -> np.ndarray:
            return round_into(np.asarray(a), f)

        return KernelContext(np.float32, round_stat=round_stat)
