"""The compute spec of a node: how the emulated run computes it, decided for every node in one function."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..analysis.compute_dtype import DtypeResolver
from ..analysis.quantized import GEMMS, gemm_axes
from ..dtypes import FORMATS, Format, quantize
from ..ir import Node
from .kernels import KernelContext
from .rounding import round_into

__all__ = ["ComputeSpec", "compute_spec", "kernel_context"]

# Fused norms whose statistics dtype is the stash_type attribute, from this opset on (before it, the input's dtype).
_STASH_NORMS = {"LayerNormalization": 17, "RMSNormalization": 23}

# The numpy kernels' context for a node that computes as they do: float32, nothing inside it rounded.
_FLOAT32 = KernelContext(np.float32)


@dataclass(frozen=True)
class ComputeSpec:
    """How a node computes in the emulated run, beyond the formats its inputs and outputs are held in.

    Every kernel computes in float32 on inputs that hold values of their formats, and its outputs are rounded into
    theirs: what a GPU kernel does. fmt is the format the node computes in, as the resolver says (None for a node
    without a float input). accumulate is the narrow format the node's inner statistics are rounded into (a fused
    norm's stash_type); None: they stay float32, as the kernel keeps them. fused and flush_subnormals are for the
    runtime models to come (one kernel for a chain of ops; subnormal results flushed to zero): no engine runs them
    yet, and compute_spec leaves them False.
    """

    fmt: Format | None
    accumulate: Format | None = None
    fused: bool = False
    flush_subnormals: bool = False
    # the formats the runtime's kernel rounds its float activations and its float constants into before it computes,
    # and the one it writes its outputs in before they are converted to their held formats: OpenVINO CPU's bfloat16
    # FullyConnected (None: inputs read as held, outputs rounded straight into their formats)
    reads: Format | None = None
    weights: Format | None = None
    writes: Format | None = None
    normalized: Format | None = None  # a LayerNormalization's normalized value, before its scale and bias
    blocks: Format | None = None  # a block-scaled format the node's multiplied inputs are quantized into first


def compute_spec(node: Node, resolver: DtypeResolver) -> ComputeSpec:
    """The one place a node's compute spec is decided: the resolver's dtype, which the runtime model (--runtime) has
    already decided where it knows the kernel, and the statistics of a fused norm."""
    dtype = resolver.of_node(node)
    fmt = dtype.fmt if dtype is not None else None
    kernel = dtype.kernel if dtype is not None else None
    target = resolver.target
    # --dtype mxfp8|mxfp4|nvfp4: what MatMul, Gemm and Conv multiply is quantized block by block, along the axis
    # each input sums over; a node --keep-fp32 keeps reads its inputs as they are
    blocks = target if (target.blocked and node.op_type in GEMMS and node.domain in ("", "ai.onnx")
                        and resolver.kept_by(node) is None) else None
    if kernel is None:
        return ComputeSpec(fmt, _statistics_format(node, resolver, fmt), blocks=blocks)
    return ComputeSpec(fmt, _statistics_format(node, resolver, fmt), reads=_named(kernel.reads),
                       weights=_named(kernel.weights), writes=_named(kernel.writes),
                       normalized=_named(kernel.normalized), blocks=blocks)


def _named(name: str | None) -> Format | None:
    return FORMATS[name] if name is not None else None


def _statistics_format(node: Node, resolver: DtypeResolver, fmt: Format | None) -> Format | None:
    """A fused norm computes its statistics in its stash_type dtype (float32 by default), not the input's: that
    format where it is narrow, else None."""
    decided = resolver.statistics_by_runtime(node)  # a runtime's kernel (float16 sums in SkipLayerNormalization)
    if decided is not None:
        return None if decided.fmt.wide else decided.fmt
    since = _STASH_NORMS.get(node.op_type)
    if since is None or node.domain not in ("", "ai.onnx"):
        return None
    if node.opset is not None and node.opset < since:
        stats = fmt
    else:
        stash = node.attrs.get("stash_type")
        dtype = resolver.of_stash(node, None if stash is None else int(stash), "")
        stats = dtype.fmt if dtype is not None else None
    return None if stats is None or stats.wide else stats


def kernel_context(spec: ComputeSpec) -> KernelContext:
    """The numpy kernels' context that computes a node as its spec says."""
    if spec.fused or spec.flush_subnormals:
        raise NotImplementedError("fused kernels and flushed subnormals have no emulation yet")
    accumulate, normalized, blocks = spec.accumulate, spec.normalized, spec.blocks
    if accumulate is None and normalized is None and blocks is None:
        return _FLOAT32
    context = KernelContext(np.float32, prepare=_quantizer(blocks))
    if accumulate is not None:
        context.round_stat = _rounding(accumulate)
    if normalized is not None:
        context.round_normalized = _rounding(normalized)
    return context


def _rounding(fmt: Format) -> Callable[[np.ndarray], np.ndarray]:
    def round_to(a: np.ndarray) -> np.ndarray:
        return round_into(np.asarray(a), fmt)

    return round_to


def _quantizer(fmt: Format | None):
    """The inputs of a MatMul, Gemm or Conv in a block-scaled format: each multiplied float input quantized along
    the axis the product sums over (NVFP4's global scale from each tensor); None without a format."""
    if fmt is None:
        return None

    def prepare(node: Node, args: list) -> list:
        axes = gemm_axes(node, [np.ndim(a) if a is not None else 0 for a in args])
        return [quantize(a, fmt, axis) if axis is not None and a is not None and a.dtype.kind == "f" else a
                for a, axis in zip(args, axes + [None] * (len(args) - len(axes)))]
    return prepare
