"""onnxruntime's CPU execution provider (x86_64), 1.32: float16 arithmetic runs in float32 between inserted Casts.

Read in onnxruntime's core/optimizer/insert_cast_transformer.cc (InsertCastTransformer, RemoveDuplicateCastTransformer,
IsIsolatedFp16Node), core/providers/cpu/nn/layer_norm_impl.cc and contrib_ops/cpu/skip_layer_norm.cc; the float16
kernel list measured here on onnxruntime 1.32.0 with one-node float16 models (tests/test_runtime_ort_cpu.py probes it
again at test time and compares it with FP16_KERNELS).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Fact, Kernel, Runtime

if TYPE_CHECKING:
    from ..dtypes import Format
    from ..ir import Graph, Node, Value

__all__ = ["FP16_KERNELS", "WIDENING_NORMS", "OrtCpu"]

_MS = "com.microsoft"
# (domain, op) with a float16 kernel on the CPU EP (measured, 1.32.0): data movement, comparisons, min/max/clip/round
# and the normalizations, which widen inside; every other op reading float16 runs its float32 kernel between Casts
WIDENING_NORMS = frozenset({("", "LayerNormalization"), ("", "SimplifiedLayerNormalization"),
                            (_MS, "SkipLayerNormalization"), (_MS, "SkipSimplifiedLayerNormalization"),
                            ("", "RMSNormalization")})
FP16_KERNELS = WIDENING_NORMS | frozenset(("", op) for op in (
    "Clip", "Max", "Min", "Transpose", "Cast", "Concat", "Reshape", "Gather", "Slice", "Expand", "Round", "IsNaN"))

# ops onnxruntime inlines from their ONNX function body instead of wrapping in Casts, per opset: Relu-14 read at
# opsets 18 to 20 becomes Max(x, 0), a float16 kernel (measured on 1.32.0; at 13, 14 and 21 it is cast-wrapped)
INLINED_FP16 = {("", "Relu"): (18, 21)}

CAST_FALLBACK = Fact(
    "cast-fallback", "an op with no float16 kernel runs its float32 kernel between Casts onnxruntime inserts",
    "onnxruntime core/optimizer/insert_cast_transformer.cc (InsertCastTransformer); measured: 71 one-node float16 "
    "models on onnxruntime 1.32.0")
CHAINS_STAY_FP32 = Fact(
    "chains-stay-fp32", "between two ops it runs in float32, the float16 round trip is removed: the value is never "
    "rounded to float16", "onnxruntime core/optimizer/insert_cast_transformer.cc (RemoveDuplicateCastTransformer); "
    "measured: a decomposed float16 LayerNorm with |x - mean| 800 gives the float32 graph's outputs bit for bit")
ISOLATED = Fact(
    "isolated-fp16-node", "a float16-capable op whose neighbours all run in float32 runs in float32 too",
    "onnxruntime core/optimizer/insert_cast_transformer.cc (IsIsolatedFp16Node, force_cpu_fp32_)")
INLINED = Fact(
    "relu-inlined-as-max", "Relu read at opsets 18 to 20 is inlined from its function body as Max(x, 0), a float16 "
    "kernel: beside another float16 kernel it computes in float16", "measured on onnxruntime 1.32.0 (ORT_DISABLE_ALL "
    "and ORT_ENABLE_ALL); onnx Relu-14's function body")
NORMS_WIDEN = Fact(
    "norms-widen", "LayerNormalization, SimplifiedLayerNormalization, SkipLayerNormalization, "
    "SkipSimplifiedLayerNormalization and RMSNormalization compute their statistics in float32 whatever stash_type "
    "says (eps a float attribute)", "onnxruntime core/providers/cpu/nn/layer_norm_impl.cc (MLFloat16 ComputeJob, "
    "the constructor reads axis and epsilon only), contrib_ops/cpu/skip_layer_norm.cc; measured: stash_type 1 and 10 "
    "give the same bits")
NO_FLUSH = Fact(
    "subnormals-kept", "float32 and float16 subnormals are kept (no flush to zero unless "
    "session.set_denormal_as_zero, which then flushes on the intra-op pool threads only)",
    "measured on onnxruntime 1.32.0: Add(x, 0) keeps 1e-40")
NO_BF16 = Fact(
    "no-bf16-fallback", "bfloat16 gets no such fallback: a bfloat16 graph with Add, MatMul or Softmax does not load",
    "onnxruntime core/optimizer/insert_cast_transformer.cc (IsMLFloat16Tensor only); measured on 1.32.0")


class OrtCpu(Runtime):
    name = "ort-cpu"
    title = "onnxruntime CPU"
    versions = ("1.32",)
    facts = (CAST_FALLBACK, CHAINS_STAY_FP32, ISOLATED, INLINED, NORMS_WIDEN, NO_FLUSH, NO_BF16)

    def kernel(self, node: Node, held: Format, graph: Graph) -> Kernel | None:
        op = (node.domain or "", node.op_type)
        if op in WIDENING_NORMS:
            return Kernel(NORMS_WIDEN, statistics="fp32")
        if held.name != "fp16" or node.bodies:
            return None
        if not _fp16_kernel(node):
            return Kernel(CAST_FALLBACK, compute="fp32")
        if _isolated(node, graph):
            return Kernel(ISOLATED, compute="fp32")
        return None

    def widened(self, value: Value, graph: Graph) -> Fact | None:
        # (a graph output read by such ops too is rounded only where it leaves the graph: its readers get float32)
        producer = value.producer
        if producer is None or not value.consumers:
            return None
        if not _wrapped(producer, graph) or not all(_wrapped(c, graph) for c in value.consumers):
            return None
        return CHAINS_STAY_FP32


def _needs_casts(node: Node) -> bool:
    """Runs a float32 kernel between Casts when it reads float16 (no float16 kernel, no body)."""
    return not _fp16_kernel(node) and not node.bodies


def _fp16_kernel(node: Node) -> bool:
    op = (node.domain or "", node.op_type)
    if op in FP16_KERNELS:
        return True
    span = INLINED_FP16.get(op)
    return span is not None and node.opset is not None and span[0] <= node.opset < span[1]


def _wrapped(node: Node, graph: Graph) -> bool:
    return _needs_casts(node) or ((node.domain or "", node.op_type) not in WIDENING_NORMS and _isolated(node, graph))


def _isolated(node: Node, graph: Graph) -> bool:
    """IsIsolatedFp16Node: every float input made by a node that needs casts (none a graph input or a constant),
    every output read only by such nodes and none a graph output; a one-node graph or a node with bodies is not."""
    if node.bodies or len(graph.nodes) < 2 or (node.domain or "", node.op_type) in WIDENING_NORMS:
        return False
    reads = [v for v in node.inputs if v is not None and v.dtype in ("fp16", "fp32") and not v.is_const]
    if not reads or any(v.producer is None or not _needs_casts(v.producer) for v in reads):
        return False
    outputs = [v for v in node.outputs if v is not None]
    return bool(outputs) and all(v not in graph.outputs and v.consumers and all(_needs_casts(c) for c in v.consumers)
                                 for v in outputs)
