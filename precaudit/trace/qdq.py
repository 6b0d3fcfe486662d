"""numpy kernels for quantize and dequantize ops: ONNX QuantizeLinear/DequantizeLinear of every opset to 25 (per
tensor, per axis and blocked; int4/int8/int16, FP8 and FP4 data; E8M0 scales; output_dtype, saturate, precision),
and ModelOpt's TensorRT custom ops of the `trt` domain (modelopt/torch/quantization/export_onnx.py).

A float output (an FP8 tensor, a dequantized one) is held in the run's float dtype, its rounding into the format
the resolver gives it done after the kernel; data of a type no graph computes on (FP4, int4, int8, E8M0 codes) is
returned as its own numpy dtype, as onnxruntime gives it, for the dequantizing node to read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import ml_dtypes
import numpy as np

from ..analysis.quantized import block_attr
from ..dtypes import COMPUTED, ELEMENTS, FORMATS, Format, format_of_onnx_type, quantize, quantize_blocks, round_elements
from ..ir import Node
from .kernels import KernelContext

__all__ = ["QDQ_KERNELS", "TRT_KERNELS"]

Arrays = list  # list[np.ndarray | None]

_E4M3 = ELEMENTS["fp8-e4m3"]


def _expand(scale: np.ndarray, shape: tuple, axis: int, block: int) -> np.ndarray:
    """A scale (or zero point) shaped to multiply data of `shape`: a scalar as it is, one per index of axis, or one
    per block of `block` along axis (repeated, the last block cut to the data)."""
    s = np.asarray(scale)
    if s.size == 1 and not block:
        return s.reshape(())
    axis %= len(shape)
    if not block:
        view = [1] * len(shape)
        view[axis] = -1
        return s.reshape(view)
    return np.take(np.repeat(s, block, axis=axis), np.arange(shape[axis]), axis=axis)


def _as_float(a: np.ndarray) -> np.ndarray:
    """Quantized data or a scale as float64 numbers (ml_dtypes' FP4, FP8, E8M0 and int4 types included)."""
    return np.asarray(a).astype(np.float64)


def _output(values: np.ndarray, element: Format | None, onnx_type: int) -> np.ndarray:
    """Quantized values as the node outputs them: a format graphs compute on (FP8) held in float32, rounded after
    the kernel; FP4 and integer data as their own numpy dtype."""
    if element is not None and element.name in COMPUTED:
        return values.astype(np.float32)
    if element is not None:
        return values.astype(element.np_dtype)
    import onnx

    return values.astype(onnx.helper.tensor_dtype_to_np_dtype(onnx_type))


def _dequantize(node: Node, args: Arrays, ctx: KernelContext) -> list:
    """(x - zero_point) * scale, per tensor, per axis or per block of block_size along axis (opset 21 on)."""
    x, scale = args[0], args[1]
    zero = args[2] if len(args) > 2 else None
    axis, block = int(node.attr("axis", 1)), int(node.attr("block_size", 0))
    q = _as_float(x)
    if zero is not None:
        q = q - _expand(_as_float(zero), q.shape, axis, block)
    with np.errstate(over="ignore", invalid="ignore"):
        return [(q * _expand(_as_float(scale), q.shape, axis, block)).astype(ctx.float_dtype)]


_INT_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535),
               "int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}


def _quantize_linear(node: Node, args: Arrays, ctx: KernelContext) -> list:
    """saturate(round(x / scale) + zero_point), the output type from the zero point, else output_dtype, else uint8;
    float outputs round to nearest even with saturation unless saturate=0 (then beyond max: NaN, or inf in E5M2)."""
    x, scale = args[0], args[1]
    zero = args[2] if len(args) > 2 else None
    axis, block = int(node.attr("axis", 1)), int(node.attr("block_size", 0))
    onnx_type = _quantized_type(node, zero)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        scaled = np.asarray(x, np.float32) / _expand(np.asarray(scale, np.float32), np.shape(x), axis, block)
        precision = format_of_onnx_type(int(node.attr("precision", 0)))
        if precision is not None and precision.is_narrow:  # the division computed in that precision (opset 23)
            scaled = quantize(scaled, precision).astype(np.float32)
        element = format_of_onnx_type(onnx_type)
        if element is not None:
            q = round_elements(scaled, element, saturate=bool(node.attr("saturate", 1)))  # (FP4 always saturates)
            if zero is not None:
                q = q + _expand(_as_float(zero), q.shape, axis, block).astype(np.float32)
            return [_output(q, element, onnx_type)]
        import onnx

        low, high = _INT_RANGES[np.dtype(onnx.helper.tensor_dtype_to_np_dtype(onnx_type)).name]
        q = np.rint(scaled)  # round half to even
        if zero is not None:
            q = q + _expand(_as_float(zero), q.shape, axis, block)
        return [_output(np.clip(np.nan_to_num(q), low, high), None, onnx_type)]


def _quantized_type(node: Node, zero: np.ndarray | None) -> int:
    """The ONNX element type QuantizeLinear makes: the zero point's, else output_dtype, else uint8 (2)."""
    if zero is not None:
        import onnx

        return onnx.helper.np_dtype_to_tensor_dtype(np.asarray(zero).dtype)
    return int(node.attr("output_dtype", 0)) or 2


# ---- ModelOpt's TensorRT ops (domain trt) --------------------------------------------------------------------------

def _fp8_quantize(node: Node, args: Arrays, ctx: KernelContext) -> list:
    """TRT_FP8QuantizeLinear(x, scale): x / scale in E4M3, saturated, as the uint8 bytes ModelOpt types it with."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        q = round_elements(np.asarray(args[0], np.float32) / np.asarray(args[1], np.float32), _E4M3)
    return [q.astype(_E4M3.np_dtype).view(np.uint8)]


def _e4m3(data: np.ndarray) -> np.ndarray:
    """E4M3 data as numbers: ModelOpt's uint8 bytes are E4M3 bits."""
    a = np.asarray(data)
    return (a.view(_E4M3.np_dtype) if a.dtype == np.uint8 else a).astype(np.float64)


def _fp8_dequantize(node: Node, args: Arrays, ctx: KernelContext) -> list:
    """TRT_FP8DequantizeLinear(q, scale): q * scale."""
    return [(_e4m3(args[0]) * _as_float(args[1])).astype(ctx.float_dtype)]


def _fp4_dynamic_quantize(node: Node, args: Arrays, ctx: KernelContext) -> list:
    """TRT_FP4DynamicQuantize(x, global_scale; axis, block_size, scale_type): NVFP4's block scales from each
    block's amax and the given float32 global scale, and the FP4 elements; outputs (FP4 data, E4M3 scales)."""
    fmt = _with_block(FORMATS["nvfp4"], node, 16)
    elements, scales = quantize_blocks(args[0], fmt, int(node.attr("axis", -1)),
                                       float(np.asarray(args[1], np.float32).reshape(-1)[0]))
    return [elements.astype(fmt.element.np_dtype), scales.stored.astype(np.float32)]


def _mxfp8_dynamic_quantize(node: Node, args: Arrays, ctx: KernelContext) -> list:
    """TRT_MXFP8DynamicQuantize(x; axis, block_size, output_dtype): MX block scales (OCP MX: 2**(floor(log2 amax)
    - 8)) and E4M3 elements; outputs (FP8 data, E8M0 scales as their uint8 codes, 255 for NaN)."""
    fmt = _with_block(FORMATS["mxfp8"], node, 32)
    elements, scales = quantize_blocks(args[0], fmt, int(node.attr("axis", -1)))
    return [elements, scales.stored.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)]


def _mxfp8_dequantize(node: Node, args: Arrays, ctx: KernelContext) -> list:
    """TRT_MXFP8DequantizeLinear(x, scale; axis, block_size, output_dtype): x times its block's scale, the scale an
    E8M0 code (uint8: 2**(code - 127), 255 NaN) or a float."""
    x, scale = np.asarray(args[0]), np.asarray(args[1])
    if scale.dtype == np.uint8:
        scale = scale.view(ml_dtypes.float8_e8m0fnu)
    axis, block = int(node.attr("axis", -1)), int(node.attr("block_size", 32))
    q = _e4m3(x)
    with np.errstate(over="ignore", invalid="ignore"):
        return [(q * _expand(_as_float(scale), q.shape, axis, block if scale.size > 1 else 0)).astype(ctx.float_dtype)]


def _fp4_qdq(node: Node, args: Arrays, ctx: KernelContext) -> list:
    """TRT_FP4QDQ(x; block_size): a weight quantized to NVFP4 and back, its global scale from its own amax (the
    static recipe ModelOpt replaces with two DequantizeLinear nodes)."""
    fmt = _with_block(FORMATS["nvfp4"], node, 16)
    return [quantize(args[0], fmt, axis=-1).astype(ctx.float_dtype)]


def _with_block(fmt: Format, node: Node, default: int) -> Format:
    block = block_attr(node, default)
    if block is None:
        raise ValueError(f"block_size {node.attr('block_size')!r} is no positive integer")
    return fmt if block == fmt.block else dataclasses.replace(fmt, block=block)


QDQ_KERNELS: dict[str, Callable[[Node, Arrays, KernelContext], list]] = {
    "DequantizeLinear": _dequantize, "QuantizeLinear": _quantize_linear,
}
TRT_KERNELS: dict[str, Callable[[Node, Arrays, KernelContext], list]] = {
    "DequantizeLinear": _dequantize, "QuantizeLinear": _quantize_linear,
    "TRT_INT4DequantizeLinear": _dequantize, "TRT_INT4QuantizeLinear": _quantize_linear,
    "TRT_FP8QuantizeLinear": _fp8_quantize, "TRT_FP8DequantizeLinear": _fp8_dequantize,
    "TRT_FP4DynamicQuantize": _fp4_dynamic_quantize, "TRT_FP4QDQ": _fp4_qdq,
    "TRT_MXFP8DynamicQuantize": _mxfp8_dynamic_quantize, "TRT_MXFP8DequantizeLinear": _mxfp8_dequantize,
}
