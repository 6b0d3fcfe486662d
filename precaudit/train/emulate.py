"""Run a captured loss forward, backward and through the optimizer step, every ATen op rounded as a GPU runs it.

RoundingMode sits at the dispatcher, below autograd, so it sees the backward's ops and the optimizer's as well
as the forward's. An op with a float16 or bfloat16 input computes in float32 on copies of its inputs, and its
outputs are rounded once into the dtype the op returns for those inputs (read from torch's meta kernels, once per
op and dtype signature): what CUDA's kernels do, which accumulate in float32 and round the result. CPU half
kernels are not used for it: several keep float16 partial sums or upcast and return float32. Ops that write into
their own tensors (the optimizer's add_, lerp_, addcdiv_), views and casts run as they are: they round once into
the tensor they write. Random ops draw from the upcast copy, so dropout's masks match the float32 reference's.

A Recorder counts the ops, and watches what it is asked to: the largest |value| the backward makes in a
low-precision dtype (the top of the loss-scale window), and (events) the first op whose output turns inf/NaN from
finite inputs, with the phase, the autograd node running it and the forward op that node belongs to. A step is
run watching no events: a finiteness check of every op's output costs more than the emulation; where its result
is not finite, the step runs again to name where that began.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["LOW_DTYPES", "Event", "Recorder", "RoundingMode", "SameDrawsMode", "all_finite", "run_loss"]

LOW_DTYPES = (torch.float16, torch.bfloat16)
_META_FAILED = object()
_TAG = "precaudit_fx"  # the key each forward op's autograd node carries its fx node's name under


@dataclass
class Event:
    """An op whose output went inf/NaN while its inputs were finite."""

    op: str  # the ATen op: 'aten.mm.default'
    phase: str  # 'forward', 'backward' or 'optimizer step'
    autograd_node: str | None  # 'AddmmBackward0' in the backward
    fx_node: str | None  # the forward op it belongs to (the captured program's node name)
    dtype: str  # what the output is held in
    fraction: float  # its share of inf/NaN elements
    input_absmax: float

    @property
    def key(self) -> tuple[str, str | None, str]:
        """Where it happened, as the float32 reference's run of the same program names it."""
        return self.phase, self.fx_node, self.op


_MAX_EVENTS = 64  # enough to step past the float32 program's own infs (masks, log(0)) to the regime's first


class Recorder:
    def __init__(self, events: bool = False, watch_backward_max: bool = False):
        self.phase = "forward"
        self.record = events
        self.events: list[Event] = []  # in order: ops whose output turned inf/NaN from finite inputs
        self.current_fx: str | None = None  # the forward node the interpreter is running
        self.watch_backward_max = watch_backward_max
        self.backward_low_max = 0.0  # the largest |value| a backward op returned in float16/bfloat16
        self.ops = 0

    def first_beyond(self, expected: set) -> Event | None:
        """The first event float32's own run of the program does not have (T5's log(0), a mask's -inf fill)."""
        return next((e for e in self.events if e.key not in expected), None)

    def observe(self, func, args, kwargs, out) -> None:
        self.ops += 1
        if not (self.record or self.watch_backward_max):
            return
        if func._schema.name in _UNINITIALIZED:
            return  # memory not yet written (dropout's mask before bernoulli_ fills it): its bits mean nothing
        node = torch._C._current_autograd_node()
        phase = "backward" if node is not None else self.phase
        outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()
                and t.numel()]
        # gradients only: a view in the backward (the transpose of a saved weight) carries forward values
        watch = phase == "backward" and self.watch_backward_max and not func.is_view
        if not self.record:
            if watch:
                self._watch_max(outs)
            return
        full = len(self.events) >= _MAX_EVENTS
        if (full and not watch) or not outs:
            return
        bad = []
        for t in outs:
            if watch and t.dtype in LOW_DTYPES:
                finite, absmax = _finite_absmax(t)
                # an inf counts (no scale keeps that backward finite); a NaN compares False and does not
                self.backward_low_max = max(self.backward_low_max, absmax)
            else:
                finite = all_finite(t)
            if not finite:
                bad.append(t)
        if full or not bad:
            return
        # an in-place op's own tensor is an input already overwritten: judge the inputs it read, not that one
        leaves = pytree.tree_leaves((args, kwargs))
        ins = [t for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel()
               and not any(t is o for o in outs)]
        if any(not all_finite(t) for t in ins):
            return  # it only carries an inf/NaN made before it
        if any(isinstance(a, float) and not math.isfinite(a) for a in leaves):
            return  # an inf the program asked for: a mask's fill value, scalar_tensor(-inf)
        t = bad[0]
        # the node's metadata dict (typed as a method in torch's stubs)
        fx = _metadata(node).get(_TAG) if node is not None else self.current_fx
        self.events.append(Event(str(func), phase, node.name() if node is not None else None, fx,
                                 str(t.dtype).replace("torch.", ""), float((~torch.isfinite(t)).float().mean()),
                                 max((_finite_absmax(i)[1] for i in ins), default=0.0)))

    def _watch_max(self, outs: list[torch.Tensor]) -> None:
        for t in outs:
            if t.dtype in LOW_DTYPES:
                # max keeps its first argument where the other is NaN: a NaN sets no top
                self.backward_low_max = max(self.backward_low_max, _finite_absmax(t)[1])


def _metadata(node: Any) -> dict:
    return node.metadata


_UNINITIALIZED = {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
                  "aten::new_empty_strided", "aten::empty_permuted"}


def all_finite(t: torch.Tensor) -> bool:
    """Every element finite. A float32 tensor whose sum is finite has no inf or NaN (either would make the sum
    one): one read, no mask; a sum that overflows is checked element by element."""
    if not t.numel():
        return True
    if t.dtype in (torch.float32, torch.float64) and math.isfinite(float(t.detach().sum())):
        return True
    return _finite_absmax(t)[0]


def _finite_absmax(t: torch.Tensor) -> tuple[bool, float]:
    """Whether every element is finite, and the largest |element| (inf with an inf, NaN with a NaN): one pass
    (aminmax), where isfinite(t).all() would write a mask as large as t first. A NaN makes both ends NaN."""
    try:
        low, high = torch.aminmax(t.detach())
    except RuntimeError:  # a dtype with no aminmax kernel (float8): the same answer through float32
        low, high = torch.aminmax(t.detach().float())
    lo, hi = float(low), float(high)
    if math.isnan(lo):
        return False, math.nan
    return math.isfinite(lo) and math.isfinite(hi), max(-lo, hi)


class RoundingMode(TorchDispatchMode):
    """Every op with a low-precision input computed in float32 and rounded into its own output dtype."""

    def __init__(self, recorder: Recorder, emulate: bool = True):
        super().__init__()
        self.recorder = recorder
        self.emulate = emulate  # False: only record (the float32 reference)
        self._dtypes: dict[Any, Any] = {}
        self._scratch = _Scratch()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.emulate and _emulable(func) and _has_low(args, kwargs):
            out = self._emulated(func, args, kwargs)
        else:
            out = func(*args, **kwargs)
        self.recorder.observe(func, args, kwargs, out)
        return out

    def _emulated(self, func, args, kwargs):
        dtypes = self._output_dtypes(func, args, kwargs)
        if dtypes is _META_FAILED or not any(dtypes):
            # no meta kernel: the op runs as PyTorch's CPU kernel does; no float output (a comparison, an
            # assertion on the dtype): nothing to round, and the op must see its inputs' own dtypes
            return func(*args, **kwargs)
        taken: list[torch.Tensor] = []
        up = pytree.tree_map(lambda a: self._scratch.upcast(a, taken), (args, kwargs))
        out = func(*up[0], **up[1])
        leaves, spec = pytree.tree_flatten(out)
        rounded = [t.to(d) if isinstance(t, torch.Tensor) and d is not None and t.dtype != d else t
                   for t, d in zip(leaves, dtypes)]
        self._scratch.give_back(taken, rounded)
        return pytree.tree_unflatten(rounded, spec)

    def _output_dtypes(self, func, args, kwargs):
        leaves = pytree.tree_leaves((args, kwargs))
        key = (func, tuple(a.dtype if isinstance(a, torch.Tensor) else _hashable(a) for a in leaves))
        found = self._dtypes.get(key)
        if found is None:
            found = self._dtypes[key] = _meta_dtypes(func, args, kwargs)
        return found


class SameDrawsMode(TorchDispatchMode):
    """A float64 run of the program whose random ops (dropout) draw what the float32 reference drew: each runs
    on float32 copies of its inputs and its outputs are widened, so the masks match element for element."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded not in func.tags or func._schema.is_mutable:
            return func(*args, **kwargs)
        narrow = pytree.tree_map(lambda a: a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.float64
                                 else a, (args, kwargs))
        out = func(*narrow[0], **narrow[1])
        return pytree.tree_map(lambda t: t.double() if isinstance(t, torch.Tensor) and t.dtype == torch.float32
                               else t, out)


class _Scratch:
    """float32 buffers for the upcast copies, reused from op to op. A fresh large tensor is fresh pages, and first
    touching them costs more than converting into them (GPT-2 small's backward upcasts the same few shapes dozens
    of times: a 512 x 50257 gradient, a 50257 x 768 weight). A buffer holds the copy with the input's own strides,
    as .float() lays it out, so the op computes exactly what it would on .float()'s copy."""

    def __init__(self) -> None:
        self.free: dict[int, list[torch.Tensor]] = {}
        self.held = 0  # bytes in self.free

    def upcast(self, a: Any, taken: list[torch.Tensor]) -> Any:
        if not (isinstance(a, torch.Tensor) and a.dtype in LOW_DTYPES and a.numel() >= _POOLED
                and _dense(a)):
            return _upcast(a)
        n = a.numel()
        free = self.free.get(n)
        if free:
            buf = free.pop()
            self.held -= 4 * n
        else:
            buf = torch.empty(n, dtype=torch.float32, device=a.device)
        taken.append(buf)
        return buf.as_strided(a.shape, a.stride()).copy_(a)

    def give_back(self, taken: list[torch.Tensor], outs: list) -> None:
        """The op's buffers back to the pool, but any an output holds (an op that returned its input's storage)."""
        kept = {o.untyped_storage().data_ptr() for o in outs if isinstance(o, torch.Tensor)}
        for buf in taken:
            size = 4 * buf.numel()
            if buf.untyped_storage().data_ptr() not in kept and self.held + size <= _POOL_BYTES:
                self.free.setdefault(buf.numel(), []).append(buf)
                self.held += size


_POOLED = 1 << 16  # elements: a smaller upcast is a block the allocator already holds
_POOL_BYTES = 1 << 29  # the most the pool keeps between ops (512 MiB): GPT-2 small's largest shapes twice over


def _dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill its storage span without gaps or overlaps (any order of its axes): the layout
    .float() keeps, and that a flat buffer of t.numel() elements can take."""
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape) if n != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def _upcast(a: Any) -> Any:
    """A low-precision tensor as float32; a low dtype argument as float32 too (the input_dtype of
    _log_softmax_backward_data, a sum's dtype=): the op computes in float32, its output is rounded after."""
    if isinstance(a, torch.Tensor):
        return a.float() if a.dtype in LOW_DTYPES else a
    if isinstance(a, torch.dtype) and a in LOW_DTYPES:
        return torch.float32
    return a


def _hashable(value: Any) -> Any:
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


def _meta_dtypes(func, args, kwargs):
    def meta(a):
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta") \
            if isinstance(a, torch.Tensor) else a
    try:
        margs, mkwargs = pytree.tree_map(meta, (args, kwargs))
        out = func(*margs, **mkwargs)
    except Exception:  # an op with no meta kernel, or one that needs real data
        return _META_FAILED
    return [t.dtype if isinstance(t, torch.Tensor) and t.is_floating_point() else None
            for t in pytree.tree_leaves(out)]


# casts, copies and reshapes (_unsafe_view is a view autograd does not track as one): nothing to compute or round
_CASTS = {"aten._to_copy", "aten.to", "aten.copy_", "aten.clone", "aten.detach", "aten.lift_fresh",
          "aten.alias", "aten.empty_like", "aten.zeros_like", "aten.ones_like", "aten.full_like", "aten._unsafe_view"}


def _emulable(func) -> bool:
    if func.is_view or func._schema.is_mutable:
        return False
    return func._schema.name.replace("::", ".") not in _CASTS


def _has_low(args, kwargs) -> bool:
    return any(isinstance(a, torch.Tensor) and a.dtype in LOW_DTYPES for a in pytree.tree_leaves((args, kwargs)))


class _Tagging(torch.fx.Interpreter):
    """Runs the captured program node by node: each output's autograd node is tagged with the fx node that made it,
    so a backward op names its forward op (and, through the node's stack trace, the Python line)."""

    def __init__(self, module, recorder: Recorder):
        super().__init__(module)
        self.recorder = recorder

    def run_node(self, n):
        self.recorder.current_fx = n.name if n.op == "call_function" else None
        result = super().run_node(n)
        for t in pytree.tree_leaves(result):
            if isinstance(t, torch.Tensor) and t.grad_fn is not None and _TAG not in t.grad_fn.metadata:
                t.grad_fn.metadata[_TAG] = n.name
        return result


def run_loss(module, flat: list, recorder: Recorder) -> torch.Tensor:
    """The captured program's loss (under whatever mode the caller has entered)."""
    out = _Tagging(module, recorder).run(*flat)
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    return leaves[0]
