"""numpy kernels for the ONNX ops transformer graphs are made of: one function per op, float dtype chosen by the caller."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..dtypes import COMPUTED, format_of_onnx_type
from ..ir import Node

__all__ = ["KERNELS", "KernelContext", "erf"]

Arrays = list  # list[np.ndarray | None]: a node's inputs in order, None for an omitted optional input


@dataclass
class KernelContext:
    """What a kernel needs besides its inputs: the float dtype of the run and the rounding of inner statistics."""

    float_dtype: type  # np.float32 for the emulated run, np.float64 for the reference
    round_stat: Callable[[np.ndarray], np.ndarray] = lambda a: a  # a fused norm's statistics dtype (stash_type)
    # a LayerNormalization's normalized value, written by one kernel and scaled and shifted by another (OpenVINO CPU)
    round_normalized: Callable[[np.ndarray], np.ndarray] = lambda a: a
    # what the inputs become before the kernel reads them (a block-scaled --dtype quantizes a MatMul's); None: as given
    prepare: Callable[[Node, list], list] | None = None


def _opset(node: Node, default: int = 17) -> int:
    return node.opset or default


def _ints(a: np.ndarray | None) -> list[int] | None:
    return None if a is None else [int(v) for v in np.asarray(a).reshape(-1)]


def erf(x: np.ndarray) -> np.ndarray:
    """erf without scipy: Abramowitz & Stegun 7.1.26 in the input's dtype (|error| < 1.5e-7, about float32's ulp at 1).

    Evaluated in place on two buffers; each operation is the one the plain formula
    copysign(1 - t*(c0 + t*(c1 + ...)) * exp(-a*a), x) with t = 1 / (1 + p*a) does, so the bits are the same.
    """
    x = np.asarray(x) if np.asarray(x).dtype.kind == "f" else np.asarray(x, dtype=np.float64)
    if x.ndim == 0:  # numpy gives scalars, not arrays to write into, for 0-d operands
        return erf(x.reshape(1)).reshape(())
    a = np.abs(x)
    t = np.multiply(a, x.dtype.type(0.3275911))
    t += 1
    np.divide(1, t, out=t)
    c = [x.dtype.type(v) for v in (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)]
    poly = np.multiply(t, c[4])
    for k in (3, 2, 1, 0):
        poly += c[k]
        poly *= t
    g = np.negative(a, out=t)
    g *= a
    np.exp(g, out=g)
    poly *= g
    np.subtract(1, poly, out=poly)
    return np.copysign(poly, x, out=poly)


def _axes(node: Node, args: Arrays, input_index: int = 1) -> list[int] | None:
    """Reduce/Squeeze/Unsqueeze axes: an attribute before opset 13/18, an input after."""
    if "axes" in node.attrs:
        return [int(a) for a in node.attrs["axes"]]
    return _ints(args[input_index]) if len(args) > input_index else None


def _reduce(fn: Callable) -> Callable:
    def kernel(node: Node, args: Arrays, ctx: KernelContext) -> list:
        x = args[0]
        axes = _axes(node, args)
        if not axes:
            if node.attr("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(x.ndim))
        return [fn(x, tuple(a % max(x.ndim, 1) for a in axes), bool(node.attr("keepdims", 1)))]
    return kernel


def _logsumexp(x, axis, keepdims):
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


REDUCE = {
    "ReduceMean": lambda x, a, k: np.mean(x, axis=a, keepdims=k),
    "ReduceSum": lambda x, a, k: np.sum(x, axis=a, keepdims=k),
    "ReduceMax": lambda x, a, k: np.max(x, axis=a, keepdims=k),
    "ReduceMin": lambda x, a, k: np.min(x, axis=a, keepdims=k),
    "ReduceProd": lambda x, a, k: np.prod(x, axis=a, keepdims=k),
    "ReduceSumSquare": lambda x, a, k: np.sum(x * x, axis=a, keepdims=k),
    "ReduceL1": lambda x, a, k: np.sum(np.abs(x), axis=a, keepdims=k),
    "ReduceL2": lambda x, a, k: np.sqrt(np.sum(x * x, axis=a, keepdims=k)),
    "ReduceLogSumExp": _logsumexp,
}


def _softmax_axis(node: Node, x: np.ndarray) -> tuple[np.ndarray, int, tuple]:
    """Softmax before opset 13 flattens to 2-D at `axis`; from 13 it works along one axis."""
    if _opset(node) >= 13:
        return x, int(node.attr("axis", -1)), x.shape
    axis = int(node.attr("axis", 1)) % x.ndim
    return x.reshape(int(np.prod(x.shape[:axis])), -1), 1, x.shape


def _softmax(node, args, ctx):
    x, axis, shape = _softmax_axis(node, args[0])
    e = np.subtract(x, np.max(x, axis=axis, keepdims=True))
    np.exp(e, out=e)
    e /= np.sum(e, axis=axis, keepdims=True)
    return [e.reshape(shape)]


def _logsoftmax(node, args, ctx):
    x, axis, shape = _softmax_axis(node, args[0])
    s = x - np.max(x, axis=axis, keepdims=True)
    return [(s - np.log(np.sum(np.exp(s), axis=axis, keepdims=True))).reshape(shape)]


def _layernorm(node, args, ctx):
    """LayerNormalization; its statistics are rounded into the stash_type dtype the resolver gives."""
    x, scale = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    axis = int(node.attr("axis", -1)) % x.ndim
    axes = tuple(range(axis, x.ndim))
    r = ctx.round_stat
    mean = r(np.mean(x, axis=axes, keepdims=True))
    centred = r(x - mean)
    var = r(np.mean(r(centred * centred), axis=axes, keepdims=True))
    eps = r(np.asarray(node.attr("epsilon", 1e-5), dtype=x.dtype))
    std = r(np.sqrt(r(var + eps)))
    inv_std = r(1.0 / std)
    y = ctx.round_normalized(centred / std)
    y = y * scale
    return [y + bias if bias is not None else y, mean, inv_std]  # Mean and InvStdDev: optional outputs


def _rmsnorm(node, args, ctx):
    x, scale = args[0], args[1]
    axes = tuple(range(int(node.attr("axis", -1)) % x.ndim, x.ndim))
    r = ctx.round_stat
    ms = r(np.mean(r(x * x), axis=axes, keepdims=True))
    eps = r(np.asarray(node.attr("epsilon", 1e-5), dtype=x.dtype))
    return [x / r(np.sqrt(r(ms + eps))) * scale]


def _skip_norm(rms: bool):
    """onnxruntime's SkipLayerNormalization / SkipSimplifiedLayerNormalization: norm(input + skip [+ bias]).

    Outputs: the normalized value, mean and inverse std (statistics, rarely read) and the residual sum,
    which optimized graphs feed to the next block.
    """
    def kernel(node, args, ctx):
        x, skip, gamma = args[0], args[1], args[2]
        beta = args[3] if len(args) > 3 and not rms else None
        bias = args[4 if not rms else 3] if len(args) > (4 if not rms else 3) else None
        total = x + skip if bias is None else x + skip + bias
        r = ctx.round_stat
        eps = r(np.asarray(node.attr("epsilon", 1e-12), dtype=total.dtype))
        if rms:
            mean = np.zeros((*total.shape[:-1], 1), dtype=total.dtype)
            centred = total
        else:
            mean = r(np.mean(total, axis=-1, keepdims=True))
            centred = r(total - mean)
        inv_std = 1.0 / r(np.sqrt(r(np.mean(r(centred * centred), axis=-1, keepdims=True) + eps)))
        y = centred * inv_std * gamma
        return [y + beta if beta is not None else y, mean, inv_std, total]
    return kernel


def _matmul(node, args, ctx):
    return [np.matmul(args[0], args[1])]


def _gemm(node, args, ctx):
    a, b = args[0], args[1]
    if node.attr("transA", 0):
        a = a.T
    if node.attr("transB", 0):
        b = b.T
    y = node.attr("alpha", 1.0) * (a @ b)
    if len(args) > 2 and args[2] is not None:
        y = y + node.attr("beta", 1.0) * args[2]
    return [y]


def _cast(node, args, ctx):
    to = int(node.attr("to", 1))
    return [_cast_to(args[0], to, ctx)]


def _cast_to(x: np.ndarray, to: int, ctx: KernelContext) -> np.ndarray:
    fmt = format_of_onnx_type(to)
    if fmt is not None and fmt.name in COMPUTED:
        # the run's float dtype holds every narrower format; its rounding happens after the kernel
        return x.astype(np.float64 if fmt.held_dtype is np.float64 else ctx.float_dtype)
    import onnx

    target = onnx.helper.tensor_dtype_to_np_dtype(to)
    if x.dtype.kind == "f" and target.kind in "iu":
        with np.errstate(invalid="ignore"):
            x = np.trunc(x)
    return x.astype(target)


def _castlike(node, args, ctx):
    like = args[1]
    if like.dtype.kind == "f":
        return [args[0].astype(np.float64 if like.dtype == np.float64 else ctx.float_dtype)]
    return [args[0].astype(like.dtype)]


def _reshape(node, args, ctx):
    x, shape = args[0], _ints(args[1])
    if not node.attr("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return [x.reshape(shape)]


def _unsqueeze(node, args, ctx):
    x = args[0]
    axes = sorted(a % (x.ndim + len(_axes(node, args))) for a in _axes(node, args))
    for a in axes:
        x = np.expand_dims(x, a)
    return [x]


def _squeeze(node, args, ctx):
    axes = _axes(node, args)
    x = args[0]
    return [np.squeeze(x, axis=tuple(a % x.ndim for a in axes)) if axes else np.squeeze(x)]


def _slice(node, args, ctx):
    x = args[0]
    if _opset(node) < 10:
        starts, ends, axes, steps = node.attr("starts"), node.attr("ends"), node.attr("axes"), None
    else:
        starts, ends = _ints(args[1]), _ints(args[2])
        axes = _ints(args[3]) if len(args) > 3 else None
        steps = _ints(args[4]) if len(args) > 4 else None
    axes = axes or list(range(len(starts)))
    steps = steps or [1] * len(starts)
    index = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        index[a % x.ndim] = slice(s, e, st)
    return [x[tuple(index)]]


def _split(node, args, ctx):
    x = args[0]
    axis = int(node.attr("axis", 0)) % x.ndim
    sizes = node.attr("split") or (_ints(args[1]) if len(args) > 1 else None)
    n = len(node.outputs)
    if not sizes:
        n = int(node.attr("num_outputs", n))
        chunk = -(-x.shape[axis] // n)
        sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(n)]
    return np.split(x, np.cumsum(sizes)[:-1], axis=axis)


def _gather(node, args, ctx):
    return [np.take(args[0], args[1].astype(np.int64), axis=int(node.attr("axis", 0)))]


def _gather_elements(node, args, ctx):
    data, idx = args[0], args[1].astype(np.int64)
    axis = int(node.attr("axis", 0)) % data.ndim
    idx = np.where(idx < 0, idx + data.shape[axis], idx)
    return [np.take_along_axis(data, idx, axis=axis)]


def _shape(node, args, ctx):
    shape = np.array(args[0].shape, dtype=np.int64)
    return [shape[node.attr("start", 0):node.attr("end", None)]]


def _const_of_shape(node, args, ctx):
    value = node.attr("value")
    if value is None:
        fill = np.zeros((), dtype=ctx.float_dtype)
    else:
        from onnx import numpy_helper

        fill = numpy_helper.to_array(value).reshape(())
        fill = fill.astype(ctx.float_dtype) if fill.dtype.kind in {"f", "V"} else fill
    return [np.full(_ints(args[0]), fill, dtype=fill.dtype)]


def _expand(node, args, ctx):
    x = args[0]
    return [np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(_ints(args[1])))).copy()]


def _transpose(node, args, ctx):
    perm = node.attr("perm")
    return [np.transpose(args[0], perm)]


def _concat(node, args, ctx):
    return [np.concatenate([a for a in args if a is not None], axis=int(node.attr("axis")))]


def _flatten(node, args, ctx):
    x = args[0]
    axis = int(node.attr("axis", 1)) % (x.ndim + 1)
    return [x.reshape(int(np.prod(x.shape[:axis])), -1)]


def _clip(node, args, ctx):
    x = args[0]
    lo = node.attr("min") if _opset(node) < 11 else (args[1] if len(args) > 1 else None)
    hi = node.attr("max") if _opset(node) < 11 else (args[2] if len(args) > 2 else None)
    if lo is not None:
        x = np.maximum(x, np.asarray(lo, dtype=x.dtype))
    if hi is not None:
        x = np.minimum(x, np.asarray(hi, dtype=x.dtype))
    return [x]


def _div(node, args, ctx):
    a, b = args
    if a.dtype.kind in "iu":
        return [np.trunc(a / b).astype(a.dtype)]
    return [a / b]


def _pow(node, args, ctx):
    a, b = args
    if a.dtype.kind == "f":
        b = b.astype(a.dtype)
        # x**2 and x**0.5 have faster exact forms; numpy's power is slow
        if b.size == 1 and float(b.reshape(())) == 2.0:
            return [a * a]
        if b.size == 1 and float(b.reshape(())) == 0.5:
            return [np.sqrt(a)]
    return [np.power(a, b)]


def _gelu(node, args, ctx):
    x = args[0]
    if node.attr("approximate", "none") == "tanh":
        return [0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi).astype(x.dtype) * (x + 0.044715 * x ** 3)))]
    return [0.5 * x * (1 + erf(x / np.sqrt(2).astype(x.dtype)))]


def _trilu(node, args, ctx):
    k = int(args[1]) if len(args) > 1 and args[1] is not None else 0
    return [np.triu(args[0], k) if node.attr("upper", 1) else np.tril(args[0], k)]


def _range(node, args, ctx):
    start, limit, delta = (a.reshape(()) for a in args)
    return [np.arange(start, limit, delta, dtype=args[0].dtype)]


def _where(node, args, ctx):
    return [np.where(args[0], args[1], args[2])]


def _dropout(node, args, ctx):
    outs = [args[0]]
    if len(node.outputs) > 1:
        outs.append(np.ones(args[0].shape, dtype=bool))
    return outs


def _argext(fn):
    def kernel(node, args, ctx):
        x, axis = args[0], int(node.attr("axis", 0))
        if node.attr("select_last_index", 0):
            flipped = np.flip(x, axis)
            out = x.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            out = fn(x, axis=axis)
        out = out.astype(np.int64)
        return [np.expand_dims(out, axis) if node.attr("keepdims", 1) else out]
    return kernel


def _variadic(fn):
    def kernel(node, args, ctx):
        out = args[0]
        for a in args[1:]:
            out = fn(out, a)
        return [out]
    return kernel


def _unary(fn):
    return lambda node, args, ctx: [fn(args[0])]


def _binary(fn):
    return lambda node, args, ctx: [fn(args[0], args[1])]


def _leaky(node, args, ctx):
    x = args[0]
    return [np.where(x >= 0, x, x * np.asarray(node.attr("alpha", 0.01), x.dtype))]


def _sigmoid(x):
    # the two-sided form never evaluates exp of a large positive number
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _softplus(x):
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


def _mod(node, args, ctx):
    """fmod=1: the sign of the dividend (C's fmod, required for floats); fmod=0: the sign of the divisor."""
    return [(np.fmod if node.attr("fmod", 0) else np.mod)(args[0], args[1])]


def _einsum(node, args, ctx):
    return [np.einsum(node.attr("equation"), *args)]


def _cumsum(node, args, ctx):
    x, axis = args[0], int(args[1].reshape(()))
    if node.attr("reverse", 0):
        x = np.flip(x, axis)
    out = np.cumsum(x, axis=axis)
    if node.attr("exclusive", 0):
        out = out - x
    return [np.flip(out, axis) if node.attr("reverse", 0) else out]


def _channel(v: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    """A per-channel vector shaped to broadcast along axis of an ndim-d tensor (a scalar stays as it is)."""
    if v.ndim == 0 or v.size == 1:
        return v.reshape(())
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return v.reshape(shape)


def _batchnorm(node, args, ctx):
    """Inference-mode BatchNormalization (every opset): the stored running statistics, channels on axis 1."""
    x, scale, bias, mean, var = args[:5]
    eps = np.asarray(node.attr("epsilon", 1e-5), dtype=x.dtype)
    c = [_channel(a, x.ndim, 1) for a in (scale, bias, mean, var)]
    return [(x - c[2]) / np.sqrt(c[3] + eps) * c[0] + c[1]]


# onnxruntime's contrib norms, common in fp16 models its optimizer fused; their kernels keep float32 statistics.
MS_KERNELS: dict[str, Callable[[Node, Arrays, KernelContext], list]] = {
    "LayerNormalization": _layernorm,
    "SimplifiedLayerNormalization": _rmsnorm,
    "SkipLayerNormalization": _skip_norm(rms=False),
    "SkipSimplifiedLayerNormalization": _skip_norm(rms=True),
}

KERNELS: dict[str, Callable[[Node, Arrays, KernelContext], list]] = {
    "Add": _binary(np.add), "Sub": _binary(np.subtract), "Mul": _binary(np.multiply), "Div": _div,
    "Pow": _pow, "Mod": _mod, "Equal": _binary(np.equal), "Less": _binary(np.less),
    "LessOrEqual": _binary(np.less_equal), "Greater": _binary(np.greater), "GreaterOrEqual": _binary(np.greater_equal),
    "And": _binary(np.logical_and), "Or": _binary(np.logical_or), "Xor": _binary(np.logical_xor),
    "Not": _unary(np.logical_not), "Neg": _unary(np.negative), "Abs": _unary(np.abs), "Sqrt": _unary(np.sqrt),
    "Reciprocal": _unary(np.reciprocal), "Exp": _unary(np.exp), "Log": _unary(np.log), "Relu": _unary(lambda x: np.maximum(x, 0)),
    "Sigmoid": _unary(_sigmoid), "Tanh": _unary(np.tanh), "Erf": _unary(erf), "Sin": _unary(np.sin), "Cos": _unary(np.cos),
    "Floor": _unary(np.floor), "Ceil": _unary(np.ceil), "Round": _unary(np.round), "Sign": _unary(np.sign),
    "IsNaN": _unary(np.isnan), "IsInf": _unary(np.isinf), "Softplus": _unary(_softplus), "Identity": _unary(lambda x: x),
    "LeakyRelu": _leaky, "Gelu": _gelu,
    "Max": _variadic(np.maximum), "Min": _variadic(np.minimum), "Sum": _variadic(np.add),
    "MatMul": _matmul, "Gemm": _gemm, "Einsum": _einsum,
    "Softmax": _softmax, "LogSoftmax": _logsoftmax, "LayerNormalization": _layernorm, "RMSNormalization": _rmsnorm,
    **{op: _reduce(fn) for op, fn in REDUCE.items()},
    "ArgMax": _argext(np.argmax), "ArgMin": _argext(np.argmin),
    "Cast": _cast, "CastLike": _castlike, "Reshape": _reshape, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze,
    "Slice": _slice, "Split": _split, "Gather": _gather, "GatherElements": _gather_elements, "Shape": _shape, "Size": lambda n, a, c: [np.array(a[0].size, np.int64)],
    "ConstantOfShape": _const_of_shape, "Expand": _expand, "Transpose": _transpose, "Concat": _concat,
    "Flatten": _flatten, "Clip": _clip, "Trilu": _trilu, "Range": _range, "Where": _where, "Dropout": _dropout,
    "CumSum": _cumsum, "BatchNormalization": _batchnorm,
}
