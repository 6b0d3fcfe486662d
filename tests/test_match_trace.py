"""`precaudit match RULE MODEL`: why a rule fired or not, node by node."""

from __future__ import annotations

from fixtures.onnx_builders import chain_model, fused_norm, save
from fixtures.PA203_naive_softmax import NAIVE, STABLE, _axes
from precaudit.cli import main


def _trace(capsys, *args) -> list[str]:
    assert main(["match", *map(str, args)]) == 0
    return capsys.readouterr().out.splitlines()


def test_pattern_miss_names_the_failing_step(tmp_path, capsys):
    model = save(_axes(STABLE), tmp_path / "stable.onnx")
    lines = _trace(capsys, "naive-softmax", model)
    assert lines[0].startswith("PA203 naive-softmax on")
    assert lines[1] == "  node 'div' (Div): no match: input 0 of Exp 'e': found Sub 'xs', which the pattern excludes"


def test_pattern_match_fires(tmp_path, capsys):
    model = save(_axes(NAIVE), tmp_path / "naive.onnx")
    assert _trace(capsys, "PA203", model)[1] == "  node 'div' (Div): matched; FIRES"


def test_pattern_miss_on_the_wrong_producer(tmp_path, capsys):
    model = save(chain_model([("Relu", ["x"], "r"), ("Log", ["r"], "log")]), tmp_path / "m.onnx")
    assert _trace(capsys, "PA201", model)[1] == "  node 'log' (Log): no match: input 0 of Log 'log': expected Softmax, found Relu 'r'"


def test_site_rule_shows_the_condition_values(tmp_path, capsys):
    model = save(fused_norm("LayerNormalization", epsilon=1e-12), tmp_path / "ln.onnx")
    line = _trace(capsys, "PA101", model)[1]
    assert "node 'norm' (LayerNormalization, norm site): condition `has_eps and eps != 0 and eps_rounded == 0" in line
    assert "is false with" in line
    assert "eps_rounded=9.999999960041972e-13" in line  # stash_type defaults to float32, where 1e-12 survives


def test_node_glob_and_empty_result(tmp_path, capsys):
    model = save(_axes(NAIVE), tmp_path / "naive.onnx")
    assert _trace(capsys, "PA203", model, "--node", "nothing*")[1] == "  no Div node in the graph whose name matches 'nothing*'"


def test_unknown_rule(tmp_path, capsys):
    model = save(_axes(NAIVE), tmp_path / "naive.onnx")
    assert main(["match", "PA999", str(model)]) == 2
    assert "unknown rule 'PA999'" in capsys.readouterr().err


def test_no_angle_site_says_what_the_sin_reads(tmp_path, capsys):
    from fixtures.PA217_low_precision_angle import _rope, _sin_of_matmul

    lines = _trace(capsys, "PA217", save(_sin_of_matmul(), tmp_path / "sin.onnx"))
    assert lines[1:] == ["  no angle site in the graph",
                         "    node 'sin' (Sin) reads MatMul 'proj': no value made from integers (a Range, a CumSum of "
                         "ones, a Cast of integers) and constants alone, so no angle made from positions"]
    line = _trace(capsys, "PA217", save(_rope(100), tmp_path / "rope.onnx"))[1]
    assert line.startswith("  node 'cos' (Cos, angle site): condition `")
    assert line.endswith("is false with angle_bound=100.0, coarse_from=128.0, compute_dtype='float16'")


def test_no_guard_site_says_what_the_division_reads(tmp_path, capsys):
    model = save(chain_model([("Relu", ["x"], "r"), ("Div", ["x", "r"], "div")]), tmp_path / "m.onnx")
    assert _trace(capsys, "PA305", model)[1:] == [
        "  no guard site in the graph",
        "    node 'div' (Div) reads Relu 'r': no Add, Max or Clip of a constant between 0 and 1 (or an Add of 0.0 "
        "stored in float16), so no guard"]


def test_traced_rule_says_it_needs_a_run(tmp_path, capsys):
    from fixtures.PA217_low_precision_angle import _rope

    assert _trace(capsys, "PA909", save(_rope(100), tmp_path / "rope.onnx"))[1:] == [
        "  no traced_angle site in the graph",
        "    traced_angle sites come from a traced run (precaudit MODEL --trace): match reads the graph alone; they "
        "are the angle sites, measured"]
