"""Which parts of a model are quantized: QDQ pairs, integer ops, and the float parts the audit judges.

An int8 model is audited like any other, but its report says so: the integer ops (MatMulInteger, QLinearConv, ...)
compute in integers whatever --dtype says, so the audit judges the float parts around them (scales, rescales,
norms, softmaxes) and the Casts that turn an integer accumulator back into a float, which a float16 converter
makes float16: an int8 x int8 sum over K terms reaches K * 127 * 128 (16,256 per term), beyond 65504 from K = 5.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..dtypes import (
    COMPUTED,
    ELEMENTS,
    FORMATS,
    BlockScales,
    Format,
    block_scales,
    blocks_along,
    global_scale_of,
    round_elements,
)
from ..ir import Graph, Node, Value

__all__ = [
    "GEMMS",
    "INTEGER_OPS",
    "QDQ_OPS",
    "TRT_QDQ_OPS",
    "BlockCounts",
    "Quantization",
    "block_attr",
    "gemm_axes",
    "quantization",
]

# ModelOpt's TensorRT ops (domain trt; modelopt/torch/quantization/export_onnx.py and onnx/quantization/qdq_utils.py)
TRT_QDQ_OPS = ("TRT_FP8QuantizeLinear", "TRT_FP8DequantizeLinear", "TRT_FP4DynamicQuantize", "TRT_FP4QDQ",
               "TRT_MXFP8DynamicQuantize", "TRT_MXFP8DequantizeLinear", "TRT_INT4QuantizeLinear",
               "TRT_INT4DequantizeLinear")
QDQ_OPS = ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", *TRT_QDQ_OPS)
# ops whose arithmetic is integer (their float inputs, if any, are scales)
INTEGER_OPS = ("MatMulInteger", "ConvInteger", "QLinearMatMul", "QLinearConv", "QLinearAdd", "QLinearMul",
               "QLinearSigmoid", "QLinearLeakyRelu", "QLinearAveragePool", "QLinearGlobalAveragePool",
               "QLinearConcat", "QLinearSoftmax", "QAttention", "QGemm", "DynamicQuantizeMatMul",
               "MatMulIntegerToFloat", "MatMulNBits", "QOrderedMatMul")


@dataclass
class Quantization:
    """What is quantized in one model: op counts, and how many nodes compute in float."""

    ops: dict[str, int] = field(default_factory=dict)  # each QDQ or integer op type, and how many
    integer_nodes: int = 0  # nodes whose arithmetic is integer
    float_nodes: int = 0  # every other node with a float output: what the audit judges
    accumulator_casts: list[str] = field(default_factory=list)  # Casts of an integer accumulator to a float
    blocks: dict[str, int] = field(default_factory=dict)  # block-scaled data ("float4_e2m1fn in blocks of 16"): nodes

    def describe(self) -> str:
        ops = ", ".join(f"{n} {op}" for op, n in self.ops.items())
        casts = (f"; {len(self.accumulator_casts)} Cast{'s' * (len(self.accumulator_casts) != 1)} of an integer "
                 "accumulator to float, which a float16 converter makes float16" if self.accumulator_casts else "")
        n = self.integer_nodes
        blocks = "".join(f"; {k} node{'s' * (k != 1)} with {data}" for data, k in self.blocks.items())
        return (f"quantized ({ops}{blocks}): {n} node{'s' * (n != 1)} compute{'s' * (n == 1)} in integers and "
                f"{'is' if n == 1 else 'are'} not judged as float; the audit covers the {self.float_nodes} float nodes (scales, "
                f"rescales, norms, softmaxes){casts}")

    def record(self) -> dict:
        return {"ops": dict(self.ops), "integer_nodes": self.integer_nodes, "float_nodes": self.float_nodes,
                "accumulator_casts": list(self.accumulator_casts), **({"blocks": dict(self.blocks)} if self.blocks else {})}


_ACCUMULATORS = ("MatMulInteger", "ConvInteger")
_QUANTIZED_OPS = frozenset(QDQ_OPS + INTEGER_OPS)


def quantization(graph: Graph) -> Quantization | None:
    """The model's quantized parts, or None when it has none."""
    if _QUANTIZED_OPS.isdisjoint({node.op_type for node in graph.nodes}):
        return None  # most models: one look at each op type instead of the float-node count below
    found = Quantization()
    for node in graph.nodes:
        if node.op_type in QDQ_OPS or node.op_type in INTEGER_OPS:
            found.ops[node.op_type] = found.ops.get(node.op_type, 0) + 1
            data = _blocked_data(node)
            if data is not None:
                found.blocks[data] = found.blocks.get(data, 0) + 1
            if node.op_type in INTEGER_OPS:
                found.integer_nodes += 1
                continue
        if any(v.dtype in COMPUTED for v in node.outputs if v is not None):
            found.float_nodes += 1
        if node.op_type == "Cast" and _from_accumulator(node.input(0)):
            found.accumulator_casts.append(node.name)
    return found if found.ops else None


# integer ops between an accumulator and its Cast: onnxruntime's quantizer adds the int32 bias (ConvInteger →
# Add → Cast, "*_bias_add_cast"), reshapes move it
_INTEGER_PASS = frozenset({"Add", "Sub", "Mul", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity"})


def _from_accumulator(value: Value | None) -> bool:
    """Whether value is an integer accumulator's output, directly or through integer adds, products and moves (at
    most 8 nodes back, each read of an integer input followed)."""
    todo, seen = [value], 0
    while todo and seen < 8:
        current = todo.pop()
        producer = current.producer if current is not None else None
        if producer is None:
            continue
        if producer.op_type in _ACCUMULATORS:
            return True
        seen += 1
        if producer.op_type in _INTEGER_PASS and current is not None and current.dtype in _INTEGERS:
            todo += [v for v in producer.inputs if v is not None and v.dtype in _INTEGERS]
    return False


_INTEGERS = ("int32", "int64", "int16", "int8", "uint8")


def block_attr(node: Node, default: int) -> int | None:
    """A node's block_size attribute (default where it has none); None where it is no positive integer (a model
    from anywhere may write block_size -3 or "x")."""
    value = node.attr("block_size", default)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


# ModelOpt's ops that quantize in blocks, and the format they use
_TRT_BLOCKED = {"TRT_FP4DynamicQuantize": ("nvfp4", 16), "TRT_FP4QDQ": ("nvfp4", 16),
                "TRT_MXFP8DynamicQuantize": ("mxfp8", 32), "TRT_MXFP8DequantizeLinear": ("mxfp8", 32)}


def _blocked_data(node: Node) -> str | None:
    """What a blocked quantize or dequantize node holds its data in ("float4_e2m1fn in blocks of 16"); None for one
    that quantizes per tensor or per axis."""
    trt = _TRT_BLOCKED.get(node.op_type)
    block = block_attr(node, trt[1] if trt else 0)
    if not block:
        return None
    if trt is not None:
        return f"{FORMATS[trt[0]].long_name} blocks of {block}"
    data = node.input(0) if "Dequantize" in node.op_type else node.outputs[0]
    dtype = data.dtype if data is not None else None
    name = ELEMENTS[dtype].long_name if dtype in ELEMENTS else dtype or "data"
    return f"{name} in blocks of {block}"


# ---- what quantizing a tensor block by block does to it -----------------------------------------------------------

_ROWS_ELEMENTS = 1 << 20  # elements quantized at a time: the temporaries stay at tens of MB, whatever the tensor
_WORST = 3  # blocks a finding names


@dataclass
class BlockCounts:
    """What quantizing a tensor (or several samples of an activation) block by block along one axis does to it,
    counted exactly: values that become 0 or saturate (beyond the elements' max by half a step or more, so clipped
    rather than rounded), blocks more than half of whose nonzero values become 0 (owned by their largest value),
    block scales that underflow, saturate or are NaN in their format, and the
    error against the float32 numbers."""

    fmt: Format
    elements: int = 0
    nonzero: int = 0
    blocks: int = 0
    zeroed: int = 0
    saturated: int = 0
    owned: int = 0
    scale_underflow: int = 0
    scale_saturated: int = 0
    scale_nan: int = 0
    nan: int = 0  # finite values that come back NaN (their block's scale is NaN)
    err2: float = 0.0
    ref2: float = 0.0
    worst: list[tuple[int, str]] = field(default_factory=list)  # (zeroed in the block, its description)
    worst_scale: str = ""

    def add(self, data: np.ndarray, axis: int, name: str, global_scale: float | None = None) -> None:
        """Count one tensor (blocks of fmt.block along axis), a chunk of rows at a time; global_scale: NVFP4's
        (None: computed from this tensor, as ModelOpt does for weights)."""
        fmt = self.fmt
        if global_scale is None:
            global_scale = global_scale_of(data, fmt)
        moved = np.moveaxis(np.asarray(data), axis % max(np.ndim(data), 1), -1)
        outer, n = moved.shape[:-1], moved.shape[-1] if moved.ndim else 1
        rows = moved.reshape(-1, n)
        step = max(1, _ROWS_ELEMENTS // max(n, 1))
        for start in range(0, rows.shape[0], step):
            self._chunk(rows[start:start + step], start, outer, axis % max(np.ndim(data), 1), name, global_scale)

    def _chunk(self, rows: np.ndarray, first: int, outer: tuple, axis: int, name: str, global_scale: float) -> None:
        fmt, element = self.fmt, self.fmt.element
        blocks, _ = blocks_along(rows, fmt.block, -1)
        with np.errstate(invalid="ignore"):
            amax = np.max(np.abs(blocks), axis=-1)
        scales = block_scales(amax, fmt, global_scale)
        step = scales.step()[..., None]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # as dtypes.quantize computes them
            scaled = np.where(step != 0, np.divide(blocks, step, dtype=np.float32), np.float32(0))
            q = np.where(step != 0, round_elements(scaled, element) * step, np.float32(0)).astype(np.float64)
        blocks = blocks.astype(np.float64)
        finite = np.isfinite(blocks)
        nonzero = finite & (blocks != 0)
        zeroed = nonzero & (q == 0)
        per_block = zeroed.sum(axis=-1)
        owned = 2 * per_block > nonzero.sum(axis=-1)
        self.elements += int(rows.size)
        self.nonzero += int(np.count_nonzero(nonzero))
        self.blocks += int(amax.size)
        self.zeroed += int(np.count_nonzero(zeroed))
        with np.errstate(invalid="ignore"):  # beyond max and half a step: clipped, not rounded, to max
            self.saturated += int(np.count_nonzero(finite & (np.abs(scaled) >= element.overflow_threshold)))
        self.nan += int(np.count_nonzero(finite & np.isnan(q)))
        good = finite & np.isfinite(q)
        self.err2 += float(np.sum(np.square(np.where(good, q - blocks, 0.0))))
        self.ref2 += float(np.sum(np.square(np.where(good, blocks, 0.0))))
        lost = self._scales(amax, scales, first, outer, axis, name)
        owned &= ~lost  # a block whose scale underflowed or is NaN is the scale's, not owned by its largest value
        self.owned += int(np.count_nonzero(owned))
        for index in np.argwhere(owned)[: 4 * _WORST]:
            self._note_worst(blocks, zeroed, nonzero, tuple(index), first, outer, axis, name)

    def _scales(self, amax: np.ndarray, scales: BlockScales, first: int, outer: tuple, axis: int,
                name: str) -> np.ndarray:
        """Count the block scales that underflow, saturate or are NaN; returns the blocks whose scale does."""
        scale_fmt = self.fmt.scale
        assert scale_fmt is not None  # (a block-scaled format)
        live = np.isfinite(amax) & (amax > 0)
        under = live & ((scales.stored == 0) | (scales.ideal < scales.stored if scale_fmt.name == "fp8-e8m0" else False))
        with np.errstate(invalid="ignore"):
            over = live & (np.isnan(scales.stored) | (scales.ideal > scale_fmt.max))
        self.scale_underflow += int(np.count_nonzero(under))
        self.scale_saturated += int(np.count_nonzero(over))
        self.scale_nan += int(np.count_nonzero(~np.isfinite(amax)))
        if not self.worst_scale and (under.any() or over.any()):
            index = tuple(np.argwhere(under | over)[0])
            kind = "underflows to " + ("0" if scales.stored[index] == 0 else f"{scales.stored[index]:.3g}") \
                if under[index] else f"saturates ({scales.ideal[index]:.4g} > {scale_fmt.max:g})"
            self.worst_scale = (f"{_where(name, index, first, outer, axis, self.fmt.block)}: largest |x| "
                                f"{amax[index]:.3g}, scale {scales.ideal[index]:.3g} {kind} in {scale_fmt.long_name}")
        return under | over | ~np.isfinite(amax)

    def _note_worst(self, blocks, zeroed, nonzero, index: tuple, first: int, outer: tuple, axis: int, name: str):
        values = np.sort(np.abs(blocks[index][nonzero[index]]))[::-1]
        count = int(zeroed[index].sum())
        text = (f"{_where(name, index, first, outer, axis, self.fmt.block)}: {count} of {values.size} nonzero values "
                f"become 0 (largest |x| {values[0]:.4g}, next {values[1] if values.size > 1 else 0.0:.4g})")
        self.worst = sorted([*self.worst, (count, text)], key=lambda t: -t[0])[:_WORST]

    def facts(self) -> dict[str, Any]:
        """The counts as site facts (fractions of the nonzero values, of the blocks)."""
        nz, blocks = max(self.nonzero, 1), max(self.blocks, 1)
        assert self.fmt.scale is not None  # (a block-scaled format)
        return {"format": self.fmt.long_name, "block": self.fmt.block, "scale_format": self.fmt.scale.long_name,
                "elements": self.elements,
                "nonzero": self.nonzero, "blocks": self.blocks, "zeroed_count": self.zeroed,
                "zeroed_fraction": self.zeroed / nz, "saturated_count": self.saturated,
                "owned_blocks": self.owned, "owned_fraction": self.owned / blocks,
                "worst_blocks": "; ".join(text for _, text in self.worst),
                "scale_underflow_blocks": self.scale_underflow, "scale_saturated_blocks": self.scale_saturated,
                "scale_nan_blocks": self.scale_nan, "worst_scale": self.worst_scale, "nan_count": self.nan,
                "rel_error": math.sqrt(self.err2 / self.ref2) if self.ref2 > 0 else 0.0}


def _where(name: str, index: tuple, first: int, outer: tuple, axis: int, block: int) -> str:
    """A block as numpy indexing of the original tensor: W[0:32, 3]."""
    row, b = index[0] + first, index[-1]
    parts = [str(i) for i in np.unravel_index(row, outer)] if outer else []
    parts.insert(axis, f"{b * block}:{(b + 1) * block}")
    return f"{name}[{', '.join(parts)}]"


# MatMul, Gemm and Conv: what a block-scaled format (--dtype mxfp8) quantizes, along the axis each input sums over
GEMMS = ("MatMul", "Gemm", "Conv")


def gemm_axes(node: Node, ndims: list[int]) -> list[int | None]:
    """Per input of a MatMul, Gemm or Conv (ndims: each input's rank), the axis the product sums over, which blocks
    run along; None for an input that is not multiplied (a bias)."""
    if node.op_type == "MatMul":
        return [max(ndims[0] - 1, 0), max(ndims[1] - 2, 0) if len(ndims) > 1 else None]
    if node.op_type == "Gemm":
        return [0 if node.attr("transA", 0) else 1, 1 if node.attr("transB", 0) else 0, None][:len(ndims)]
    return [1, 1, None][:len(ndims)]  # Conv: input channels, of the data [N, C, ...] and the weight [M, C/group, ...]
