"""Norms as TensorFlow/Keras (tf2onnx), JAX/flax (jax2onnx; jax2tf + tf2onnx) and Paddle (paddle2onnx) write them.

Each block is built node for node with onnx.helper the way the converter writes it (fixtures/onnx_builders.py),
and where a real conversion was made (fixtures/real_exports, by convert.py there) the converter's own file is
audited too: both must give exactly the expected findings, with the same facts as the torch.onnx forms.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper as h

from fixtures import onnx_builders as b
from precaudit.analysis import canonical
from precaudit.analysis.compute_dtype import DtypeResolver
from precaudit.analysis.decomposed import find_decomposed_norms
from precaudit.dtypes import FORMATS
from precaudit.frontends.onnx import load_onnx
from precaudit.ir import Graph, Node, Value
from tests.helpers import run_json

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "real_exports"

KERAS_LN = "functional_1/layer_normalization_1/"
UNIT = "functional_5_1/unit_normalization_1/"
FLAX_TF = "jax2tf__lambda__/LN/LayerNorm_0/"
EPS_1E12 = 9.999999960041972e-13  # 1e-12 as float32 stores it


@dataclass
class Block:
    name: str
    build: Callable[[], onnx.ModelProto]
    expect: set[tuple[str, str]]
    real: str | None = None  # the converter's own file in fixtures/real_exports, audited the same way
    dtype: str = "fp16"
    args: tuple[str, ...] = ()
    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    check: bool = True


BLOCKS = [
    # --- TensorFlow / Keras through tf2onnx ----------------------------------------------------------------------
    # keras.layers.LayerNormalization (eps 1e-12, as TF BERT/ALBERT set it): GlobalAveragePool means,
    # SquaredDifference as Sub → Mul(d, d), Rsqrt as Sqrt → Reciprocal, the affine part folded into Mul/Neg/Add
    Block("keras_layernorm_rank3_eps1e-12", lambda: b.tf2onnx_keras_layernorm(1e-12),
          {("PA101", KERAS_LN + "add"), ("PA208", KERAS_LN + "add")}, real="tf2onnx_keras_layernorm_eps1e-12.onnx",
          values={"PA101": {"norm": "LayerNorm", "eps": EPS_1E12, "eps_rounded": 0.0, "eps_placement": "inside_sqrt",
                            "eps_source": f"initializer '{KERAS_LN}add/y:0'", "compute_dtype": "float16"},
                  "PA208": {"stat_dtype": "float16"}}),
    Block("keras_layernorm_rank3_eps1e-12_as_fp32", lambda: b.tf2onnx_keras_layernorm(1e-12), set(),
          real="tf2onnx_keras_layernorm_eps1e-12.onnx", dtype="fp32"),
    # rank 2 keeps ReduceMean; Keras's default eps 1e-3 is a normal fp16 number: only the fp16 squares are a hazard
    Block("keras_layernorm_rank2_eps1e-3", lambda: b.tf2onnx_keras_layernorm(1e-3, shape=(2, 8)),
          {("PA208", KERAS_LN + "add")}, values={"PA208": {"norm": "LayerNorm"}}),
    # keras.layers.UnitNormalization: x * min(rsqrt(sum(x²)), 1/eps), eps 1e-12: the cap 1e12 is inf in fp16, so
    # the guard is gone (PA101, at the Min), and the constant itself is out of range (PA209)
    Block("keras_unit_normalization_eps1e-12", lambda: b.tf2onnx_keras_unit_normalization(1e-12),
          {("PA101", UNIT + "Minimum"), ("PA208", UNIT + "Minimum"), ("PA209", UNIT + "Minimum")},
          real="tf2onnx_keras_unit_normalization.onnx",
          values={"PA101": {"norm": "L2Norm", "eps_placement": "guard", "eps_rounded": 0.0, "eps_class": "zero",
                            "eps": pytest.approx(1e-12, rel=1e-6),
                            "eps_source": ("contains", f"the cap of Min '{UNIT}Minimum' on 1/Sqrt")}}),
    Block("keras_unit_normalization_eps1e-4", lambda: b.tf2onnx_keras_unit_normalization(1e-4),
          {("PA208", UNIT + "Minimum")}, values={"PA208": {"eps_placement": "guard", "eps_class": "normal"}}),
    # keras.layers.BatchNormalization in inference: TF folds gamma * rsqrt(var + eps) into one constant per channel
    # at conversion, in float32. No eps, no division, no statistic is left in the graph: nothing for the norm rules
    # to judge (whether the folded scale itself fits the dtype is a constant's question, not an eps's).
    Block("keras_batchnorm_folded", lambda: b.tf2onnx_folded_batchnorm(1e-3, running_var=[1.0] * 8, shape=(2, 8)),
          set(), real="tf2onnx_keras_batchnorm.onnx"),
    Block("keras_batchnorm_folded_mixed_variances", lambda: b.tf2onnx_folded_batchnorm(1e-3), set()),
    Block("keras_batchnorm_folded_dead_channel_eps1e-12",
          lambda: b.tf2onnx_folded_batchnorm(1e-12, running_var=[0.0, 1.0, 2.0, 4.0]), set(), args=("--select", "PA1")),
    # tf.nn.fused_batch_norm (FusedBatchNormV3) stays a BatchNormalization between Transposes; its eps is judged
    # against the stored running variances, as for any BatchNormalization (fact stat_floor)
    Block("tf_fused_batchnorm_var0_eps1e-3", lambda: b.tf2onnx_fused_batchnorm(1e-3, 0.0), set(),
          real="tf2onnx_fused_batchnorm.onnx"),
    Block("tf_fused_batchnorm_var0_eps1e-5", lambda: b.tf2onnx_fused_batchnorm(1e-5, 0.0), {("PA102", "FusedBatchNormV3")},
          values={"PA102": {"norm": "BatchNorm", "stat_floor": 0.0, "eps_source": "attribute epsilon"}}),
    Block("tf_fused_batchnorm_var1_eps1e-5", lambda: b.tf2onnx_fused_batchnorm(1e-5, 1.0), set()),
    # is_training=True without running statistics: tf2onnx computes the batch variance in the graph
    # (ReduceSumSquare / element count), so no stored variance vouches for the eps
    Block("tf_fused_batchnorm_training_eps1e-5", lambda: b.tf2onnx_fused_batchnorm(1e-5, training=True),
          {("PA102", "FusedBatchNormV3")}, values={"PA102": {"stat_floor": None}}),
    # --- JAX / flax ----------------------------------------------------------------------------------------------
    # flax.nnx.LayerNorm through jax2onnx 0.17: E[x²] − E[x]² clamped by Max(var, 0), then + eps → Sqrt → Div
    Block("jax2onnx_nnx_layernorm_eps1e-12", lambda: b.jax2onnx_layernorm(1e-12),
          {("PA205", "node_Sub_5"), ("PA101", "node_Add_7"), ("PA208", "node_Add_7")},
          real="jax2onnx_nnx_layernorm_eps1e-12.onnx",
          values={"PA101": {"norm": "LayerNorm", "eps_placement": "inside_sqrt", "eps_source": "initializer 'const_3'"}}),
    Block("jax2onnx_nnx_layernorm_flax_default_eps1e-6", lambda: b.jax2onnx_layernorm(1e-6),
          {("PA205", "node_Sub_5"), ("PA102", "node_Add_7"), ("PA208", "node_Add_7")},
          values={"PA102": {"eps_rounded": 1.0132789611816406e-06, "norm": "LayerNorm"}}),
    # a float16 flax model: jax2onnx computes the statistics in float32, the eps is safe there
    Block("jax2onnx_nnx_layernorm_fp16_model", lambda: b.jax2onnx_layernorm(1e-6, dtype="fp16"),
          {("PA205", "node_Sub_6")}, values={"PA205": {"compute_dtype": "float32"}}),
    # use_fast_variance=False: a centred variance, constant rows zeroed by a Where, reduced in double
    Block("jax2onnx_nnx_layernorm_slow_variance", lambda: b.jax2onnx_layernorm(1e-6, fast_variance=False),
          {("PA102", "node_Add_13"), ("PA208", "node_Add_13")}, values={"PA102": {"norm": "LayerNorm"}}),
    # flax's statistics as jax's primitives: ReduceSum / n, ReduceSumSquare / n, Max(0, ·), Reshape → Expand,
    # Div(1, Sqrt) for lax.rsqrt
    Block("jax2onnx_flax_fast_variance_eps1e-12", lambda: b.jax_fast_variance_norm(1e-12),
          {("PA205", "node_Sub_6"), ("PA101", "node_Add_17")}, real="jax2onnx_fast_variance_eps1e-12.onnx",
          values={"PA101": {"norm": "LayerNorm", "eps_placement": "inside_sqrt", "stat_dtype": None}}),
    # flax.linen.LayerNorm through jax2tf + tf2onnx: ReduceSum · (1/n), Sqrt → Reciprocal, PreventGradient
    Block("jax2tf_flax_layernorm_eps1e-6", lambda: b.jax2tf_flax_layernorm(1e-6),
          {("PA205", FLAX_TF + "pjit_subtract_/Sub"), ("PA102", FLAX_TF + "pjit_add_/AddV2"),
           ("PA208", FLAX_TF + "pjit_add_/AddV2")}, real="jax2tf_flax_layernorm_eps1e-6.onnx", check=False,
          values={"PA102": {"norm": "LayerNorm", "eps_placement": "inside_sqrt", "eps_class": "subnormal"}}),
    Block("jax2tf_flax_layernorm_rank3", lambda: b.jax2tf_flax_layernorm(1e-6, shape=(2, 4, 8)),
          {("PA205", FLAX_TF + "pjit_subtract_/Sub"), ("PA102", FLAX_TF + "pjit_add_/AddV2"),
           ("PA208", FLAX_TF + "pjit_add_/AddV2")}, check=False),
    # --- Paddle through paddle2onnx ------------------------------------------------------------------------------
    # below opset 17 the TorchScript-like chain, in float32 (AutoCast: an Identity for a float32 input)
    Block("paddle_layernorm_op13_eps1e-12", lambda: b.paddle_layernorm(1e-12),
          {("PA101", "Add.0"), ("PA208", "Add.0")}, real="paddle2onnx_layernorm_op13_eps1e-12.onnx",
          values={"PA101": {"norm": "LayerNorm", "eps_source": "initializer 'helper.constant.0'"}}),
    # a float16 Paddle model: AutoCast casts the input to float32 first, so the chain and its eps are float32
    Block("paddle_layernorm_op13_fp16_model", lambda: b.paddle_layernorm(1e-12, dtype="fp16"), set()),
    # from opset 17 a LayerNormalization without stash_type: statistics in float32
    Block("paddle_layernorm_op17", lambda: b.paddle_layernorm(1e-12, opset=17), set()),
    # paddle.rsqrt(E[x²] − E[x]² + eps): an Identity after every op, + eps as paddle.scale (Mul by 1, Add)
    Block("paddle_rsqrt_moments_eps1e-12", lambda: b.paddle_rsqrt_moments(1e-12),
          {("PA205", "Sub.0"), ("PA101", "Add.0"), ("PA208", "Add.0")}, real="paddle2onnx_rsqrt_moments_eps1e-12.onnx",
          values={"PA101": {"norm": "LayerNorm", "eps_placement": "inside_sqrt"}}),
    # paddle.nn.functional.normalize: Pow(sum(|x|²), 0.5) clamped by Max(eps)
    Block("paddle_normalize_eps1e-12", lambda: b.paddle_normalize(1e-12),
          {("PA101", "Max.0"), ("PA208", "Max.0")}, real="paddle2onnx_normalize_eps1e-12.onnx",
          values={"PA101": {"norm": "L2Norm", "eps_placement": "guard"}}),
]


def _audit(path: Path, block: Block, tmp_path: Path) -> tuple[set, list]:
    code, report = run_json([path], "--dtype", block.dtype, *block.args, out_dir=tmp_path)
    assert report["errors"] == []
    has_error = any(r["severity"] == "error" for r in report["results"])
    assert code == (1 if has_error else 0)
    return {(r["rule_id"], r["node_name"]) for r in report["results"]}, report["results"]


@pytest.mark.parametrize("block", BLOCKS, ids=[blk.name for blk in BLOCKS])
def test_block(block, tmp_path):
    built = b.save(block.build(), tmp_path / "built.onnx", check=block.check)
    got, results = _audit(built, block, tmp_path)
    assert got == block.expect
    for rule_id, expected in block.values.items():
        values = next(r["values"] for r in results if r["rule_id"] == rule_id)
        for key, want in expected.items():
            if isinstance(want, tuple) and want[0] == "contains":
                assert want[1] in values[key], (key, values[key])
            else:
                assert values[key] == want, (key, values[key])
    if block.real is not None:
        real, _ = _audit(REAL / block.real, block, tmp_path)
        assert real == block.expect, "the real conversion and its onnx.helper equivalent disagree"


def test_every_real_conversion_is_audited():
    used = {blk.real for blk in BLOCKS if blk.real}
    assert used == {p.name for p in REAL.glob("*.onnx")}


# --- the canonical reading ------------------------------------------------------------------------------------


def _graph(m: onnx.ModelProto, tmp_path: Path):
    return load_onnx(str(b.save(m, tmp_path / "m.onnx", check=False)))


def _mean_model(c: float, op: str = "Mul", dtype: str = "fp32", width: int | str = 8) -> onnx.ModelProto:
    nodes = [h.make_node("ReduceSum", ["x", "axes"], ["s"], name="sum"), h.make_node(op, ["s", "c"], ["m"], name="scale")]
    return b.model(nodes, [h.make_tensor_value_info("x", b.ELEM[dtype], [2, width])],
                   [h.make_tensor_value_info("m", b.ELEM[dtype], None)], [b.ints("axes", [-1]), b.const("c", c, dtype)])


@pytest.mark.parametrize("c,op,dtype,width,is_mean", [
    (0.125, "Mul", "fp32", 8, True),
    (8.0, "Div", "fp32", 8, True),
    (0.5, "Mul", "fp32", 8, False),     # a sum times 1/2 of 8 elements
    (4.0, "Div", "fp32", 8, False),
    (1 / 768, "Mul", "fp16", 768, True),  # 1/768 as float16 stores it (0.0013017654...)
    (1 / 768, "Mul", "fp32", 769, False),
    (0.125, "Mul", "fp32", "n", True),    # a symbolic width: 1/8 is exactly 1/n for an integer n
    (0.3, "Mul", "fp32", "n", False),     # ... 0.3 is 1/n for no integer n
    (1.0, "Mul", "fp32", "n", False),     # ... and a sum times 1 is that sum (paddle's scale), no mean
])
def test_what_counts_as_a_mean(c, op, dtype, width, is_mean, tmp_path):
    graph = _graph(_mean_model(c, op, dtype, width), tmp_path)
    value = next(n for n in graph.nodes if n.name == "scale").outputs[0]
    stat = canonical.reduction(value)
    if is_mean:
        assert stat is not None and stat.kind == "mean" and stat.node.name == "sum" and stat.scale.name == "scale"
        assert stat.count == (width if isinstance(width, int) else None)
    else:
        assert stat is None or stat.kind == "sum"


def test_global_average_pool_and_sum_of_squares_over_n_are_means(tmp_path):
    nodes = [h.make_node("GlobalAveragePool", ["x"], ["g"], name="gap"),
             h.make_node("ReduceSumSquare", ["x"], ["ss"], name="ss", axes=[2], keepdims=1),
             h.make_node("Div", ["ss", "n"], ["ms"], name="ms")]
    m = b.model(nodes, [b.tensor("x", "fp32", (2, 4, 8))], [b.tensor("g", "fp32", (2, 4, 1)), b.tensor("ms", "fp32", (2, 4, 1))],
                [b.const("n", 8.0)])
    graph = _graph(m, tmp_path)
    out = {n.name: n.outputs[0] for n in graph.nodes}
    gap, ms = canonical.reduction(out["gap"]), canonical.reduction(out["ms"])
    assert gap.kind == "mean" and gap.count == 8 and not gap.squares
    assert ms.kind == "mean" and ms.count == 8 and ms.squares and ms.node.name == "ss"
    # the pattern matcher's reading of ReduceSumSquare / n: a ReduceMean of a Mul(x, x)
    view = next(v for v in canonical.views(out["ms"]) if v.op_type == "ReduceMean")
    square = view.inputs[0].producer
    assert square.op_type == "Mul" and square.inputs[0] is square.inputs[1] is graph.inputs[0]


def test_the_reading_changes_nothing_in_the_graph(tmp_path):
    """Views and chain scans are pure: every value keeps its consumers, every node its inputs, no node is added."""
    graph = load_onnx(str(b.save(b.jax_fast_variance_norm(1e-12), tmp_path / "m.onnx")))
    before = ([(id(n), [id(v) for v in n.inputs if v is not None]) for n in graph.nodes],
              {id(v): [id(c) for c in v.consumers] for n in graph.nodes for v in n.inputs if v is not None})
    for node in graph.nodes:
        for value in node.inputs:
            canonical.views(value)
    find_decomposed_norms(graph, DtypeResolver(graph, FORMATS["fp16"]))
    after = ([(id(n), [id(v) for v in n.inputs if v is not None]) for n in graph.nodes],
             {id(v): [id(c) for c in v.consumers] for n in graph.nodes for v in n.inputs if v is not None})
    assert before == after


def _many_blocks(count: int, hops: int) -> onnx.ModelProto:
    """count LayerNorms in a row, each with ReduceSum · (1/n) means, Max(0, ·)-free moments and `hops` Identities
    between its Sqrt and Reciprocal: ~(11 + hops) nodes per block."""
    nodes, inits, x = [], [b.ints("axes", [-1]), b.const("c", 0.125), b.const("eps", 1e-12)], "x"
    for i in range(count):
        p = f"b{i}_"
        nodes += [h.make_node("ReduceSum", [x, "axes"], [p + "s"], name=p + "s"),
                  h.make_node("Mul", [p + "s", "c"], [p + "mean"], name=p + "mean"),
                  h.make_node("Sub", [x, p + "mean"], [p + "d"], name=p + "d"),
                  h.make_node("Mul", [p + "d", p + "d"], [p + "d2"], name=p + "d2"),
                  h.make_node("ReduceSum", [p + "d2", "axes"], [p + "ss"], name=p + "ss"),
                  h.make_node("Mul", [p + "ss", "c"], [p + "var"], name=p + "var"),
                  h.make_node("Add", [p + "var", "eps"], [p + "ve"], name=p + "add_eps"),
                  h.make_node("Sqrt", [p + "ve"], [p + "std0"], name=p + "sqrt")]
        for k in range(hops):
            nodes.append(h.make_node("Identity", [p + f"std{k}"], [p + f"std{k + 1}"], name=p + f"id{k}"))
        nodes += [h.make_node("Reciprocal", [p + f"std{hops}"], [p + "inv"], name=p + "inv"),
                  h.make_node("Mul", [p + "d", p + "inv"], [p + "y"], name=p + "y")]
        x = p + "y"
    return b.model(nodes, [b.tensor("x", "fp32")], [b.tensor(x, "fp32")], inits)


def test_twenty_thousand_nodes_in_linear_time(tmp_path):
    """2,000 blocks (22,000 nodes) of other-exporter LayerNorms, and one block with 20,000 Identities between
    its Sqrt and its Reciprocal: every chain found, no recursion, time about proportional to the size."""
    many = b.save(_many_blocks(2000, 1), tmp_path / "many.onnx", check=False)
    start = time.perf_counter()
    _, report = run_json([many], "--dtype", "fp16", "--select", "PA101", out_dir=tmp_path)
    many_seconds = time.perf_counter() - start
    assert report["errors"] == [] and len(report["results"]) == 2000
    half = b.save(_many_blocks(1000, 1), tmp_path / "half.onnx", check=False)
    start = time.perf_counter()
    _, report = run_json([half], "--dtype", "fp16", "--select", "PA101", out_dir=tmp_path)
    assert report["errors"] == [] and len(report["results"]) == 1000
    assert many_seconds < 4 * (time.perf_counter() - start) + 2  # linear, not quadratic (which would be 4x)
    deep = b.save(_many_blocks(1, 20000), tmp_path / "deep.onnx", check=False)
    _, report = run_json([deep], "--dtype", "fp16", "--select", "PA101", out_dir=tmp_path)
    assert report["errors"] == [] and [r["node_name"] for r in report["results"]] == ["b0_add_eps"]


def test_a_cycle_of_shape_ops_ends_every_walk():
    """The ONNX frontend refuses a cycle, but an IR built otherwise may hold one (a Reshape that feeds itself):
    the canonical reading and the chain scan still end."""
    def const(name, value):
        data = np.asarray(value, dtype=np.float32 if isinstance(value, float) else np.int64)
        return Value(name, dtype="fp32" if isinstance(value, float) else "int64", shape=data.shape,
                     const_loader=lambda: data, const_origin=f"initializer '{name}'", const_size=data.size)

    def node(name, op, inputs):
        out = Value(name + "_out", dtype="fp32", shape=(2, 8))
        n = Node(name, op, inputs=inputs, outputs=[out])
        out.producer = n
        for v in inputs:
            v.consumers.append(n)
        return n

    loop_value = Value("r", dtype="fp32", shape=(2, 8))
    loop = Node("loop", "Reshape", inputs=[loop_value, const("shape", [2, 8])], outputs=[loop_value])
    loop_value.producer, loop_value.consumers = loop, [loop]
    scale = node("scale", "Mul", [loop_value, const("c", 0.125)])
    add = node("add_eps", "Add", [scale.outputs[0], const("eps", 1e-12)])
    sqrt = node("sqrt", "Sqrt", [add.outputs[0]])
    inv = node("inv", "Reciprocal", [sqrt.outputs[0]])
    graph = Graph("cycle.onnx", nodes=[loop, scale, add, sqrt, inv], outputs=[inv.outputs[0]])
    for n in graph.nodes:
        for value in n.inputs:
            canonical.views(value)
            canonical.reduction(value)
    assert find_decomposed_norms(graph, DtypeResolver(graph, FORMATS["fp16"])).sites == []
