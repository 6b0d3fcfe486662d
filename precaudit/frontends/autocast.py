"""torch.autocast's per-op dtypes, read from the installed torch, for a module captured in float32.

How autocast decides (aten/src/ATen/autocast_mode.cpp): every op with a kernel under the AutocastCUDA (or
AutocastCPU) dispatch key casts its inputs by one of five policies — lower precision (matmul, linear, conv: to
the autocast dtype), fp32 (exp, log, pow, rsqrt, layer_norm, ...: to float32), fp32_set_opt_dtype (softmax,
log_softmax, sum, prod, cumsum, linalg_vector_norm: a float32 output), fp32_append_dtype (norm) and promote
(addcmul, atan2, ...: the widest input type); every other op runs in the dtype its inputs have.

Nothing is copied from that file. The set of ops comes from the dispatcher
(`torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA")`), and what each does from its own
kernel: the captured graph is replayed node by node on fake tensors (no data, no device) placed on the
autocast device, with autocast switched on, so torch's compiled-in kernels cast and compute every dtype. A fake
CUDA tensor runs the AutocastCUDA kernels on a CPU-only build. Each registered op's policy is told from how it
treats all-float32 and all-float16 versions of its own inputs, and said in the value's dtype note.

autocast_policy.POLICY keeps the lists of the torch version this was written against, by policy;
tests/test_autocast.py fails when the installed torch's registrations differ from it (a torch upgrade that changes
autocast). Traced mode's program with the casts written in: autocast_export.py.

Regions: `with torch.autocast(device, enabled=False)` (or another dtype) inside forward() is recorded by
torch.export as a `wrap_with_autocast` higher-order op whose body runs with that state here too; explicit
casts (`.float()`, `.to(dtype)`) run as written.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.utils._pytree as pytree

from ..dtypes import FORMATS
from ..errors import InputError
from .autocast_policy import policy_of, registered_ops

__all__ = ["DEVICES", "TORCH_DTYPES", "AutocastPlan", "OpDtype", "plan_autocast", "preserve_casts", "region"]

DEVICES = ("cuda", "cpu")
_LOW = {"fp16": torch.float16, "bf16": torch.bfloat16}
_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


# ---- capture ----------------------------------------------------------------------------------------------


class _CastsKept(torch.overrides.TorchFunctionMode):
    """While a float32 module is captured for an autocast audit: every float cast the model writes is recorded.

    In a float32 capture `x.float()` is a no-op that returns x itself: torch.export then either drops it or
    lets every later use of x read the cast. Under autocast x may be float16 there, so the cast matters and
    x must stay x: a float cast is made a real copy (aten._to_copy with its dtype), `x.to(y)` reads y's dtype
    at run time (aten.type_as), and a move to the device the tensor is on records nothing.
    """

    _TO_FLOAT: ClassVar[dict[Any, torch.dtype]] = {torch.Tensor.float: torch.float32, torch.Tensor.half: torch.float16,
                 torch.Tensor.bfloat16: torch.bfloat16, torch.Tensor.double: torch.float64}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._TO_FLOAT and len(args) == 1 and isinstance(args[0], torch.Tensor) \
                and args[0].is_floating_point() and not kwargs:
            return torch.ops.aten._to_copy.default(args[0], dtype=self._TO_FLOAT[func])
        if func is torch.Tensor.to and args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
            made = self._to(args, kwargs)
            if made is not None:
                return made
        return func(*args, **kwargs)

    @staticmethod
    def _to(args, kwargs):
        x, rest = args[0], args[1:]
        if rest and isinstance(rest[0], torch.Tensor) and not kwargs:  # x.to(other): other's dtype at run time
            other = rest[0]
            if other.is_floating_point() and other.device == x.device:
                return torch.ops.aten.type_as.default(x, other)
            return None
        try:
            device, dtype, _, memory_format = torch._C._nn._parse_to(*rest, **kwargs)
        except (TypeError, RuntimeError):
            return None
        if memory_format is not None or (device is not None and torch.device(device) != x.device):
            return None  # a real move or layout change: as written
        if dtype is None:
            return x  # .to(x.device): nothing happens
        if dtype.is_floating_point:
            return torch.ops.aten._to_copy.default(x, dtype=dtype)
        return None


@contextlib.contextmanager
def preserve_casts() -> Iterator[None]:
    """Capture with every float cast of the model recorded (see _CastsKept)."""
    with _CastsKept():
        yield


# ---- the plan ---------------------------------------------------------------------------------------------


@dataclass
class OpDtype:
    """What autocast does at one node of the captured graph."""

    dtypes: list[str | None]  # per output: 'fp16', 'fp32', ... (None for a non-float output)
    note: str  # why: "autocast(cuda) runs matmul in float16"
    casts: dict[int, str] = field(default_factory=dict)  # id(fx input node) -> the dtype it is cast to first
    cast_note: str = ""  # the reason a cast's output carries


@dataclass
class AutocastPlan:
    """Per fx node (by id), the dtypes autocast gives it; notes of the placeholders (inputs, parameters)."""

    device: str
    dtype: str  # the autocast dtype: 'fp16' or 'bf16'
    ops: dict[int, OpDtype] = field(default_factory=dict)
    inputs: dict[int, OpDtype] = field(default_factory=dict)
    replay_failed: list[str] = field(default_factory=list)  # nodes whose dtype was inferred, not replayed
    policies: dict[str, str | None] = field(default_factory=dict)  # op ('pow.Tensor_Scalar') -> its policy

    @property
    def label(self) -> str:
        return f"autocast({self.device})"


def plan_autocast(ep, device: str, target: str, spec: str) -> AutocastPlan:
    """Replay the float32 program under torch's autocast on fake tensors: every node's dtype and why."""
    if device not in DEVICES:
        raise InputError(spec, f"--autocast must be one of {', '.join(DEVICES)}, not {device!r}")
    try:
        return _Replay(ep, device, target).run()
    except Exception as exc:  # a program the replay cannot walk (an op it fails on is inferred, not this)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InputError(spec, f"could not replay the program under autocast({device}) ({type(exc).__name__}: "
                               f"{first}); audit it without --autocast") from None


class _Replay:
    def __init__(self, ep, device: str, target: str):
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.ep = ep
        self.device = device
        self.low = _LOW[target]
        self.plan = AutocastPlan(device, target)
        self.registered = registered_ops(device)
        self.fake = FakeTensorMode()
        self.roots: dict[int, str] = {}  # id(fx node) -> where its dtype comes from ("from linear at 'linear'")
        self.items: dict[int, torch.dtype] = {}  # id(getitem node) -> the dtype of the output it takes, replayed
        self.policies = self.plan.policies

    # ---- driving ----------------------------------------------------------------------------------------

    def run(self) -> AutocastPlan:
        label = self.plan.label
        saved = torch.is_autocast_enabled(self.device), torch.get_autocast_dtype(self.device)
        sig = self.ep.graph_signature
        params = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
        with self.fake, torch.no_grad(), _quiet_fake():
            torch.set_autocast_enabled(self.device, True)
            torch.set_autocast_dtype(self.device, self.low)
            try:
                env: dict[int, Any] = {}
                for node in self.ep.graph.nodes:
                    if node.op != "placeholder":
                        continue
                    val = node.meta.get("val")
                    env[id(node)] = self._fake(val, getattr(val, "dtype", None))
                    dtype = getattr(val, "dtype", None)
                    name = _NAMES.get(dtype) if dtype is not None else None
                    if name is None:
                        continue
                    owner = params.get(node.name)
                    what = f"parameter '{owner}'" if owner in sig.inputs_to_parameters.values() else \
                        f"buffer '{owner}'" if owner is not None else f"input '{node.name}'"
                    self.plan.inputs[id(node)] = OpDtype(
                        [name], f"{label} leaves {what} in {FORMATS[name].long_name} (it casts per op)")
                    self.roots[id(node)] = f"from {what}"
                self._graph(self.ep.graph_module, self.ep.graph, env)
            finally:
                torch.set_autocast_enabled(self.device, saved[0])
                torch.set_autocast_dtype(self.device, saved[1])
        return self.plan

    def _graph(self, module, graph, env: dict[int, Any]):
        for node in graph.nodes:
            if node.op == "call_function":
                env[id(node)] = self._call(module, node, env)
            elif node.op == "get_attr":
                env[id(node)] = None  # a region's body: read through the higher-order op
            elif node.op == "output":
                return pytree.tree_map(lambda a: env.get(id(a)) if isinstance(a, torch.fx.Node) else a, node.args[0])
        return None

    def _call(self, module, node, env):
        target = node.target
        parts = region(node)
        if parts is not None:
            return self._region(module, parts, env)
        args = pytree.tree_map(lambda a: env.get(id(a)) if isinstance(a, torch.fx.Node) else self._device(a),
                               node.args)
        kwargs = pytree.tree_map(lambda a: env.get(id(a)) if isinstance(a, torch.fx.Node) else self._device(a),
                                 node.kwargs)
        if target is _getitem:
            source = args[0]
            origin = node.args[0]
            self.roots[id(node)] = self.roots.get(id(origin), "")
            item = source[args[1]] if isinstance(source, (tuple, list)) else source
            if isinstance(item, torch.Tensor):
                self.items[id(node)] = item.dtype
            return item
        name = _op_name(target)
        if name.startswith("_assert") or name in ("sym_constrain_range_for_size",):
            return None
        if name in _CASTS:
            return self._cast(node, name, args, kwargs)
        return self._op(node, name, args, kwargs)

    # ---- ops --------------------------------------------------------------------------------------------

    def _op(self, node, name: str, args, kwargs):
        label = self.plan.label
        inputs = [a for a in node.all_input_nodes if _float_name(self._dtype_of(a)) is not None]
        registered = f"aten::{name}" in self.registered and torch.is_autocast_enabled(self.device)
        short = name.split(".", maxsplit=1)[0]
        try:
            out = node.target(*args, **kwargs)
        except Exception:  # an op its fake kernel cannot replay: its dtype follows its inputs, as most ops'
            self.plan.replay_failed.append(node.name)
            out = None
        policy = self._policy(node, name, args, kwargs) if registered else None
        if out is None:
            out = self._inferred(node, policy)
        dtypes = [_float_name(getattr(o, "dtype", None)) for o in _outputs(out)]
        main = next((d for d in dtypes if d is not None), None)
        if main is None:
            return out
        in_dtypes = {id(a): _float_name(self._dtype_of(a)) for a in inputs}
        casts: dict[int, str] = {}
        off = "" if torch.is_autocast_enabled(self.device) else f"{label} is off here (autocast(enabled=False)): "
        if policy == "lower_precision_fp":
            casts = {i: main for i, d in in_dtypes.items() if d not in (main, "fp64")}
            note = f"{label} runs {short} in {FORMATS[main].long_name}"
        elif policy in ("fp32", "fp32_set_opt_dtype", "fp32_append_dtype"):
            casts = {i: "fp32" for i, d in in_dtypes.items() if d in ("fp16", "bf16")}
            note = (f"{label} lifts {short} to float32" if policy == "fp32" else
                    f"{label} runs {short} with a float32 output")
        elif policy == "promote":
            casts = {i: main for i, d in in_dtypes.items() if d != main}
            note = f"{label} runs {short} in its widest input type, {FORMATS[main].long_name}"
        else:
            # an op whose float outputs keep different dtypes (broadcast_tensors of a float16 and a float32
            # tensor) promotes nothing: each output keeps its input's
            promotes = len({d for d in dtypes if d is not None}) == 1
            casts = {i: main for i, d in in_dtypes.items() if d != main} if promotes else {}
            rule = off or f"{short} has no {label} rule: "
            if casts:  # float16 with float32: PyTorch's type promotion runs the op in the wider type
                note = f"{rule}type promotion runs {'it' if not off else short} in {FORMATS[main].long_name}"
            elif not inputs:  # a factory (zeros, full, arange): it makes the dtype it is asked for
                note = f"{short} makes a {FORMATS[main].long_name} tensor ({label} leaves it)"
            else:
                source = next(a for a in inputs if in_dtypes[id(a)] == main)
                root = self.roots.get(id(source), "")
                note = f"{rule}{'it' if not off else short} runs in its input's {FORMATS[main].long_name}" + \
                    (f", {root}" if root else "")
                self.roots[id(node)] = root
        if id(node) not in self.roots:
            self.roots[id(node)] = f"from {short} at '{node.name}'"
        cast_note = note if policy is not None else f"{short} has no {label} rule: type promotion casts its input " \
                                                    f"to {FORMATS[main].long_name}"
        self.plan.ops[id(node)] = OpDtype(dtypes, note, casts, cast_note)
        return out

    def _cast(self, node, name: str, args, kwargs):
        """The model's own cast (.float(), .to(dtype), .type_as(y)): autocast leaves it as written."""
        x = args[0]
        if not isinstance(x, torch.Tensor):
            return x
        if name in {"type_as", "to.other"}:
            dtype = args[1].dtype
        else:
            dtype = kwargs.get("dtype") or next((a for a in args[1:] if isinstance(a, torch.dtype)), None) or x.dtype
        out = torch.empty_strided(x.shape, x.stride(), dtype=dtype, device=x.device)
        to, was = _float_name(dtype), _float_name(x.dtype)
        if to is None:
            return out
        source = node.args[0]
        if to == was:  # a no-op here: the value keeps its reason
            inherited = self.plan.ops.get(id(source)) or self.plan.inputs.get(id(source))
            note = inherited.note if inherited is not None else f"{self.plan.label}: {FORMATS[to].long_name}"
            self.roots[id(node)] = self.roots.get(id(source), "")
        else:
            note = f"the model's own cast to {FORMATS[to].long_name} at '{node.name}' ({self.plan.label} keeps it)"
            self.roots[id(node)] = f"from the cast at '{node.name}'"
        self.plan.ops[id(node)] = OpDtype([to], note)
        return out

    def _region(self, module: Any, parts: tuple, env: dict[int, Any]) -> Any:
        """with torch.autocast(device, dtype, enabled) (or torch.no_grad()): the body runs with that state."""
        body_ref, operands, state = parts
        body = getattr(module, body_ref.target)
        values = [env.get(id(a)) if isinstance(a, torch.fx.Node) else a for a in operands]
        device, dtype, enabled = state if state is not None else (None, None, None)
        if device is not None and device not in torch._C._autocast_supported_devices():
            device = None
        saved = (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)) if device else None
        try:
            if device:
                torch.set_autocast_enabled(device, bool(enabled))
                if dtype is not None:
                    torch.set_autocast_dtype(device, dtype)
            inner: dict[int, Any] = {}
            placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
            for ph, arg, value in zip(placeholders, operands, values):
                inner[id(ph)] = value
                if isinstance(arg, torch.fx.Node):  # the body's inputs carry the outer values' reasons
                    known = self.plan.ops.get(id(arg)) or self.plan.inputs.get(id(arg))
                    if known is not None:
                        self.plan.inputs[id(ph)] = known
                    self.roots[id(ph)] = self.roots.get(id(arg), "")
            return self._graph(body, body.graph, inner)
        finally:
            if saved is not None:
                assert device is not None  # saved only for a device
                torch.set_autocast_enabled(device, saved[0])
                torch.set_autocast_dtype(device, saved[1])

    # ---- policy -----------------------------------------------------------------------------------------

    def _policy(self, node, name: str, args, kwargs) -> str | None:
        """How the op's autocast kernel treats its float inputs, told from its own behaviour (cached per op)."""
        if name in self.policies:
            return self.policies[name]
        as32 = self._run_as(node, args, kwargs, torch.float32)
        policy = None
        if as32 == self.low:
            policy = "lower_precision_fp"
        else:
            aslow = self._run_as(node, args, kwargs, self.low)
            if aslow is not None and aslow != self.low:  # float32 (or complex64) from low-precision inputs
                schema = getattr(node.target, "_schema", None)
                has_dtype = schema is not None and any(a.name == "dtype" for a in schema.arguments)
                policy = "fp32_set_opt_dtype" if has_dtype else "fp32"
            elif as32 is not None and aslow is not None:
                policy = "promote"
        if policy is None:  # the kernel could not be replayed: the tabled list says (or nothing)
            policy = policy_of(self.device, name)
            policy = None if policy == "banned" else policy
        self.policies[name] = policy
        return policy

    def _run_as(self, node, args, kwargs, dtype: torch.dtype) -> torch.dtype | None:
        def cast(a):
            if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != torch.float64:
                return torch.empty_strided(a.shape, a.stride(), dtype=dtype, device=a.device)
            return a
        try:
            out = node.target(*pytree.tree_map(cast, args), **pytree.tree_map(cast, kwargs))
        except Exception:
            return None
        first = next((o for o in _outputs(out) if isinstance(o, torch.Tensor)), None)
        return first.dtype if first is not None else None

    def _inferred(self, node, policy: str | None):
        """Fake outputs for a node that could not be replayed: the captured shapes, in the dtype its policy (or
        its widest float input) gives."""
        widest = None
        for a in node.all_input_nodes:
            d = self._dtype_of(a)
            if d is not None and d.is_floating_point and (widest is None or d.itemsize > widest.itemsize):
                widest = d
        dtype = self.low if policy == "lower_precision_fp" else torch.float32 if policy and policy.startswith("fp32") \
            else widest or torch.float32

        def make(meta):
            if isinstance(meta, torch.Tensor):
                return self._fake(meta, dtype if meta.is_floating_point() else meta.dtype)
            return meta
        return pytree.tree_map(make, node.meta.get("val"))

    # ---- helpers ----------------------------------------------------------------------------------------

    def _dtype_of(self, fx_node) -> torch.dtype | None:
        if id(fx_node) in self.items:  # one output of a multi-output op, as the replay made it
            return self.items[id(fx_node)]
        known = self.plan.ops.get(id(fx_node)) or self.plan.inputs.get(id(fx_node))
        if known is not None and known.dtypes and known.dtypes[0] is not None:
            return TORCH_DTYPES[known.dtypes[0]]
        val = fx_node.meta.get("val")
        return getattr(val, "dtype", None)

    def _fake(self, val, dtype):
        if not isinstance(val, torch.Tensor):
            return val
        shape = tuple(int(s) for s in val.shape)
        stride = tuple(int(s) for s in val.stride())
        return torch.empty_strided(shape, stride, dtype=dtype, device=self.device)

    def _device(self, a):
        """A device in the graph (arange(device=cpu)) moves to the autocast device: tensors must meet there."""
        if isinstance(a, torch.device) and a.type != self.device:
            return torch.device(self.device)
        return a


TORCH_DTYPES = {v: k for k, v in _NAMES.items()}  # 'fp16' -> torch.float16, ...


def region(node) -> tuple | None:
    """A region higher-order op torch.export records for a `with` block in forward(): (its body's get_attr node,
    the operands, the autocast state (device, dtype, enabled) or None). None for any other node."""
    if node.op != "call_function":
        return None
    if node.target is getattr(torch.ops.higher_order, "wrap_with_autocast", None):
        device, dtype, enabled, _cache, body, *operands = node.args
        return body, operands, (device, dtype, enabled)
    if node.target is getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None):
        _enabled, body, *operands = node.args
        return body, operands, None
    return None


_CASTS = {"to.dtype", "to.dtype_layout", "to.device", "to.other", "_to_copy", "type_as"}


_getitem = operator.getitem


def _op_name(target) -> str:
    """aten.pow.Tensor_Scalar -> 'pow.Tensor_Scalar'; aten.mm.default -> 'mm'."""
    text = str(target)
    if text.startswith("aten."):
        _, op, overload = ([*text.split("."), "default"])[:3]
        return op if overload == "default" else f"{op}.{overload}"
    return getattr(target, "__name__", text)


def _outputs(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _float_name(dtype) -> str | None:
    return _NAMES.get(dtype)


@contextlib.contextmanager
def _quiet_fake() -> Iterator[None]:
    """Fake-tensor replays that fail are expected (their dtype is inferred): torch logs them as errors."""
    import logging

    logger = logging.getLogger("torch._subclasses.fake_tensor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
