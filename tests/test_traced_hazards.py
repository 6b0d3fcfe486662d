"""Traced mode on models whose float16 run truly goes inf/NaN on a given input: it names the node, its fixed twin is clean."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper

from fixtures.onnx_builders import chain_model, const, save
from tests.helpers import run_json

LAYERNORM = [("ReduceMean", ["x"], "mean", {"axes": [-1]}), ("Sub", ["x", "mean"], "xc"), ("Pow", ["xc", "two"], "sq"),
             ("ReduceMean", ["sq"], "var", {"axes": [-1]}), ("Add", ["var", "eps"], "add_eps"), ("Sqrt", ["add_eps"], "std"),
             ("Div", ["xc", "std"], "n")]
RMSNORM = [("Pow", ["x", "two"], "sq"), ("ReduceMean", ["sq"], "ms", {"axes": [-1]}), ("Add", ["ms", "eps"], "add_eps"),
           ("Sqrt", ["add_eps"], "rms"), ("Div", ["x", "rms"], "n")]
RMSNORM_UPCAST = [("Cast", ["x"], "x32", {"to": 1}), ("Pow", ["x32", "two32"], "sq"), ("ReduceMean", ["sq"], "ms", {"axes": [-1]}),
                  ("Add", ["ms", "eps32"], "add_eps"), ("Sqrt", ["add_eps"], "rms"), ("Div", ["x32", "rms"], "n32"),
                  ("Cast", ["n32"], "n", {"to": 10})]
NAIVE_SOFTMAX = [("Exp", ["x"], "e"), ("ReduceSum", ["e", "axes"], "s"), ("Div", ["e", "s"], "p")]
STABLE_SOFTMAX = [("ReduceMax", ["x"], "m", {"axes": [-1]}), ("Sub", ["x", "m"], "xs"), ("Exp", ["xs"], "e"),
                  ("ReduceSum", ["e", "axes"], "s"), ("Div", ["e", "s"], "p")]
LOG_OF_SOFTMAX = [("Softmax", ["x"], "p", {"axis": -1}), ("Log", ["p"], "logp")]
LOG_SOFTMAX = [("LogSoftmax", ["x"], "logp", {"axis": -1})]


def _write(tmp_path, model, x: np.ndarray):
    path = save(model, tmp_path / "model.onnx")
    np.savez(tmp_path / "x.npz", x=x)
    return path, str(tmp_path / "x.npz")


def _trace(tmp_path, model, x, *args):
    path, npz = _write(tmp_path, model, x)
    code, report = run_json([path], "--trace", "--inputs", npz, "--select", "PA9", *args, out_dir=tmp_path)
    assert report["errors"] == []
    return code, {(r["rule_id"], r["node_name"]): r for r in report["results"]}


def _softmax_model(steps):
    m = chain_model(steps)
    m.graph.initializer.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes"))
    return m


def _constant_row() -> np.ndarray:
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float16)
    x[0] = 3.0  # a constant row: variance exactly 0
    return x


def test_zero_variance_row_with_underflowing_eps_names_the_norm_and_the_nan(tmp_path):
    code, found = _trace(tmp_path, chain_model(LAYERNORM, consts={"two": 2.0, "eps": 1e-12}), _constant_row())
    assert code == 1
    norm = found[("PA902", "add_eps")]
    assert norm["values"]["zero_variance_rows"] == 1 and norm["values"]["eps_rounded"] == 0.0
    assert "1 of 2 rows had variance 0.0 in float16" in norm["message"]
    first = found[("PA906", "n")]
    assert first["values"]["nonfinite_fraction"] == 0.5  # the constant row: 8 of 16 values are 0/0
    assert first["values"]["chain"] == "n → output → graph output 'y'"


def test_zero_variance_row_with_eps_1e5_is_clean(tmp_path):
    code, found = _trace(tmp_path, chain_model(LAYERNORM, consts={"two": 2.0, "eps": 1e-5}), _constant_row())
    assert (code, found) == (0, {})


def _activations_of_300() -> np.ndarray:
    x = np.ones((2, 8), np.float16)
    x[:, 0] = 300.0
    return x


def test_square_overflow_at_300_is_found_by_the_emulation(tmp_path):
    code, found = _trace(tmp_path, chain_model(RMSNORM, consts={"two": 2.0, "eps": 1e-3}), _activations_of_300())
    # and the output stays finite (x / inf = 0 in those rows), off the reference: the silent failure PA911 names
    assert code == 1 and set(found) == {("PA901", "sq"), ("PA911", "output")}
    assert found[("PA911", "output")]["values"]["cause_node"] == "sq"
    values = found[("PA901", "sq")]["values"]
    assert values["absmax"] == 90000.0 and values["overflow_fraction"] == pytest.approx(2 / 16)
    assert values["nonfinite_fraction"] == pytest.approx(2 / 16)
    assert "reaches |x| = 9e+04 in the float reference, above the float16 max 65504" in found[("PA901", "sq")]["message"]


@pytest.mark.requires("onnxruntime")
def test_onnxruntime_cpu_fp16_hides_the_same_overflow(tmp_path):
    import onnxruntime as ort
    path = save(chain_model(RMSNORM, consts={"two": 2.0, "eps": 1e-3}), tmp_path / "model.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": _activations_of_300()})
    # onnxruntime computes the chain in float32 internally: finite, "correct" output, no sign of the inf a
    # GPU float16 kernel produces at x² (90000 > 65504), where the row would become x / inf = 0
    assert np.isfinite(y).all() and float(y[0, 0]) == pytest.approx(300 / np.sqrt((300**2 + 7) / 8), rel=1e-2)


def test_square_overflow_twin_upcast_to_float32_is_clean(tmp_path):
    m = chain_model(RMSNORM_UPCAST)
    m.graph.initializer.extend([const("two32", 2.0), const("eps32", 1e-3)])
    code, found = _trace(tmp_path, m, _activations_of_300())
    assert (code, found) == (0, {})


def test_logits_of_100_through_a_naive_softmax(tmp_path):
    code, found = _trace(tmp_path, _softmax_model(NAIVE_SOFTMAX), np.full((2, 8), 100.0, np.float16))
    assert code == 1 and set(found) == {("PA903", "e"), ("PA906", "e")}
    assert "Exp input reaches 100, above 11.09 where exp overflows float16" in found[("PA903", "e")]["message"]
    assert found[("PA906", "e")]["values"]["chain"] == "e → p → output → graph output 'y'"


def test_logits_of_100_through_a_max_shifted_softmax_are_clean(tmp_path):
    code, found = _trace(tmp_path, _softmax_model(STABLE_SOFTMAX), np.full((2, 8), 100.0, np.float16))
    assert (code, found) == (0, {})


def _peaked_logits() -> np.ndarray:
    x = np.zeros((2, 8), np.float16)
    x[:, 0] = 30.0  # p = e^-30 = 9.4e-14 elsewhere: 0.0 in float16, finite in float32
    return x


def test_log_of_an_underflowed_probability(tmp_path):
    code, found = _trace(tmp_path, chain_model(LOG_OF_SOFTMAX), _peaked_logits())
    assert code == 1 and {("PA904", "logp"), ("PA906", "logp")} <= set(found)
    log = found[("PA904", "logp")]["values"]
    assert log["zero_fraction"] == pytest.approx(14 / 16) and log["ref_zero_fraction"] == 0.0
    assert log["input_min_abs"] == pytest.approx(np.exp(-30.0) / (1 + 7 * np.exp(-30.0)), rel=1e-6)


def test_logsoftmax_of_the_same_logits_is_clean(tmp_path):
    code, found = _trace(tmp_path, chain_model(LOG_SOFTMAX), _peaked_logits())
    assert (code, found) == (0, {})
