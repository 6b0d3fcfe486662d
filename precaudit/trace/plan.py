"""The step plan of a traced run: every node's kernel, compute spec, formats and frees, worked out once for both engines."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..analysis.compute_dtype import DtypeResolver
from ..converters import Clamp
from ..dtypes import COMPUTED, Format
from ..errors import InputError
from ..ir import Graph, Node, Value, implicit_inputs
from .formats import HeldFormats
from .kernels import KERNELS, MS_KERNELS, KernelContext
from .qdq import QDQ_KERNELS, TRT_KERNELS
from .spec import ComputeSpec, compute_spec, kernel_context

__all__ = ["Hook", "Plan", "Runner", "Step"]

# hook(ref_args, emu_args, ref_outs, emu_outs): a measurement taken while a node's inputs are still alive
Hook = Callable[[list, list, list, list], None]

# The numpy kernels of each domain (an op without one runs on onnx's reference evaluator, fallback.py).
_KERNELS = {"": {**KERNELS, **QDQ_KERNELS}, "ai.onnx": {**KERNELS, **QDQ_KERNELS},
            "com.microsoft": {**MS_KERNELS, **QDQ_KERNELS}, "trt": TRT_KERNELS}
# Ops whose outputs are some of their inputs' numbers, moved: rounding them again changes nothing when the
# inputs are already held in the output's format, so the hot path skips it.
_MOVES_VALUES = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Flatten", "Gather", "GatherElements",
                 "Slice", "Split", "Concat", "Expand", "Max", "Min", "Relu", "Neg", "Abs", "Where", "Dropout",
                 "ReduceMax", "ReduceMin"}
_SEQUENCE_OPS = {"SplitToSequence", "ConcatFromSequence", "SequenceConstruct", "SequenceAt", "SequenceInsert",
                 "SequenceErase", "SequenceLength", "SequenceEmpty", "SequenceMap"}
# Ops whose single output holds exactly the numbers of their first input, rearranged.
_REARRANGES = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Flatten"}


@dataclass
class Step:
    """One node, prepared once: its kernel, its compute spec, its inputs' and outputs' formats, and what it frees."""

    node: Node
    kernel: Callable | None
    spec: ComputeSpec
    inputs: list[Value | None]
    input_formats: list[Format | None]  # the format each input is held in (None: not a float, or omitted)
    outputs: list[tuple[int, Format | None]]  # (value id, the format it is held in)
    emu_ctx: KernelContext  # the numpy kernels' context for the emulated run, from the spec
    rounds: list[Format | None]  # the format each output is rounded into; None where it already holds it
    # per input, which copy of a constant the emulated run reads: 0 the converted one (rounded into its format,
    # clamped where the --converter clamps it), 1 the numbers as stored (a converter leaves it float32 here)
    const_reads: list[int] = field(default_factory=list)
    frees: list[int] = field(default_factory=list)  # values no later step reads
    frees_consts: list[Value] = field(default_factory=list)  # large constants this step is the last to read
    hooks: list[Hook] = field(default_factory=list)  # measurements of the node (Plan.attach)
    implicit: list[Value] = field(default_factory=list)  # outer values an If/Loop/Scan body reads by name
    # the value whose numbers this node only rearranges (a Reshape, a Transpose): its output's counts are
    # the input's, so a sample measured once is merged twice
    rearranges: int | None = None


class Runner(Protocol):
    """What an engine running a plan's steps needs from the run it serves: its constants, its measurements (with
    the frees after them), its budget of weights kept for the next sample, and its deadline."""

    reference: bool  # a float32 reference runs beside the emulation (False: a benchmark of the emulation alone)

    @property
    def final(self) -> bool:
        """The sample running is the last: nothing is kept for a next one."""

    def const(self, value: Value, which: int) -> np.ndarray:
        """A constant as a run reads it: which 0 the emulated copy (a step's const_reads says which), 1 the
        reference's."""

    def measure(self, step: Step, ref_args: list, emu_args: list, ref_outs: list, emu_outs: list) -> None:
        """Fold a step's outputs into the stats and call its hooks (args may be [] where nothing reads them)."""

    def free(self, step: Step, emu: dict, ref: dict) -> None:
        """Drop what the step was the last to read."""

    def may_hold(self, nbytes: int) -> bool:
        """Whether weights of nbytes may be kept for the next sample (and count them if so)."""

    def check_time(self, where: Node | None = None) -> None:
        """Raise past the run's deadline (--timeout)."""


class Plan:
    """Every step of a traced run in graph order, worked out once from the graph and the resolver.

    held(value) is the format a value is held in, spec(node) the node's compute spec (from compute_spec, the one
    place it is decided); const_clamps and unconverted say how constants are converted (Plan.const_read per reader).
    """

    def __init__(self, graph: Graph, resolver: DtypeResolver):
        self.graph = graph
        self.resolver = resolver
        self.formats = HeldFormats(graph, resolver)
        self.graph_input_formats = {id(v): self.held(v) for v in graph.inputs}  # None: not a float
        # constants whose converted copy the --converter clamps (Clamp.array before rounding), and those no node
        # reads converted (their emulated copy is never made)
        self.const_clamps: dict[int, Clamp] = {}
        self.unconverted: set[int] = set()
        self.last_read: dict[int, int] = {}  # per value steps read (not a constant), the last step that reads it
        self._specs: dict[int, ComputeSpec] = {}
        self.steps = self._build()

    def held(self, value: Value) -> Format | None:
        """The format a value is held in during the emulated run (None: not a float)."""
        return self.formats.of(value)

    def const_read(self, value: Value, reader: Node) -> tuple[bool, Clamp | None]:
        """How `reader` reads a constant in the emulated run: (converted, clamp); see HeldFormats.const_read."""
        return self.formats.const_read(value, reader)

    def spec(self, node: Node) -> ComputeSpec:
        """A node's compute spec (a node inside a control-flow body too), decided once."""
        spec = self._specs.get(id(node))
        if spec is None:
            spec = self._specs[id(node)] = compute_spec(node, self.resolver)
        return spec

    def stat_rounding(self, node: Node) -> Callable[[np.ndarray], np.ndarray]:
        """How a node rounds its inner statistics in the emulated run (identity when they are float32)."""
        return kernel_context(self.spec(node)).round_stat

    def attach(self, hooks: dict[int, list[Hook]]) -> None:
        """Each step's measurements, from hooks keyed by id(node) (attached after the plan is made)."""
        for step in self.steps:
            step.hooks = hooks.get(id(step.node), [])

    def _build(self) -> list[Step]:
        # nodes inside If/Loop/Scan bodies run with their control-flow node, which reads what they read outside
        nodes = [n for n in self.graph.nodes
                 if not n.subgraph_path and (not all(o.is_const for o in n.outputs) or not n.outputs)]
        implicit = {id(n): implicit_inputs(n) for n in nodes if n.bodies}
        last_const = self._last_reads(nodes, implicit)
        kept = {id(v) for v in self.graph.outputs}
        read_converted: dict[int, bool] = {}  # per constant, whether some node reads its converted copy
        steps = []
        for i, node in enumerate(nodes):
            step = self._step(node, read_converted)
            step.implicit = implicit.get(id(node), [])
            reads = [*node.inputs, *step.implicit]
            frees = [id(v) for v in reads if v is not None and self.last_read.get(id(v)) == i and id(v) not in kept]
            # an output nobody reads is measured, then dropped at once
            frees += [vid for vid, _ in step.outputs if vid not in self.last_read and vid not in kept]
            step.frees = list(dict.fromkeys(frees))
            step.frees_consts = list({id(v): v for v in reads if v is not None and v.is_const
                                      and last_const[id(v)] == i}.values())
            steps.append(step)
        # implicit reads (an If body's) read the converted copy, as onnxruntime's rewritten bodies do
        for step in steps:
            for v in step.implicit:
                if v.is_const:
                    self._const_read(v, step.node, read_converted)
        self.unconverted = {vid for vid, converted in read_converted.items() if not converted}
        return steps

    def _last_reads(self, nodes: list[Node], implicit: dict[int, list[Value]]) -> dict[int, int]:
        """The last step that reads each value (into last_read) and each constant (returned), bodies included."""
        last_const: dict[int, int] = {}
        for i, node in enumerate(nodes):
            for v in [*node.inputs, *implicit.get(id(node), [])]:
                if v is not None and not v.is_const:
                    self.last_read[id(v)] = i
                elif v is not None:
                    last_const[id(v)] = i
        return last_const

    def _step(self, node: Node, read_converted: dict[int, bool]) -> Step:
        kernel = _KERNELS.get(node.domain, {}).get(node.op_type)
        if node.op_type in _SEQUENCE_OPS:
            raise InputError(self.graph.path, f"traced mode does not run sequence ops yet: node '{node.name}' "
                                              f"({node.op_type}); audit it without --trace")
        held = self.formats.of
        # an omitted optional output (no name) holds nothing to measure
        outputs = [(id(v), held(v) if v.name else None) for v in node.outputs]
        spec = self.spec(node)
        input_formats = [None if v is None else held(v) for v in node.inputs]
        step = Step(node, kernel, spec, list(node.inputs), input_formats, outputs, kernel_context(spec),
                    self._rounds(node, input_formats, outputs))
        step.const_reads = [self._const_read(v, node, read_converted) if v is not None and v.is_const else 0
                            for v in node.inputs]
        data = node.inputs[0] if node.inputs else None
        if (node.op_type in _REARRANGES and node.domain in ("", "ai.onnx") and len(outputs) == 1
                and step.rounds == [None] and data is not None and not data.is_const):
            step.rearranges = id(data)
        return step

    def _const_read(self, value: Value, reader: Node, read_converted: dict[int, bool]) -> int:
        converted, clamp = self.formats.const_read(value, reader)
        if clamp is not None:
            self.const_clamps[id(value)] = clamp
        read_converted[id(value)] = read_converted.get(id(value), False) or converted
        return 0 if converted else 1

    @staticmethod
    def _rounds(node: Node, input_formats: list[Format | None],
                outputs: list[tuple[int, Format | None]]) -> list[Format | None]:
        if node.op_type not in _MOVES_VALUES or node.domain not in ("", "ai.onnx"):
            return [fmt for _, fmt in outputs]
        held = {fmt for v, fmt in zip(node.inputs, input_formats) if v is not None and v.dtype in COMPUTED}
        return [None if fmt is not None and held == {fmt} else fmt for _, fmt in outputs]
