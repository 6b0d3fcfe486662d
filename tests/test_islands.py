"""Float32 islands: which Casts start one, where one ends, and what a finding says about it.

An island starts only at a Cast that really widens an activation (float16 → float32); a Cast of a value already
float32 (`.float()` in an fp32 export) is a no-op, and a float32 graph audited for fp16 runs its norms in fp16
whatever no-op Casts precede them. An island ends at a node that also reads an activation held in the target
dtype (a residual Add). Each model here comes with a near twin that differs in that one respect.
"""

from __future__ import annotations

import pytest
from onnx import TensorProto as T
from onnx import helper as h

from fixtures.onnx_builders import const, model, save, tensor
from precaudit.analysis.compute_dtype import DtypeResolver
from precaudit.dtypes import FORMATS
from precaudit.frontends.onnx import load_onnx
from tests.helpers import run_json

FP16_RUN = "--dtype fp16: float32 tensors run as float16"


def _layernorm(src: str, out: str = "y") -> list:
    """A LayerNorm as the TorchScript exporter writes it below opset 17: eps 'eps' added inside the Sqrt."""
    return [h.make_node("ReduceMean", [src], ["mean"], name="mean", axes=[-1]),
            h.make_node("Sub", [src, "mean"], ["d"], name="sub"),
            h.make_node("Pow", ["d", "two"], ["sq"], name="pow"),
            h.make_node("ReduceMean", ["sq"], ["var"], name="var", axes=[-1]),
            h.make_node("Add", ["var", "eps"], ["ve"], name="add_eps"),
            h.make_node("Sqrt", ["ve"], ["s"], name="sqrt"),
            h.make_node("Div", ["d", "s"], [out], name="div")]


def _cast(src: str, out: str, to: int, name: str):
    return h.make_node("Cast", [src], [out], name=name, to=to)


def _save(tmp_path, nodes, io_dtype: str, chain_dtype: str, eps: float, extra_inputs=(), extra_inits=()):
    inits = [const("two", 2.0, chain_dtype), const("eps", eps, chain_dtype), *extra_inits]
    m = model(nodes, [tensor("x", io_dtype), *extra_inputs], [tensor("y", io_dtype)], inits)
    return save(m, tmp_path / "model.onnx")


def _audit(tmp_path, path, *args):
    _, report = run_json([path], "--dtype", "fp16", *args, out_dir=tmp_path)
    assert report["errors"] == []
    return {(r["rule_id"], r["node_name"]): r["values"] for r in report["results"]}


# ---- a Cast to float32 of a value that is already float32 starts no island ------------------------------


@pytest.mark.parametrize("eps,rule", [(1e-5, "PA102"), (1e-12, "PA101")])
def test_a_noop_cast_in_an_fp32_graph_leaves_the_layernorm_in_fp16(tmp_path, eps, rule):
    """GPT-2's `.to()` of its position embeddings, a `.float()` before a norm: Cast(to=FLOAT) of float32."""
    nodes = [h.make_node("Relu", ["x"], ["r"], name="relu"), _cast("r", "rc", T.FLOAT, "noop_cast"), *_layernorm("rc")]
    found = _audit(tmp_path, _save(tmp_path, nodes, "fp32", "fp32", eps))
    assert set(found) == {(rule, "add_eps"), ("PA208", "add_eps")}
    assert found[(rule, "add_eps")]["compute_dtype"] == "float16"
    assert found[(rule, "add_eps")]["compute_reason"] == (
        f"{FP16_RUN} (the Cast to float32 at 'noop_cast' is a no-op: its input is already float32)")
    assert found[("PA208", "add_eps")]["stat_dtype"] == "float16"  # the squares, too, are computed in fp16


def test_without_the_noop_cast_the_same_layernorm_fires_with_the_plain_reason(tmp_path):
    nodes = [h.make_node("Relu", ["x"], ["rc"], name="relu"), *_layernorm("rc")]
    found = _audit(tmp_path, _save(tmp_path, nodes, "fp32", "fp32", 1e-5))
    assert set(found) == {("PA102", "add_eps"), ("PA208", "add_eps")}
    assert found[("PA102", "add_eps")]["compute_reason"] == FP16_RUN


def test_a_narrowing_cast_to_float32_starts_no_island_either(tmp_path):
    """float64 → float32 (TorchScript's double LayerNorm cast back) narrows: a converter runs what follows in fp16."""
    nodes = [_cast("x", "x64", T.DOUBLE, "to_double"), h.make_node("Relu", ["x64"], ["r64"], name="relu"),
             _cast("r64", "rc", T.FLOAT, "from_double"), *_layernorm("rc")]
    found = _audit(tmp_path, _save(tmp_path, nodes, "fp32", "fp32", 1e-5))
    assert set(found) == {("PA102", "add_eps"), ("PA208", "add_eps")}
    assert found[("PA102", "add_eps")]["compute_reason"] == FP16_RUN


# ---- a Cast that really widens starts one -------------------------------------------------------------------


def test_a_real_upcast_in_an_fp16_graph_keeps_the_layernorm_in_float32(tmp_path):
    """HF Llama/T5 in an fp16 export: Cast fp16 → fp32, the statistics and the eps in fp32, Cast back."""
    nodes = [_cast("x", "x32", T.FLOAT, "up"), *_layernorm("x32", "y32"), _cast("y32", "y", T.FLOAT16, "down")]
    assert _audit(tmp_path, _save(tmp_path, nodes, "fp16", "fp32", 1e-5)) == {}


def test_the_fp16_twin_without_the_upcast_fires(tmp_path):
    found = _audit(tmp_path, _save(tmp_path, _layernorm("x"), "fp16", "fp16", 1e-5))
    assert set(found) == {("PA102", "add_eps"), ("PA208", "add_eps")}
    assert found[("PA102", "add_eps")]["compute_reason"] == "model stored in float16"


def test_a_noop_cast_inside_an_island_keeps_it(tmp_path):
    """fp16 → fp32, then `.float()` again: the second Cast changes nothing, the island goes on."""
    nodes = [_cast("x", "x32", T.FLOAT, "up"), _cast("x32", "again", T.FLOAT, "noop_cast"),
             *_layernorm("again", "y32"), _cast("y32", "y", T.FLOAT16, "down")]
    assert _audit(tmp_path, _save(tmp_path, nodes, "fp16", "fp32", 1e-5)) == {}


def test_a_real_upcast_in_an_fp32_graph_is_an_island_too(tmp_path):
    """An autocast-style export: float32 graph, a Cast down to fp16 and back up before the norm."""
    nodes = [_cast("x", "x16", T.FLOAT16, "down16"), h.make_node("Relu", ["x16"], ["r16"], name="relu"),
             _cast("r16", "r32", T.FLOAT, "up"), *_layernorm("r32")]
    path = _save(tmp_path, nodes, "fp32", "fp32", 1e-5)
    assert _audit(tmp_path, path) == {}
    resolver = DtypeResolver(load_onnx(str(path)), FORMATS["fp16"])
    add_eps = next(n for n in resolver.graph.nodes if n.name == "add_eps")
    assert resolver.of_node(add_eps).reason == "after Cast to float32 at node 'up'"


# ---- where an island ends -----------------------------------------------------------------------------------


def _residual(tmp_path, other: str, extra_nodes=(), extra_inputs=()):
    """x (fp32) → fp16 → relu → Cast up ('up', an island) → Mul(w) → Add(branch, other) → LayerNorm."""
    nodes = [_cast("x", "x16", T.FLOAT16, "down16"), h.make_node("Relu", ["x16"], ["r16"], name="relu"),
             _cast("r16", "r32", T.FLOAT, "up"), h.make_node("Mul", ["r32", "w"], ["branch"], name="branch"),
             *extra_nodes, h.make_node("Add", ["branch", other], ["res"], name="residual"), *_layernorm("res")]
    return _save(tmp_path, nodes, "fp32", "fp32", 1e-5, extra_inputs, [const("w", 0.5)])


def test_a_residual_add_that_also_reads_a_target_dtype_activation_ends_the_island(tmp_path):
    """The residual stream x is float32 outside the island, so it runs in fp16: so does the Add and all after."""
    path = _residual(tmp_path, "x")
    found = _audit(tmp_path, path)
    assert set(found) == {("PA102", "add_eps"), ("PA208", "add_eps")}
    assert found[("PA102", "add_eps")]["compute_dtype"] == "float16"
    assert found[("PA102", "add_eps")]["compute_reason"] == (
        f"{FP16_RUN} (the float32 island after Cast 'up' ends at 'residual', which also reads 'x')")
    resolver = DtypeResolver(load_onnx(str(path)), FORMATS["fp16"])
    nodes = {n.name: n for n in resolver.graph.nodes}
    stop = resolver.of_node(nodes["residual"])
    assert stop.fmt.name == "fp16"
    assert stop.reason == ("the float32 island after Cast 'up' ends here: 'residual' also reads 'x', held in float16 "
                           f"({FP16_RUN})")
    assert resolver.of_node(nodes["branch"]).reason == "after Cast to float32 at node 'up'"  # inside, before the end


def test_an_add_of_the_island_with_itself_keeps_it(tmp_path):
    assert _audit(tmp_path, _residual(tmp_path, "r32")) == {}


def test_a_mask_bias_made_of_constants_ends_no_island(tmp_path):
    """Where(mask, 0, -3.4e38): an attention-mask bias, float only through the file's constants, is no activation."""
    mask = [h.make_node("Where", ["keep", "zero", "fill"], ["bias"], name="mask_bias")]
    inits = [const("zero", 0.0), const("fill", -3.4e38)]
    nodes = [_cast("x", "x16", T.FLOAT16, "down16"), _cast("x16", "r32", T.FLOAT, "up"), *mask,
             h.make_node("Add", ["r32", "bias"], ["res"], name="masked"), *_layernorm("res")]
    path = save(model(nodes, [tensor("x", "fp32"), h.make_tensor_value_info("keep", T.BOOL, [2, 8])],
                      [tensor("y", "fp32")], [const("two", 2.0), const("eps", 1e-5), *inits]), tmp_path / "model.onnx")
    found = _audit(tmp_path, path)
    assert set(found) == {("PA209", "mask_bias")}  # the fill itself is -inf in fp16; the LayerNorm stays float32


def test_a_kept_node_casts_back_to_the_target_dtype_and_so_ends_the_island(tmp_path):
    """--keep-fp32 branch: a converter computes it in float32 and casts its output back to fp16, so the Add that
    reads it and the island r32 runs in fp16."""
    found = _audit(tmp_path, _residual(tmp_path, "r32"), "--keep-fp32", "branch")
    assert set(found) == {("PA102", "add_eps"), ("PA208", "add_eps")}
    assert found[("PA102", "add_eps")]["compute_reason"] == (
        f"{FP16_RUN} (the float32 island after Cast 'up' ends at 'residual', which also reads 'branch')")


# ---- control-flow bodies --------------------------------------------------------------------------------------


def _in_if(tmp_path, io_dtype: str, chain_dtype: str, head: list, src: str, tail: list, out: str):
    """The LayerNorm inside an If's then-branch, reading the outer value src by name."""
    then = h.make_graph(_layernorm(src, "t"), "then", [], [tensor("t", chain_dtype)],
                        [const("two", 2.0, chain_dtype), const("eps", 1e-5, chain_dtype)])
    other = h.make_graph([h.make_node("Identity", [src], ["e"], name="id")], "else", [], [tensor("e", chain_dtype)])
    nodes = [*head, h.make_node("If", ["c"], [out], name="branch", then_branch=then, else_branch=other), *tail]
    m = model(nodes, [tensor("x", io_dtype), h.make_tensor_value_info("c", T.BOOL, [])], [tensor("y", io_dtype)])
    return save(m, tmp_path / "model.onnx")


def test_a_noop_cast_before_an_if_leaves_its_branch_in_fp16(tmp_path):
    path = _in_if(tmp_path, "fp32", "fp32", [_cast("x", "xc", T.FLOAT, "noop_cast")], "xc", [], "y")
    found = _audit(tmp_path, path)
    assert set(found) == {("PA102", "branch/then_branch/add_eps"), ("PA208", "branch/then_branch/add_eps")}
    assert found[("PA102", "branch/then_branch/add_eps")]["compute_reason"] == (
        f"{FP16_RUN} (the Cast to float32 at 'noop_cast' is a no-op: its input is already float32)")


def test_a_real_upcast_before_an_if_keeps_its_branch_in_float32(tmp_path):
    path = _in_if(tmp_path, "fp16", "fp32", [_cast("x", "x32", T.FLOAT, "up")], "x32",
                  [_cast("y32", "y", T.FLOAT16, "down")], "y32")
    assert _audit(tmp_path, path) == {}


# ---- a captured PyTorch module mixes dtypes itself -------------------------------------------------------------

_PROMOTING = '''
import torch


class Promote(torch.nn.Module):
    """float16 activations times x.float(): PyTorch computes the product in float32 (type promotion)."""

    def __init__(self, back: bool):
        super().__init__()
        self.back = back

    def forward(self, x):
        y = torch.relu(x) * x.float()
        if self.back:
            y = y.half()
        mean = y.mean(-1, keepdim=True)
        var = ((y - mean) ** 2).mean(-1, keepdim=True)
        return (y - mean) / torch.sqrt(var + 1e-5)


def promoted():
    return Promote(False), (torch.randn(2, 8),)


def cast_back():
    return Promote(True), (torch.randn(2, 8),)
'''


@pytest.mark.slow  # a PyTorch capture or training step: seconds
@pytest.mark.parametrize("factory,expect", [("promoted", set()), ("cast_back", {"PA102", "PA208"})])
@pytest.mark.requires("torch")
def test_a_float16_operand_of_a_promoting_op_ends_no_island(tmp_path, factory, expect):
    """model.to(float16): relu(x) * x.float() reads a float16 value and the island, and PyTorch computes it in
    float32, so the LayerNorm after it does too; its twin casts the product back to float16 first."""
    (tmp_path / "promote.py").write_text(_PROMOTING)
    _, report = run_json([f"{tmp_path / 'promote.py'}:{factory}"], "--dtype", "fp16", out_dir=tmp_path)
    assert report["errors"] == []
    assert {r["rule_id"] for r in report["results"]} == expect


@pytest.mark.parametrize("entries,keeper", [
    (["LayerNormalization", "no*"], "LayerNormalization"), (["no*", "LayerNormalization"], "no*"),
    (["other", "norm", "n*"], "norm"), (["n*", "norm"], "n*"), (["x*", "y"], None)])
def test_keep_fp32_names_are_looked_up_and_the_first_entry_wins(tmp_path, entries, keeper):
    """Op types and names are looked up, globs matched in order: the entry written first that matches keeps it."""
    from fixtures.onnx_builders import fused_norm

    graph = load_onnx(str(save(fused_norm("LayerNormalization", epsilon=1e-12), tmp_path / "m.onnx")))
    node = next(n for n in graph.nodes if n.op_type == "LayerNormalization")
    dtype = DtypeResolver(graph, FORMATS["fp16"], entries).of_node(node)
    assert dtype is not None
    if keeper is None:
        assert dtype.fmt.name == "fp16"
    else:
        assert dtype.fmt.name == "fp32" and dtype.reason == f"kept in float32 by --keep-fp32 {keeper}"


def test_too_many_keep_fp32_globs_is_one_line(tmp_path, capsys):
    from fixtures.onnx_builders import fused_norm
    from precaudit.cli import main

    model = save(fused_norm("LayerNormalization", epsilon=1e-12), tmp_path / "m.onnx")
    assert main([str(model), "--keep-fp32", ",".join(f"n{i}*" for i in range(1001))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--keep-fp32: 1,001 patterns with * ? or [; at most 1,000" in err
    names = ",".join(f"n{i}" for i in range(100_000))  # names are looked up: any number
    assert main([str(model), "--keep-fp32", names]) == 0
