"""Which dtype a value is held in, and a node computes in, when the model runs at the target dtype — and why.

What a float32 island is (the rules `DtypeResolver` applies; docs/dtypes.md gives the converter
code they rest on):

- An island starts at a ``Cast`` that really widens an activation: its input is a float tensor stored in a
  format the Cast's ``to`` holds exactly and more (float16/bfloat16 → float32, float32 → float64) and is no
  constant. A Cast to the dtype its input already has (``.float()`` / ``.to(dtype)`` in a float32 export) is a
  no-op, no island; a narrowing Cast (float32 → float16, float64 → float32) ends one.
- An island flows through every node that reads it, unless the node also reads an activation stored in the
  island's dtype but held in the target dtype: a float32 value outside any island, which a converter retypes
  (a residual ``Add`` of the upcast branch and the float32-stored stream). That node runs in the target dtype,
  so the island ends there. Constants (weights, an eps) never end one, nor do fills: values whose float content
  all comes from the file (``Where(mask, 0, -inf)``, ``ConstantOfShape``), as attention-mask biases are made.
  Nor does a value stored in a narrower dtype: the graph itself mixes them, and in a captured PyTorch module
  float16 * float32 computes in float32 (type promotion); an ONNX node cannot mix them at all.
- A no-op Cast, and the place an island ended, are remembered only to explain a finding's reason (why the
  float32 a reader sees upstream does not count); such a note flows the way an island would.
- A node kept by ``--keep-fp32`` computes in float32, and a converter casts its outputs back to the target dtype.
- With a converter model (``--converter``, precaudit/converters): the nodes it keeps by default (its op block
  list, modelopt's fused LayerNorms) compute in float32 like kept ones; a control-flow node kept in float32 keeps
  its bodies too (converters do not descend into a blocked node's bodies); a ``Cast(to=float32)`` outside the
  block list starts no island (every converter rewrites, retypes or removes it); and the constants it converts
  are clamped its way (``ComputeDtype.clamp``, applied where an eps or constant is rounded).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from ..converters import Clamp, Converter, converter_named
from ..dtypes import COMPUTED, FORMATS, Format, format_of_onnx_type, round_to_format
from ..errors import InputError
from ..ir import Graph, Node, Value, implicit_inputs
from .constants import is_constant
from .stored import stored_in_target

if TYPE_CHECKING:
    from ..runtime.base import Fact, Kernel, Runtime

__all__ = ["ComputeDtype", "DtypeResolver"]

_FLOAT_NAMES = COMPUTED
_NOT_KEPT: tuple[str | None, str] = (None, "")
# An embedding lookup reads a weight table, but what it returns is the activation stream, not a fill.
_LOOKUPS = {"Gather", "GatherElements", "GatherND"}
# Ops that make a float tensor from no float input, with values fixed by the file.
_FILLS = {"ConstantOfShape", "EyeLike"}


@dataclass(frozen=True)
class ComputeDtype:
    """A format together with the reason it applies, as a finding prints it."""

    fmt: Format
    reason: str
    clamp: Clamp | None = None  # what the converter does to a constant it converts into this dtype
    # the format constants reach the node in, where the runtime computes in a wider one than it stores (onnxruntime
    # CPU runs a float16 Add in float32, but its eps was stored in float16: 1e-12 is 0.0 all the same)
    stored: Format | None = None
    fact: Fact | None = None  # the runtime fact the dtype rests on, if a runtime decided it
    # a node's dtype only: the runtime's kernel, where it reads, writes or normalizes in formats of its own
    kernel: Kernel | None = None

    def constant(self, value: float, source: str = "initializer") -> float:
        """A constant (stored as `source`, a const_origin) as the converter leaves it, before rounding."""
        return self.clamp.apply(value) if self.clamp is not None and self.clamp.applies_to(source) else value

    def rounded_constant(self, value: float, source: str = "initializer") -> float:
        """A constant as a node computing in this dtype sees it: clamped by the converter, rounded into the format it
        is stored in, then into this one."""
        value = self.constant(value, source)
        if self.stored is not None:
            value = round_to_format(value, self.stored)
        return round_to_format(value, self.fmt)


@dataclass(frozen=True)
class _Origin:
    """The Cast a value descends from, and what it means for the value.

    kind: "island" (the Cast widened an activation: it is held in `to`), "cast" (it narrowed or changed it: a
    value stored in `to` says so in its reason), or a note that only explains a reason: "noop" (the Cast changed
    nothing), "ended" (the island from the Cast ended at `ended_at`, which also read `ended_by`), "converted"
    (the converter rewrites, retypes or removes the widening Cast).
    """

    cast: str  # the Cast node's name
    to: str  # the format it cast to
    kind: str
    ended_at: str = ""
    ended_by: str = ""

    @property
    def island(self) -> bool:
        return self.kind == "island"


_MAX_GLOBS = 1000


class DtypeResolver:
    """Maps the stored graph onto a run at the target dtype.

    A tensor stored in float32 runs in the target dtype (what an fp16 converter does), unless it lies in a
    float32 island (downstream of a Cast that really widens an activation, up to a node that also reads a
    target-dtype activation) or comes out of a node the user keeps in float32. Tensors stored in another float
    type (an fp16 model, a Cast to double) keep it. A model already converted to the target's narrow format runs
    as written, so its float32 tensors (an fp32 constant inside an fp32 island) stay float32.
    """

    def __init__(self, graph: Graph, target: Format, keep_fp32: list[str] | tuple[str, ...] = (),
                 converter: str | Converter | None = None, keep_nodes: tuple[Node, ...] | list[Node] = (),
                 keep_io: bool = False, runtime: Runtime | None = None, retarget: Fact | None = None):
        self.graph = graph
        # the runtime that runs the converted graph (--runtime): how each kernel really computes; retarget: why
        # target is not the --dtype asked for (a runtime that runs float32 graphs in float16)
        self.runtime = runtime
        self.retarget = retarget
        self._held: dict[int, tuple[str, Fact] | None] = {}
        self._fused: dict[int, Kernel] | None = None
        # the converter keeps the graph's float inputs and outputs float32 (keep_io_types=True): an input only kept
        # nodes read reaches them unrounded (a keep-list under test sets it)
        self.keep_io = keep_io
        self.target = target
        self.keep_fp32 = list(keep_fp32)
        # op types and names are looked up; only entries with * ? or [ are matched one by one, at most _MAX_GLOBS
        # of them (600,000 globs against every node took minutes)
        self._literal: dict[str, int] = {}
        self._globs: list[tuple[int, str]] = []
        for i, pattern in enumerate(self.keep_fp32):
            if any(c in pattern for c in "*?["):
                self._globs.append((i, pattern))
            else:
                self._literal.setdefault(pattern, i)
        if len(self._globs) > _MAX_GLOBS:
            from ..errors import InputError

            raise InputError(None, f"--keep-fp32: {len(self._globs):,} patterns with * ? or [; at most "
                                   f"{_MAX_GLOBS:,} (name the nodes themselves: names are looked up, any number)")
        # a block-scaled target (--dtype mxfp8) rounds only what MatMul, Gemm and Conv read, in traced mode: the
        # values of the graph stay as they are stored
        rounds_values = target.is_narrow and not target.blocked
        self.converted = rounds_values and graph.converted_to is None and stored_in_target(graph, target)
        self.converter = converter_named(converter)
        # the converter runs only on a float32 model being narrowed: not on one already converted, nor in float32
        narrowing = rounds_values and not self.converted
        if not self.converter.plain and narrowing:
            _check_converter(graph, target, self.converter)
        self.converting = narrowing and self.converter.applies(target)
        self.clamp = self.converter.clamp(target) if self.converting else None
        if self.clamp is None and runtime is not None and narrowing:
            self.clamp = runtime.clamp(target)
        self._blocked = self.converter.blocked(graph, target) if self.converting else {}
        self._keep_nodes = {id(n) for n in keep_nodes}  # nodes a keep-list under test keeps (exact, no globs)
        self._origin: dict[int, _Origin] = {}  # id(value) -> the Cast it descends from
        self._ends_at: dict[int, tuple[_Origin, Value, ComputeDtype]] = {}  # id(node) -> island, activation, dtype
        self._fills: set[int] = set()  # id(value) of values whose float content all comes from the file
        # nothing keeps a node in float32 (no --keep-fp32, keep-list or converter block list): _kept is (None, "")
        self._keeps_none = not self.keep_fp32 and not self._keep_nodes and not self._blocked
        self._kept_memo: dict[Node, tuple[str | None, str]] = {}
        self._node_memo: dict[Node, ComputeDtype | None] = {}  # of_node, once the islands are known
        self._ready = False
        self._propagate_casts()
        self._ready = True

    def kept_by(self, node: Node) -> str | None:
        """What keeps this node in float32, if anything: a --keep-fp32 entry (op type, node name or glob), the
        keep-list under test, the converter's default block list; or the same for the control-flow node whose
        body holds it (a converter leaves a blocked node's bodies in float32)."""
        return self._kept(node)[0]

    def _kept(self, node: Node) -> tuple[str | None, str]:
        """(the entry that keeps the node, the reason a finding prints), or (None, "")."""
        if self._keeps_none:
            return _NOT_KEPT
        found = self._kept_memo.get(node)
        if found is None:
            found = self._kept_memo[node] = self._find_keeper(node)
        return found

    def _find_keeper(self, node: Node) -> tuple[str | None, str]:
        inner: Node | None = node
        literal = self._literal
        while inner is not None:
            # the first entry that matches, as the list is written: a looked-up name or op type, or an earlier glob
            hits = [literal[k] for k in (inner.op_type, inner.name, inner.scope) if k is not None and k in literal]
            first = min(hits) if hits else None
            for i, pattern in self._globs:
                if first is not None and i > first:
                    break
                if fnmatchcase(inner.name, pattern) or (inner.scope and fnmatchcase(inner.scope, pattern)):
                    first = i
                    break
            if first is not None:
                pattern = self.keep_fp32[first]
                return pattern, self._within(node, inner, f"kept in float32 by --keep-fp32 {pattern}")
            if id(inner) in self._keep_nodes:
                return "keep-list", self._within(node, inner, "kept in float32 by the keep-list")
            blocked = self._blocked.get(id(inner))
            if blocked is not None:
                return blocked, self._within(node, inner, blocked)
            inner = inner.parent
        return _NOT_KEPT

    @staticmethod
    def _within(node: Node, keeper: Node, reason: str) -> str:
        return reason if keeper is node else f"inside '{keeper.name}' ({keeper.op_type}), {reason}"

    def of_value(self, value: Value) -> ComputeDtype | None:
        """The dtype a float value is held in during the audited run; None for non-float values. A runtime may hold
        in float32 what the converted graph stores narrow (onnxruntime CPU between its cast-wrapped kernels), or
        narrower than it is stored (OpenVINO CPU holds what passes between its kernels in bfloat16)."""
        stored = self._stored(value)
        runtime = self.runtime
        if runtime is None or stored is None or not self._ready or stored.fmt.name == "fp64":
            return stored
        key = id(value)
        if key not in self._held:
            fused = self._inside_fused(value)
            self._held[key] = ("fp32", fused) if fused is not None else runtime.held_in(value, stored.fmt, self.graph)
        held = self._held[key]
        if held is None or held[0] == stored.fmt.name:
            return stored
        fmt, fact = FORMATS[held[0]], held[1]
        return ComputeDtype(fmt, f"{runtime.label}: {fact.says}", stored.clamp, stored=stored.fmt, fact=fact)

    def _inside_fused(self, value: Value) -> Fact | None:
        """A value made and read only inside one fused chain never leaves the kernel: it is never rounded."""
        fused = self._fused_chains()
        made = fused.get(id(value.producer)) if value.producer is not None else None
        if made is None or made.statistics == "input" or not value.consumers or value in self.graph.outputs:
            return None
        return made.fact if all(fused.get(id(c)) is made for c in value.consumers) else None

    def _stored(self, value: Value) -> ComputeDtype | None:
        """The dtype the converted graph stores a float value in (the converter's view, before the runtime's)."""
        if value.dtype not in _FLOAT_NAMES:
            return None
        if value.dtype_note is not None:
            return ComputeDtype(FORMATS[value.dtype], value.dtype_note)
        origin = self._origin.get(id(value))
        island = origin if origin is not None and origin.island else None
        if value.dtype != "fp32":
            return self._stored_as_is(value.dtype, origin)
        if self.target.name == "fp32":
            return ComputeDtype(self.target, "model stored in float32, --dtype fp32")
        if self.target.blocked:
            return ComputeDtype(FORMATS["fp32"], f"--dtype {self.target.name} quantizes what MatMul, Gemm and Conv "
                                                 f"read; the rest runs as stored, in float32")
        if value.parent is not None:  # made inside an If/Loop/Scan body: a kept control-flow node keeps it all
            keeper, reason = self._kept(value.parent)
            if keeper is not None:
                return ComputeDtype(FORMATS["fp32"], f"made inside '{value.parent.name}' ({value.parent.op_type}), "
                                                     f"{reason}")
        if island is not None and island.to == "fp32":
            # a Cast that widens an activation marks an intended float32 island (HF RMSNorm, T5 LayerNorm)
            return ComputeDtype(FORMATS["fp32"], f"after Cast to float32 at node '{island.cast}'")
        if self.converted:
            return ComputeDtype(FORMATS["fp32"], f"stored in float32 in a model stored in {self.target.long_name}")
        return ComputeDtype(self.target, self._cast_back(value) or self._why_target(origin), self.clamp)

    def _cast_back(self, value: Value) -> str | None:
        """Why the output of a node kept by --keep-fp32 or a keep-list is held in the target dtype: the converter
        casts it down for a reader it converts (a kept Cast of an int32 accumulator overflows there all the same)."""
        maker = value.producer
        if self._keeps_none or maker is None or maker.op_type == "Constant":
            return None
        keeper, reason = self._kept(maker)
        if keeper is None or keeper == self._blocked.get(id(maker)):  # (not the converter's own list: it says so)
            return None
        reader = next((c for c in value.consumers if self._kept(c)[0] is None), None)
        if reader is None:
            return None
        return (f"made by '{maker.name}', {reason}; the converter casts its output to {self.target.long_name} for "
                f"'{reader.name}' ({reader.op_type}), which it converts")

    def _stored_as_is(self, dtype: str, origin: _Origin | None) -> ComputeDtype:
        """A value the graph stores in a float type other than float32: held as it is."""
        fmt = FORMATS[dtype]
        if origin is not None and origin.kind in ("island", "cast") and origin.to == dtype:
            return ComputeDtype(fmt, f"after Cast to {fmt.long_name} at node '{origin.cast}'")
        if self.graph.converted_to == dtype:
            return ComputeDtype(fmt, f"--dtype {fmt.name}: the module was converted with model.to({fmt.long_name})")
        return ComputeDtype(fmt, f"model stored in {fmt.long_name}")

    def _why_target(self, origin: _Origin | None) -> str:
        """Why a float32 value runs in the target format, and why an upcast before it does not count."""
        converter = f" converted by {self.converter.title}" if self.converting else ""
        why = f"--dtype {self.target.name}: float32 tensors run as {self.target.long_name}{converter}"
        if self.retarget is not None and self.runtime is not None:
            why = f"{self.runtime.label}: {self.retarget.says}"
        if origin is not None and origin.kind == "noop" and origin.to == "fp32":
            why += f" (the Cast to float32 at '{origin.cast}' is a no-op: its input is already float32)"
        elif origin is not None and origin.kind == "ended":
            why += (f" (the {FORMATS[origin.to].long_name} island after Cast '{origin.cast}' ends at "
                    f"'{origin.ended_at}', which also reads '{origin.ended_by}')")
        elif origin is not None and origin.kind == "converted":
            why += f" (the Cast to float32 at '{origin.cast}' starts no island: the converter {self.converter.upcast})"
        return why

    def of_node(self, node: Node) -> ComputeDtype | None:
        """The dtype a node computes in: its kept-fp32 status, else the dtype of its first float input (the
        target-dtype activation where a float32 island ends at the node).

        Worked out once per node (each kind of site asks), when the islands are known: after __init__.
        """
        memo = self._node_memo
        if node in memo:
            return memo[node]
        dtype = self._of_node(node)
        if self._ready:
            memo[node] = dtype
        return dtype

    def _of_node(self, node: Node) -> ComputeDtype | None:
        pattern, reason = self._kept(node)
        if pattern is not None:
            return ComputeDtype(FORMATS["fp32"], reason)
        end = self._ends_at.get(id(node))
        if end is not None:
            island, other, dtype = end
            return ComputeDtype(dtype.fmt, f"the {FORMATS[island.to].long_name} island after Cast '{island.cast}' ends "
                                           f"here: '{node.name}' also reads '{other.name}', held in "
                                           f"{dtype.fmt.long_name} ({dtype.reason})")
        for value in node.inputs:
            if value is not None:
                found = self._stored(value)
                if found is not None:
                    return self._run(node, found)
        return None

    def _run(self, node: Node, held: ComputeDtype) -> ComputeDtype:
        """The dtype the runtime's kernel really computes in, for a node whose inputs are held in `held`."""
        runtime = self.runtime
        if runtime is None:
            return held
        fused = self._fused_chains().get(id(node))
        if fused is not None:  # one fused LayerNorm kernel computes the whole chain in its statistics' dtype
            fmt = held.fmt if fused.statistics == "input" else FORMATS[fused.statistics or held.fmt.name]
            return ComputeDtype(fmt, f"{runtime.label}: {fused.fact.says}", held.clamp,
                                stored=held.stored or (held.fmt if fmt is not held.fmt else None), fact=fused.fact)
        kernel = runtime.kernel(node, held.fmt, self.graph)
        if kernel is None or ((kernel.compute is None or kernel.compute == held.fmt.name) and not kernel.converts):
            return held
        fmt = FORMATS[kernel.compute or held.fmt.name]
        stored = None if kernel.keeps_constants else held.stored or (held.fmt if fmt is not held.fmt else None)
        return ComputeDtype(fmt, f"{runtime.label}: {kernel.fact.says}",
                            None if kernel.keeps_constants else held.clamp, stored=stored, fact=kernel.fact,
                            kernel=kernel if kernel.converts else None)

    def of_stash(self, node: Node, stash_type: int | None, default_note: str) -> ComputeDtype | None:
        """Compute dtype of a norm op that carries its own statistics dtype (stash_type), unless the runtime's kernel
        decides it otherwise."""
        pattern, reason = self._kept(node)
        if pattern is not None:
            return ComputeDtype(FORMATS["fp32"], reason)
        decided = self.statistics_by_runtime(node)
        if decided is not None:
            return decided
        if stash_type is None:
            return ComputeDtype(FORMATS["fp32"], f"stash_type absent: default 1 (float32){default_note}")
        fmt = format_of_onnx_type(stash_type)
        if fmt is None:  # 0 (undefined) or a non-float type: the statistics stay in the input dtype
            inner = self.of_node(node)
            if inner is None:
                return None
            return ComputeDtype(inner.fmt, f"stash_type={stash_type} is no float type, so the input dtype applies: {inner.reason}")
        return ComputeDtype(fmt, f"stash_type={stash_type} ({fmt.long_name})")

    def _fused_chains(self) -> dict[int, Kernel]:
        """id(node) → the kernel a runtime fuses its decomposed LayerNorm chain into (runtime/fusion.py)."""
        if self._fused is None:
            self._fused = {}
            if self.runtime is not None:
                from ..runtime.fusion import layer_norm_chains

                for chain in layer_norm_chains(self.graph):
                    kernel = self.runtime.fuses_layer_norm(chain[-2], self.graph)  # (the Sqrt)
                    if kernel is not None and not any(self._kept(n)[0] for n in chain):
                        self._fused.update((id(n), kernel) for n in chain)
        return self._fused

    def statistics_by_runtime(self, node: Node) -> ComputeDtype | None:
        """The dtype a fused normalization's kernel keeps its statistics in at this runtime; None: as the op says."""
        runtime = self.runtime
        held = None
        for value in node.inputs:
            held = self._stored(value) if value is not None else None
            if held is not None:
                break
        if runtime is None or held is None or self._kept(node)[0] is not None:
            return None
        kernel = runtime.kernel(node, held.fmt, self.graph)
        if kernel is None or kernel.statistics is None:
            return None
        fmt = held.fmt if kernel.statistics == "input" else FORMATS[kernel.statistics]
        return ComputeDtype(fmt, f"{runtime.label}: {kernel.fact.says}", held.clamp,
                            stored=held.fmt if fmt is not held.fmt else None, fact=kernel.fact)

    def _propagate_casts(self) -> None:
        """Mark, in graph order, the values each island (and each no-op Cast's note) reaches.

        One tight pass (tens of thousands of nodes): each read's constness is worked out once (constants.py), and
        a node none of whose live reads carries an origin (most nodes) costs a lookup per read.
        """
        origin_of = self._origin
        fills = self._fills
        floats = _FLOAT_NAMES
        for node in self.graph.nodes:
            # an If's data comes into its branches by name, not as inputs: those values count too
            reads = [v for v in ([*node.inputs, *implicit_inputs(node)] if node.bodies else node.inputs)
                     if v is not None and v.dtype in floats]
            live = [v for v in reads if not is_constant(v)]
            # A mask bias built from constants (Where(mask, 0, -inf), a ConstantOfShape fill) is no activation.
            op = node.op_type
            if op in _FILLS or (reads and op not in _LOOKUPS and fills.issuperset(map(id, live))):
                fills.update(id(out) for out in node.outputs)
            if op == "Cast":
                origin = self._cast_origin(node)
            elif not self._keeps_none and self.kept_by(node) is not None:
                origin = None  # a converter casts a kept node's outputs back to the target dtype
            elif not live:
                origin = None
            else:
                origins = [origin_of.get(id(v)) for v in live]
                origin = None if origins.count(None) == len(origins) else self._carried(node, live, origins)
            if origin is not None:
                for out in node.outputs:
                    origin_of[id(out)] = origin

    def _cast_origin(self, node: Node) -> _Origin | None:
        """A Cast that widens an activation starts an island; a no-op one passes on what its input carries."""
        fmt = format_of_onnx_type(node.attr("to", 0))
        source = node.input(0)
        # casting a constant (an eps) says nothing about the dtype the activations flow in, and casting ints or
        # bools (a mask, positions) to float32 is no upcast of activations
        if fmt is None or source is None or source.dtype not in _FLOAT_NAMES or is_constant(source):
            return None
        if source.dtype == fmt.name:  # .float() of a float32 value: an island passes on unchanged
            inherited = self._origin.get(id(source))
            if inherited is not None and inherited.kind in ("island", "cast"):
                return inherited
            return _Origin(node.name, fmt.name, "noop")
        # a narrowing Cast ends the island its input was in: what it makes is held as it is stored
        widens = _widens(FORMATS[source.dtype], fmt)
        if widens and self.converting and fmt.name == "fp32" and self.kept_by(node) is None:
            return _Origin(node.name, fmt.name, "converted")  # no converter keeps an upcast outside its block list
        return _Origin(node.name, fmt.name, "island" if widens else "cast")

    def _carried(self, node: Node, reads: list[Value], origins: list[_Origin | None]) -> _Origin | None:
        """What a node's outputs descend from: the island (else the note) among its float non-constant reads (and
        their origins, one not None), unless it also reads an activation stored in the island's dtype, held in the
        target dtype outside it."""
        carried = None
        for origin in origins:  # the first island, else the first origin
            if origin is not None:
                if origin.kind == "island":
                    carried = origin
                    break
                if carried is None:
                    carried = origin
        if carried is None or (carried.kind == "island" and carried.to == self.target.name):
            return carried  # (in an audit at float32 an island has no narrower dtype to end in)
        island = carried.kind == "island"
        fills = self._fills
        for value, origin in zip(reads, origins):
            if (origin is not None and (origin.kind == "island") == island) or id(value) in fills \
                    or value.dtype != carried.to:
                continue
            dtype = self._stored(value)
            if dtype is not None and dtype.fmt.name == self.target.name:
                if not carried.island:
                    return None  # a note (or a narrowed value's reason) goes no further than an island would
                self._ends_at[id(node)] = (carried, value, dtype)
                return _Origin(carried.cast, carried.to, "ended", ended_at=node.name, ended_by=value.name)
        return carried


def _check_converter(graph: Graph, target: Format, converter: Converter) -> None:
    """A converter model applies to ONNX graphs it can convert to the target; anything else is a usage error."""
    if graph.converted_to is not None:
        raise InputError(graph.path, f"--converter {converter.name} models an ONNX converter; a PyTorch model is "
                                     f"audited as model.to({target.long_name}) (audit its ONNX export instead)")
    if target.name not in converter.targets:
        names = " and ".join(FORMATS[t].long_name for t in converter.targets)
        raise InputError(graph.path, f"--converter {converter.name}: {converter.title} converts to {names} only, "
                                     f"not {target.long_name}")


def _widens(source: Format, to: Format) -> bool:
    """Whether `to` holds every value of `source`, and more: float16/bfloat16 → float32, float32 → float64."""
    return (source.name != to.name and to.max >= source.max and to.smallest_subnormal <= source.smallest_subnormal
            and to.ulp_at_1 <= source.ulp_at_1)
