"""Lower a torch.export ATen graph into the IR, with ONNX op names, so the same sites and rules apply.

Only the ops the analysis reads are translated (norms, softmax, log/exp/sqrt, arithmetic, reductions, casts,
clamps, shape ops); every other op keeps its ATen name, so producers and consumers still link up. The body of a
`with torch.autocast(...)` or `with torch.no_grad()` block (a wrap_with_autocast / wrap_with_set_grad_enabled
higher-order op in the program) is lowered in place.

With an autocast plan (frontends/autocast.py), every float value takes the dtype torch's autocast gives it and
says why (Value.dtype_note), and the casts autocast inserts before an op become Cast nodes, so each node's
inputs hold the dtype it computes in.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..dtypes import FORMATS
from ..ir import Graph, Node, Value
from .autocast import region
from .source import frames

if TYPE_CHECKING:
    from .autocast import AutocastPlan, OpDtype

__all__ = ["TORCH_DTYPES", "lower_exported_program"]

TORCH_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64",
                torch.float8_e4m3fn: "fp8-e4m3", torch.float8_e5m2: "fp8-e5m2"}
_ONNX_ELEM = {"fp32": 1, "fp16": 10, "fp64": 11, "bf16": 16, "fp8-e4m3": 17, "fp8-e5m2": 19}
_MAX_CONST = 64  # parameters and buffers are read only when this small (an eps vector, never weights)


def lower_exported_program(ep: torch.export.ExportedProgram, path: str, plan: AutocastPlan | None = None,
                           state: dict | None = None) -> Graph:
    """Build the IR graph of an exported program: placeholders, call_function nodes, outputs.

    plan: autocast's dtype for every node (frontends/autocast.py); state: the real parameters by name, where the
    program holds fake ones.
    """
    return _Lowering(ep, path, plan, state).run()


class _Lowering:
    def __init__(self, ep, path: str, plan: AutocastPlan | None = None, state: dict | None = None):
        self.ep = ep
        self.plan = plan
        self.graph = Graph(path=path, producer_name="torch.export", exporter="torch.export")
        # id(fx node) -> Value (or tuple of Values); None for an item of a call lowered to nothing
        self.values: dict[int, Value | tuple | None] = {}
        self._n = 0
        self._prefix = ""  # inside an autocast region's body: the region's node name and "/"
        self._entry: OpDtype | None = None  # the plan's entry for the fx node being lowered
        self._casts: dict[tuple[int, str], Value] = {}
        sig = ep.graph_signature
        self.params = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
        self.state = state if state is not None else {**ep.state_dict, **getattr(ep, "constants", {})}

    def run(self) -> Graph:
        self._walk(self.ep.graph_module, self.ep.graph)
        if self.plan is not None:
            self._note_the_rest()
        return self.graph

    def _walk(self, module, graph) -> list:
        """Lower one fx graph (the program's, or a region's body); its outputs."""
        outputs: list = []
        for fx in graph.nodes:
            if fx.op == "placeholder":
                if id(fx) not in self.values:  # a region's body inputs are bound by the region
                    self.values[id(fx)] = self._placeholder(fx)
            elif fx.op == "call_function":
                parts = region(fx)
                if parts is not None:
                    self._region(module, fx, parts)
                else:
                    self._call(fx)
            elif fx.op == "output":
                outs = fx.args[0] if isinstance(fx.args[0], (list, tuple)) else [fx.args[0]]
                outputs = [self._arg(a) for a in outs]
        return outputs

    def _region(self, module, fx, parts) -> None:
        """`with torch.autocast(...)` or `with torch.no_grad()` in forward(): its body, lowered in place (names
        prefixed by the body's)."""
        body_ref, operands, _ = parts
        body = getattr(module, body_ref.target)
        operands = [self._arg(a) for a in operands]
        for ph, value in zip([n for n in body.graph.nodes if n.op == "placeholder"], operands):
            self.values[id(ph)] = value
        saved, self._prefix = self._prefix, f"{self._prefix}{body_ref.target}/"
        try:
            outs = self._walk(body, body.graph)
        finally:
            self._prefix = saved
        self.values[id(fx)] = tuple(outs)

    def _note_the_rest(self) -> None:
        """Under autocast every float value says why it has its dtype: Python numbers and the values no plan
        entry reached take the reason of the tensor they meet."""
        assert self.plan is not None  # run() notes the rest only under a plan
        label = self.plan.label
        for node in self.graph.nodes:
            like = next((v for v in node.inputs if v is not None and v.dtype_note is not None), None)
            for value in [*node.inputs, *node.outputs]:
                if value is None or value.dtype_note is not None or value.dtype not in FORMATS:
                    continue
                if value.const_origin and value.const_origin.startswith("the Python number"):
                    # a wrapped number computes in the op's dtype: the op's reason is the number's
                    out = next((o for o in node.outputs if o.dtype == value.dtype and o.dtype_note), None)
                    source = out or (like if like is not None and like.dtype == value.dtype else None)
                    value.dtype_note = source.dtype_note if source is not None else \
                        f"a Python number takes the dtype of the tensor it meets under {label}"
                elif like is not None and like.dtype == value.dtype:
                    value.dtype_note = like.dtype_note
                else:
                    value.dtype_note = f"{label}: {FORMATS[value.dtype].long_name}"

    # ---- values ------------------------------------------------------------------------------------------

    def _placeholder(self, fx) -> Value:
        value = Value(name=fx.name, dtype=_dtype(fx), shape=_shape(fx))
        known = self.plan.inputs.get(id(fx)) if self.plan is not None else None
        if known is not None and value.dtype in FORMATS:
            value.dtype_note = known.note
        target = self.params.get(fx.name)
        tensor = self.state.get(target) if target is not None else None
        if tensor is not None and isinstance(tensor, torch.Tensor):
            value.const_size = tensor.numel()
            value.const_origin = f"parameter '{target}'"
            value.const_loader = (lambda t=tensor: _numpy(t)) if tensor.numel() <= _MAX_CONST else (lambda: None)
        else:
            value.is_graph_input = True
            self.graph.inputs.append(value)
        return value

    def _const(self, scalar: Any, like: Value | None) -> Value:
        """A Python number in an ATen call: it takes the dtype of the tensor it meets (a wrapped number)."""
        self._n += 1
        value = Value(name=f"scalar_{self._n}", dtype=like.dtype if like is not None else "fp32", shape=())
        value.const_loader = lambda: np.asarray(float(scalar), dtype=np.float64)
        value.const_origin = f"the Python number {scalar!r}"
        value.const_size = 1
        return value

    def _arg(self, a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            value = self.values.get(id(a))
            entry = self._entry
            if entry is not None and id(a) in entry.casts and isinstance(value, Value):
                return self._autocast_cast(value, entry.casts[id(a)], entry)
            return value
        if isinstance(a, (list, tuple)) and any(isinstance(x, torch.fx.Node) for x in a):
            return type(a)(self._arg(x) for x in a)
        return a

    # ---- nodes -------------------------------------------------------------------------------------------

    def _call(self, fx) -> None:
        name = _aten_name(fx.target)
        if name == "getitem":
            source = self.values.get(id(fx.args[0]))
            self.values[id(fx)] = source[fx.args[1]] if isinstance(source, tuple) else source
            return
        if name in _SKIP or name.startswith(("_enter_autocast", "_exit_autocast")):
            return
        self._entry = self.plan.ops.get(id(fx)) if self.plan is not None else None
        self._casts = {}  # the casts autocast inserts for this node, made once each
        self._fx = fx
        try:
            handler = _HANDLERS.get(name)
            if self._entry is not None and name == "type_as":
                handler = _cast  # type_as under autocast is a cast to the other value's dtype there
            args = [self._arg(a) for a in fx.args]
            first = len(self.graph.nodes)
            if handler is None:
                self._emit(fx, name, [v for v in _flat(args) if isinstance(v, Value)], {})
            else:
                handler(self, fx, args)
            if self._entry is not None:
                self._autocast_dtypes(fx, self.graph.nodes[first:], self._entry)
        finally:
            self._entry = None

    def _autocast_cast(self, value: Value, to: str, entry: OpDtype) -> Value:
        """The cast autocast (or type promotion) inserts before an op, as a Cast node; its output says why."""
        if value.dtype == to:
            return value
        made = self._casts.get((id(value), to))
        if made is not None:
            return made
        fmt = FORMATS[to]
        node = Node(name=f"{self._prefix}{self._fx.name}/autocast:{value.name}", op_type="Cast",
                    attrs={"to": _ONNX_ELEM[to]}, inputs=[value], opset=23)
        _source(node, self._fx)  # the cast belongs to the op autocast casts for
        value.consumers.append(node)
        assert self.plan is not None  # an autocast entry comes from the plan
        out = Value(name=node.name, producer=node, dtype=to, shape=value.shape,
                    dtype_note=entry.cast_note or f"{self.plan.label}: {fmt.long_name}")
        node.outputs = [out]
        self.graph.nodes.append(node)
        self._casts[(id(value), to)] = out
        return out

    def _autocast_dtypes(self, fx, nodes: list[Node], entry: OpDtype) -> None:
        """The nodes one fx node became hold autocast's dtypes: its outputs per output, the steps between in
        the first float output's."""
        made = self.values.get(id(fx))
        finals = list(made) if isinstance(made, tuple) else [made]
        main = next((d for d in entry.dtypes if d is not None), None)
        for node in nodes:
            if node.op_type == "Cast" and "/autocast:" in node.name:
                continue
            for value in node.outputs:
                if value in finals:
                    i = finals.index(value)
                    dtype = entry.dtypes[i] if i < len(entry.dtypes) else main
                else:
                    dtype = main
                if dtype is None or (value.dtype not in FORMATS and value.dtype is not None):
                    continue
                value.dtype = dtype
                value.dtype_note = entry.note

    def _emit(self, fx, op: str, inputs: list, attrs: dict, n_outputs: int = 1, dtype: str | None = None,
              suffix: str = "") -> Node:
        """One IR node for (part of) an fx node; scalars among the inputs become constants."""
        like = next((v for v in inputs if isinstance(v, Value)), None)
        ins = [v if isinstance(v, Value) or v is None else self._const(v, like) for v in inputs]
        node = Node(name=self._prefix + fx.name + suffix, op_type=op, attrs=attrs, inputs=ins, opset=23)
        _source(node, fx)
        for v in ins:
            if v is not None:
                v.consumers.append(node)
        outs = []
        metas = fx.meta.get("val")
        for i in range(n_outputs):
            meta = metas[i] if isinstance(metas, (list, tuple)) and i < len(metas) else metas
            out = Value(name=f"{node.name}:{i}" if n_outputs > 1 else node.name, producer=node,
                        dtype=dtype or _dtype_of(meta) or (like.dtype if like is not None else None),
                        shape=_shape_of(meta))
            outs.append(out)
        node.outputs = outs
        self.graph.nodes.append(node)
        self.values[id(fx)] = outs[0] if n_outputs == 1 else tuple(outs)
        return node


def _simple(op: str, n_inputs: int | None = None) -> Callable:
    def handle(low: _Lowering, fx, args):
        ins = [a for a in (args if n_inputs is None else args[:n_inputs]) if isinstance(a, (Value, int, float))]
        low._emit(fx, op, ins, {})
    return handle


def _binary(op: str) -> Callable:
    def handle(low: _Lowering, fx, args):
        a, b = args[0], args[1]
        alpha = fx.kwargs.get("alpha", 1)
        if alpha != 1 and isinstance(b, Value):  # x + alpha * y
            mul = low._emit(fx, "Mul", [b, alpha], {}, suffix="/alpha")
            b = mul.outputs[0]
        low._emit(fx, op, [a, b], {})
    return handle


def _reduce(op: str) -> Callable:
    def handle(low: _Lowering, fx, args):
        dims = args[1] if len(args) > 1 else fx.kwargs.get("dim")
        keep = args[2] if len(args) > 2 else fx.kwargs.get("keepdim", False)
        low._emit(fx, op, [args[0]], {"axes": list(dims) if isinstance(dims, (list, tuple)) else dims,
                                     "keepdims": int(bool(keep))})
    return handle


def _layer_norm(low, fx, args):
    # PyTorch's layer_norm kernels accumulate half and bfloat16 statistics in float32: stash_type 1.
    eps = args[4] if len(args) > 4 else fx.kwargs.get("eps", 1e-5)
    low._emit(fx, "LayerNormalization", [args[0], args[2] if len(args) > 2 else None], {"epsilon": float(eps),
                                                                                        "stash_type": 1})


def _native_layer_norm(low, fx, args):
    low._emit(fx, "LayerNormalization", [args[0], args[2]], {"epsilon": float(args[4]), "stash_type": 1},
              n_outputs=3)


def _rms_norm(low, fx, args):
    eps = args[3] if len(args) > 3 else fx.kwargs.get("eps")
    attrs = {"stash_type": 1}
    if eps is not None:
        attrs["epsilon"] = float(eps)
    else:  # eps=None: the machine epsilon of the dtype the kernel computes in, float32 for half and bfloat16 inputs
        x = args[0]  # (measured, torch 2.13: F.rms_norm(half, eps=None) == eps=finfo(float32).eps, not float16's)
        dtype = _TORCH_OF.get(x.dtype, torch.float32)
        attrs["epsilon"] = float(torch.finfo(torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype).eps)
    low._emit(fx, "RMSNormalization", [args[0], args[2] if len(args) > 2 else None], attrs)


def _group_norm(low, fx, args):
    eps = args[4] if len(args) > 4 else fx.kwargs.get("eps", 1e-5)
    low._emit(fx, "GroupNormalization", [args[0], args[2], args[3]], {"epsilon": float(eps), "num_groups": args[1],
                                                                      "stash_type": 1})


def _batch_norm(low, fx, args):
    # (input, weight, bias, running_mean, running_var, [training,] momentum, eps, ...)
    name = _aten_name(fx.target)
    eps = args[6] if name == "_native_batch_norm_legit_no_training" else args[7]
    # PyTorch's batch and instance norm kernels, like layer_norm, keep float32 statistics for half inputs:
    # stash_type records that (no ONNX BatchNormalization carries one, so this is only ever set here)
    low._emit(fx, "BatchNormalization", [args[0], args[1], args[2], args[3], args[4]], {"epsilon": float(eps), "stash_type": 1},
              n_outputs=3 if name != "batch_norm" else 1)


def _instance_norm(low, fx, args):
    low._emit(fx, "InstanceNormalization", [args[0], args[1], args[2]], {"epsilon": float(args[7]), "stash_type": 1})


def _softmax(op: str) -> Callable:
    def handle(low, fx, args):
        low._emit(fx, op, [args[0]], {"axis": args[1]})
    return handle


def _rsqrt(low, fx, args):
    sqrt = low._emit(fx, "Sqrt", [args[0]], {}, suffix="/sqrt")
    low._emit(fx, "Reciprocal", [sqrt.outputs[0]], {})


def _cast(low, fx, args):
    dtype = fx.kwargs.get("dtype") or next((a for a in fx.args[1:] if isinstance(a, torch.dtype)), None)
    if low._entry is not None:  # under autocast: the dtype the cast really gives there (type_as, .to(other))
        dtype = _TORCH_OF.get(low._entry.dtypes[0]) if low._entry.dtypes else dtype
    fmt = TORCH_DTYPES.get(dtype)
    if fmt is None:  # a device move or a cast to an integer type: no float dtype to honour
        low._emit(fx, "Identity", [args[0]], {})
        return
    low._emit(fx, "Cast", [args[0]], {"to": _ONNX_ELEM[fmt]}, dtype=fmt)


def _clamp(low, fx, args):
    lo = args[1] if len(args) > 1 else fx.kwargs.get("min")
    hi = args[2] if len(args) > 2 else fx.kwargs.get("max")
    low._emit(fx, "Clip", [args[0], lo, hi], {})


def _vector_norm(low, fx, args):
    order = args[1] if len(args) > 1 else fx.kwargs.get("ord", 2)
    dims = args[2] if len(args) > 2 else fx.kwargs.get("dim")
    op = "ReduceL2" if order in (2, 2.0) else "aten.linalg_vector_norm"
    low._emit(fx, op, [args[0]], {"axes": dims})


def _var(low, fx, args):
    low._emit(fx, "ReduceVar", [args[0]], {})


def _var_mean(low, fx, args):
    low._emit(fx, "ReduceVar", [args[0]], {}, n_outputs=2)


def _std(low, fx, args):
    var = low._emit(fx, "ReduceVar", [args[0]], {}, suffix="/var")
    low._emit(fx, "Sqrt", [var.outputs[0]], {})


def _min_max(op: str, reduce_op: str) -> Callable:
    """aten.min/max(a, b) is elementwise; aten.min/max(x, dim) a reduction."""
    def handle(low, fx, args):
        if len(args) > 1 and isinstance(args[1], Value):
            low._emit(fx, op, [args[0], args[1]], {})
        else:
            low._emit(fx, reduce_op, [args[0]], {}, n_outputs=2 if len(args) > 1 else 1)
    return handle


def _like(low, fx, args):
    # full_like(x, v) and friends read only x's shape: no data flows from x
    low._emit(fx, "ConstantOfShape", [], {}, dtype=_dtype(fx))


def _masked_fill(low, fx, args):
    # x.masked_fill(mask, value) = Where(mask, value, x); the fill takes x's dtype (a Python number is wrapped)
    x, mask, fill = args[0], args[1], args[2]
    if not isinstance(fill, Value):
        fill = low._const(fill, x if isinstance(x, Value) else None)
    low._emit(fx, "Where", [mask, fill, x], {})


def _div(low, fx, args):
    low._emit(fx, "Div", [args[0], args[1]], {})


# (detach_: torch.export leaves it after lift_fresh_copy where a tensor is made from a Python number or a size)
_SHAPE = ["view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "permute", "transpose", "t", "expand",
          "expand_as", "contiguous", "clone", "alias", "flatten", "slice", "select", "detach", "detach_",
          "lift_fresh_copy"]
_HANDLERS: dict[str, Callable] = {
    "layer_norm": _layer_norm, "native_layer_norm": _native_layer_norm, "rms_norm": _rms_norm,
    "group_norm": _group_norm, "native_group_norm": _group_norm, "batch_norm": _batch_norm,
    "_native_batch_norm_legit_no_training": _batch_norm, "instance_norm": _instance_norm,
    "softmax": _softmax("Softmax"), "_softmax": _softmax("Softmax"),
    "log_softmax": _softmax("LogSoftmax"), "_log_softmax": _softmax("LogSoftmax"),
    "log": _simple("Log"), "exp": _simple("Exp"), "sqrt": _simple("Sqrt"), "rsqrt": _rsqrt,
    "reciprocal": _simple("Reciprocal"), "sigmoid": _simple("Sigmoid"), "relu": _simple("Relu"),
    "abs": _simple("Abs"), "neg": _simple("Neg"), "softplus": _simple("Softplus", 1), "log1p": _simple("Log1p"),
    "expm1": _simple("Expm1"), "div": _div, "true_divide": _div,
    "add": _binary("Add"), "sub": _binary("Sub"), "rsub": lambda low, fx, a: low._emit(fx, "Sub", [a[1], a[0]], {}),
    "mul": _binary("Mul"), "pow": _binary("Pow"), "square": lambda low, fx, a: low._emit(fx, "Mul", [a[0], a[0]], {}),
    "maximum": _binary("Max"), "minimum": _binary("Min"),
    "max": _min_max("Max", "ReduceMax"), "min": _min_max("Min", "ReduceMin"),
    "full_like": _like, "zeros_like": _like, "ones_like": _like, "empty_like": _like,
    "mean": _reduce("ReduceMean"), "sum": _reduce("ReduceSum"), "amax": _reduce("ReduceMax"),
    "amin": _reduce("ReduceMin"), "var": _var, "var_mean": _var_mean, "std": _std,
    "linalg_vector_norm": _vector_norm, "norm": _vector_norm,
    "clamp": _clamp, "clamp_min": _clamp, "clip": _clamp,
    "to": _cast, "_to_copy": _cast, "type_as": _simple("Identity", 1),
    "where": _simple("Where"), "masked_fill": _masked_fill,
    **{op: _simple("Reshape" if op not in ("expand", "expand_as") else "Expand", 1) for op in _SHAPE},
}
_TORCH_OF = {v: k for k, v in TORCH_DTYPES.items()}
# Checks torch.export inserts that compute nothing; as consumers they would hide where a value really goes.
_SKIP = {"_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size", "_assert_async"}


def _aten_name(target) -> str:
    """aten.layer_norm.default -> layer_norm; operator.getitem -> getitem."""
    text = str(target)
    if text.startswith("aten."):
        return text.split(".")[1]
    return getattr(target, "__name__", text)


def _dtype_of(meta) -> str | None:
    dtype = getattr(meta, "dtype", None)
    if dtype is None:
        return None
    return TORCH_DTYPES.get(dtype, str(dtype).replace("torch.", ""))


def _shape_of(meta) -> tuple | None:
    shape = getattr(meta, "shape", None)
    return tuple(int(d) if str(d).isdigit() else str(d) for d in shape) if shape is not None else None


def _dtype(fx) -> str | None:
    return _dtype_of(fx.meta.get("val"))


def _shape(fx) -> tuple | None:
    return _shape_of(fx.meta.get("val"))


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).cpu().numpy() if t.is_floating_point() else t.detach().cpu().numpy()


def _flat(args: list) -> list:
    """Arguments with lists opened (einsum's and cat's operands come as one list)."""
    return [v for a in args for v in (a if isinstance(a, (list, tuple)) else [a])]


def _source(node: Node, fx) -> None:
    """Module path from nn_module_stack; Python file:line from the stack trace (source.frames: the innermost user
    frame, or the library module's own forward() with the user's call into it as the call site)."""
    stack = fx.meta.get("nn_module_stack") or {}
    if stack:
        path = list(stack.values())[-1][0]
        node.scope = _clean_path(path) or None
    frame, call_site = frames(fx.meta.get("stack_trace") or "")
    if frame is not None:
        node.source_file, node.source_line = frame
    if call_site is not None:
        node.call_site = call_site


def _clean_path(path: str) -> str:
    """L['self'].encoder.layer[0] (strict export's source text) -> encoder.layer.0; a non-strict export's path is
    already the module's name as get_submodule takes it, and a name may hold brackets and quotes itself (a module
    added as "a[0]" is not a.0): left as it is."""
    if not path.startswith("L['self']"):
        return path
    path = re.sub(r"^L\['self'\]\.?", "", path)
    return re.sub(r"\[(\w+)\]", r".\1", path).replace("._modules['", ".").replace("']", "")
