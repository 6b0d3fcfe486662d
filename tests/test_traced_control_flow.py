"""If and Loop in traced mode (onnxruntime engine): their bodies are emulated too, rounded node by node.

Values inside a body are not measured one by one; the control-flow node's outputs are.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

pytest.importorskip("onnxruntime")

from fixtures.onnx_builders import const, model, save, tensor
from precaudit.frontends.onnx import load_onnx
from precaudit.ir import implicit_inputs
from precaudit.trace import ort_engine
from tests.helpers import run_json


def _if_model(tmp_path):
    """If sum(x) > 0: (x * big * 1000) / 1000, which overflows inside the branch in float16 only; else -x.

    The branch reads `big` and `xin` (made by the first node) from the outer graph by name. Without rounding
    inside the body the overflow would vanish again by the division.
    """
    then = h.make_graph([h.make_node("Mul", ["xin", "big"], ["act"], name="act"),
                         h.make_node("Mul", ["act", "thousand"], ["up"], name="up"),
                         h.make_node("Div", ["up", "thousand"], ["t"], name="down")],
                        "then", [], [tensor("t", "fp32")])
    other = h.make_graph([h.make_node("Neg", ["x"], ["e"], name="neg")], "else", [], [tensor("e", "fp32")])
    # xin only rearranges x1's numbers, so its numbers are not fetched for a measurement: only the body reads it
    nodes = [h.make_node("Mul", ["x", "one"], ["x1"], name="copy"),
             h.make_node("Reshape", ["x1", "shape"], ["xin"], name="reshape"),
             h.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
             h.make_node("Greater", ["s", "zero"], ["c"], name="positive"),
             h.make_node("If", ["c"], ["y0"], name="branch", then_branch=then, else_branch=other),
             h.make_node("Add", ["y0", "one"], ["y"], name="out")]
    consts = [const("big", 300.0), const("thousand", 1000.0), const("zero", 0.0), const("one", 1.0),
              onnx.numpy_helper.from_array(np.array([2, 8], np.int64), "shape")]
    return save(model(nodes, [tensor("x", "fp32")], [tensor("y", "fp32")], consts), tmp_path / "if.onnx")


def _loop_model(tmp_path):
    """h = x * 100, then three times h = (h * 1000) / 1000 * 4: the carried value overflows inside the body."""
    body = h.make_graph([h.make_node("Mul", ["h_in", "thousand"], ["up"], name="up"),
                         h.make_node("Div", ["up", "thousand"], ["down"], name="down"),
                         h.make_node("Mul", ["down", "four"], ["h_out"], name="times4"),
                         h.make_node("Identity", ["cond_in"], ["cond_out"], name="keep")],
                        "body", [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond_in", T.BOOL, []),
                                 tensor("h_in", "fp32")],
                        [h.make_tensor_value_info("cond_out", T.BOOL, []), tensor("h_out", "fp32")])
    nodes = [h.make_node("Mul", ["x", "hundred"], ["h0"], name="start"),
             h.make_node("Loop", ["n", "true", "h0"], ["h"], name="loop", body=body),
             h.make_node("Add", ["h", "one"], ["y"], name="out")]
    consts = [const("hundred", 100.0), const("thousand", 1000.0), const("four", 4.0), const("one", 1.0),
              onnx.numpy_helper.from_array(np.array(3, np.int64), "n"), onnx.numpy_helper.from_array(np.array(True), "true")]
    return save(model(nodes, [tensor("x", "fp32")], [tensor("y", "fp32")], consts), tmp_path / "loop.onnx")


def _trace(tmp_path, path, x, *args):
    np.savez(tmp_path / "x.npz", x=np.asarray(x, np.float32))
    code, report = run_json([path], "--trace", "--inputs", str(tmp_path / "x.npz"), "--select", "PA9", *args,
                            out_dir=tmp_path)
    assert report["errors"] == []
    assert report["trace"][0]["nodes"]["numpy"] == 0
    return code, {(r["rule_id"], r["node_name"]): r["values"] for r in report["results"]}


def test_an_overflow_inside_an_if_branch_is_found(tmp_path):
    code, found = _trace(tmp_path, _if_model(tmp_path), np.ones((2, 8)))
    assert code == 1 and set(found) == {("PA906", "branch")}
    assert found[("PA906", "branch")]["nonfinite_fraction"] == 1.0
    assert found[("PA906", "branch")]["ref_nonfinite_fraction"] == 0.0  # float32 keeps 3e5, divides it back


def test_the_other_branch_is_clean(tmp_path):
    assert _trace(tmp_path, _if_model(tmp_path), -np.ones((2, 8))) == (0, {})


def test_the_same_branch_with_small_inputs_is_clean(tmp_path):
    assert _trace(tmp_path, _if_model(tmp_path), np.full((2, 8), 0.1)) == (0, {})


def test_an_overflow_inside_a_loop_body_is_found(tmp_path):
    # 100 * 1000 = 1e5 > 65504 already in the first iteration, inside the body
    code, found = _trace(tmp_path, _loop_model(tmp_path), np.ones((2, 8)))
    assert code == 1 and set(found) == {("PA906", "loop")}


def test_a_loop_that_stays_in_range_is_clean(tmp_path):
    # h = 0.1, 0.4, 1.6, 6.4: the largest value inside the body is 1.6 * 1000
    assert _trace(tmp_path, _loop_model(tmp_path), np.full((2, 8), 0.001)) == (0, {})


def test_a_body_reads_a_value_made_in_an_earlier_segment(tmp_path, monkeypatch):
    """One node per segment: `xin` comes out of the first session and goes into the If's, read only by its body."""
    monkeypatch.setattr(ort_engine, "_FIRST_SEGMENT", 1)
    monkeypatch.setattr(ort_engine, "_MIN_SEGMENT", 1)
    monkeypatch.setattr(ort_engine, "_BUDGET", 1)
    _code, found = _trace(tmp_path, _if_model(tmp_path), np.ones((2, 8)))
    assert set(found) == {("PA906", "branch")}


def test_a_running_sum_in_a_scan_overflows(tmp_path):
    """Scan over 8 rows of 10000: the running sum passes 65504 at the seventh row, in the body's Add."""
    body = h.make_graph([h.make_node("Add", ["acc_in", "row"], ["acc_out"], name="accumulate"),
                         h.make_node("Identity", ["acc_out"], ["seen"], name="emit")],
                        "body", [tensor("acc_in", "fp32", (4,)), tensor("row", "fp32", (4,))],
                        [tensor("acc_out", "fp32", (4,)), tensor("seen", "fp32", (4,))])
    nodes = [h.make_node("Scan", ["zeros", "x"], ["total", "partial"], name="scan", body=body, num_scan_inputs=1),
             h.make_node("Add", ["total", "zeros"], ["y"], name="out")]
    path = save(model(nodes, [tensor("x", "fp32", (8, 4))], [tensor("y", "fp32", (4,)), tensor("partial", "fp32", (8, 4))],
                      [const("zeros", np.zeros(4))], opset=17), tmp_path / "scan.onnx")
    _code, found = _trace(tmp_path, path, np.full((8, 4), 10000.0))
    assert set(found) == {("PA901", "scan"), ("PA906", "scan")}
    assert found[("PA901", "scan")]["absmax"] == 80000.0
    assert _trace(tmp_path, path, np.full((8, 4), 1000.0)) == (0, {})


def _cond(value: bool) -> dict:
    return {"c": np.array(value)}


def _run_feeds(tmp_path, path, engine="onnxruntime", **feeds):
    np.savez(tmp_path / "in.npz", **feeds)
    return run_json([path], "--trace", "--trace-engine", engine, "--inputs", str(tmp_path / "in.npz"),
                    "--select", "PA9", out_dir=tmp_path)


def test_an_if_inside_a_float32_island_stays_float32(tmp_path):
    """fp16 model: Cast up, If(x32 * x32), divide back, Cast down. 300² = 9e4 never leaves float32."""
    then = h.make_graph([h.make_node("Mul", ["x32", "x32"], ["t"], name="sq")], "then", [], [tensor("t", "fp32")])
    other = h.make_graph([h.make_node("Identity", ["x32"], ["e"], name="id")], "else", [], [tensor("e", "fp32")])
    nodes = [h.make_node("Cast", ["x"], ["x32"], name="up", to=T.FLOAT),
             h.make_node("If", ["c"], ["y32"], name="branch", then_branch=then, else_branch=other),
             h.make_node("Div", ["y32", "x32"], ["d"], name="div"),
             h.make_node("Cast", ["d"], ["y"], name="down", to=T.FLOAT16)]
    path = save(model(nodes, [tensor("x", "fp16"), h.make_tensor_value_info("c", T.BOOL, [])], [tensor("y", "fp16")]),
                tmp_path / "island.onnx")
    code, report = _run_feeds(tmp_path, path, x=np.full((2, 8), 300, np.float16), **_cond(True))
    assert (code, report["errors"], report["results"]) == (0, [], [])


def test_a_branch_reads_the_outer_value_a_sibling_branch_shadows(tmp_path):
    """a = x * 7000 is inf in float16 for x = 10. The then-branch has its own initializer named a; the else-branch
    reads the outer a by name, so the If's output (a / 10) is inf too, and the overflow starts at mk_a."""
    then = h.make_graph([h.make_node("Mul", ["x", "a"], ["t"], name="m")], "then", [], [tensor("t", "fp32")],
                        [const("a", np.ones((2, 8)))])
    other = h.make_graph([h.make_node("Div", ["a", "ten"], ["e"], name="n")], "else", [], [tensor("e", "fp32")])
    nodes = [h.make_node("Mul", ["x", "big"], ["a"], name="mk_a"),
             h.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other)]
    path = save(model(nodes, [tensor("x", "fp32"), h.make_tensor_value_info("c", T.BOOL, [])], [tensor("y", "fp32")],
                      [const("big", 7000.0), const("ten", 10.0)]), tmp_path / "shadow.onnx")
    graph = load_onnx(str(path))
    branch = next(n for n in graph.nodes if n.op_type == "If")
    assert sorted(v.name for v in implicit_inputs(branch)) == ["a", "ten", "x"]
    _code, report = _run_feeds(tmp_path, path, x=np.full((2, 8), 10.0, np.float32), **_cond(False))
    found = {(r["rule_id"], r["node_name"]): r["values"] for r in report["results"]}
    assert set(found) == {("PA901", "mk_a"), ("PA906", "mk_a")}
    assert found[("PA901", "mk_a")]["absmax"] == 70000.0
    # the chain goes on through the If that reads a by name, to the graph output
    assert found[("PA906", "mk_a")]["chain"] == "mk_a → branch → graph output 'y'"


def test_two_control_flow_nodes_may_share_a_name(tmp_path):
    def branches(tag):
        return (h.make_graph([h.make_node("Mul", ["x", "two"], [f"t{tag}"], name="m")], "then", [],
                             [tensor(f"t{tag}", "fp32")]),
                h.make_graph([h.make_node("Neg", ["x"], [f"e{tag}"], name="n")], "else", [], [tensor(f"e{tag}", "fp32")]))
    (t1, e1), (t2, e2) = branches(1), branches(2)
    nodes = [h.make_node("If", ["c"], ["y1"], name="If", then_branch=t1, else_branch=e1),
             h.make_node("If", ["c"], ["y2"], name="If", then_branch=t2, else_branch=e2),
             h.make_node("Add", ["y1", "y2"], ["y"], name="add")]
    path = save(model(nodes, [tensor("x", "fp32"), h.make_tensor_value_info("c", T.BOOL, [])], [tensor("y", "fp32")],
                      [const("two", 2.0)]), tmp_path / "dup.onnx")
    _code, report = _run_feeds(tmp_path, path, x=np.full((2, 8), 20000.0, np.float32), **_cond(True))
    assert report["errors"] == [] and report["trace"][0]["nodes"] == {"onnxruntime": 3, "numpy": 0}
    # 2 * 20000 fits float16; their sum, 80000, does not
    assert {(r["rule_id"], r["node_name"]) for r in report["results"]} == {("PA901", "add"), ("PA906", "add")}


@pytest.mark.parametrize("target,why", [
    ("fp8-e4m3", "node 'branch' rounds into fp8-e4m3, which runs on numpy only"),
])
def test_control_flow_onnxruntime_cannot_emulate_says_why(tmp_path, capsys, target, why):
    from precaudit.cli import main

    path = _if_model(tmp_path)
    assert main([str(path), "--trace", "--dtype", target]) == 2
    assert capsys.readouterr().err == (f"precaudit: {path}: traced mode cannot run node 'branch' (If) on onnxruntime: "
                                       f"{why}\n")


def test_a_body_node_with_float16_statistics_says_why(tmp_path, capsys):
    from precaudit.cli import main

    then = h.make_graph([h.make_node("LayerNormalization", ["x", "g"], ["t"], name="ln", stash_type=T.FLOAT16)],
                        "then", [], [tensor("t", "fp32")])
    other = h.make_graph([h.make_node("Neg", ["x"], ["e"], name="n")], "else", [], [tensor("e", "fp32")])
    nodes = [h.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other)]
    path = save(model(nodes, [tensor("x", "fp32"), h.make_tensor_value_info("c", T.BOOL, [])], [tensor("y", "fp32")],
                      [const("g", np.ones(8))]), tmp_path / "stash.onnx")
    assert main([str(path), "--trace"]) == 2
    assert capsys.readouterr().err == (
        f"precaudit: {path}: traced mode cannot run node 'branch' (If) on onnxruntime: inside its body, node "
        "'branch/then_branch/ln' rounds its statistics into its stash_type, which runs on numpy only\n")


def _fixed_loop(path, trips: int, cond: bool = False):
    """A Loop adding 1 to x `trips` times; with cond, a condition input (true) that the body could end it by."""
    body = h.make_graph([h.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going"),
                         h.make_node("Add", ["v_in", "one"], ["v_out"], name="step")], "body",
                        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond_in", T.BOOL, []),
                         tensor("v_in", "fp32")],
                        [h.make_tensor_value_info("cond_out", T.BOOL, []), tensor("v_out", "fp32")])
    inits = [onnx.numpy_helper.from_array(np.array(trips, np.int64), "M"),
             onnx.numpy_helper.from_array(np.array(True), "go"), const("one", 1.0)]
    loop = h.make_node("Loop", ["M", "go" if cond else "", "x"], ["y"], body=body, name="loop")
    return save(model([loop], [tensor("x", "fp32")], [tensor("y", "fp32")], inits), path)


def test_a_loop_of_a_constant_1e15_trips_is_refused_before_it_runs_and_the_other_models_still_report(tmp_path):
    """A fixed trip count of 10**15 would hold its worker until --timeout (30 min by default): refused at once,
    one line; the model beside it in the -j 2 run is audited as usual, and a 3-trip twin runs."""
    from fixtures.onnx_builders import decomposed_layernorm

    huge = _fixed_loop(tmp_path / "huge.onnx", 10**15)
    few = _fixed_loop(tmp_path / "few.onnx", 3)
    while_loop = _fixed_loop(tmp_path / "while.onnx", 10**15, cond=True)  # a condition may end it: not refused
    norm = save(decomposed_layernorm(1e-12, dtype="fp32")[0], tmp_path / "ln.onnx")
    code, report = run_json([huge, few, norm], "--trace", "-j", "2", out_dir=tmp_path)
    assert code == 2 and report["models"] == [str(few), str(norm)]
    assert [(r["rule_id"], r["node_name"]) for r in report["results"] if r["severity"] == "error"] == \
        [("PA101", "add_eps")]
    assert [e["message"] for e in report["errors"]] == [
        "traced mode: Loop 'loop' runs 1,000,000,000,000,000 times (a constant trip count and no condition), above "
        "traced mode's 10,000,000: audit it without --trace"]
    from precaudit.frontends.onnx import load_onnx as load
    from precaudit.trace.limits import check_loop_trips

    check_loop_trips(load(str(while_loop)))  # no error: its body's condition decides
