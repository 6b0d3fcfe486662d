"""The emulation itself: float16 rounding exactly as numpy's cast, ops without a numpy kernel, control flow refused."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from fixtures.onnx_builders import chain_model, model, save, tensor
from precaudit.cli import main
from precaudit.trace.rounding import round_fp16
from tests.helpers import run_json


def test_fast_float16_rounding_matches_numpy_bit_for_bit():
    rng = np.random.default_rng(0)
    samples = [rng.standard_normal(200_000).astype(np.float32) * scale for scale in (1e-9, 1e-6, 1e-4, 1, 3e2, 6e4, 1e6)]
    samples.append(np.array([0.0, -0.0, 65504, 65519.99, 65520, -65520, np.inf, -np.inf, 2**-14, 2**-24, 2**-25,
                             3 * 2**-25, 1e-45], dtype=np.float32))
    samples.append(rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32))
    for x in samples:
        with np.errstate(all="ignore"):
            want = x.astype(np.float16).astype(np.float32)
        got = round_fp16(x)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        finite = ~np.isnan(want)
        assert np.array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))


def test_an_op_without_a_numpy_kernel_runs_through_the_reference_evaluator(tmp_path):
    # HardSwish(x) * 1000 then squared: the overflow is found behind an op precaudit has no kernel for
    steps = [("HardSwish", ["x"], "hs"), ("Mul", ["hs", "big"], "act"), ("Mul", ["act", "act"], "sq")]
    path = save(chain_model(steps, dtype="fp32", consts={"big": 1000.0}), tmp_path / "m.onnx")
    x = np.full((2, 8), 3.0, np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    _code, report = run_json([path], "--trace", "--trace-engine", "numpy", "--inputs", str(tmp_path / "x.npz"),
                            "--select", "PA901", out_dir=tmp_path)
    assert [(r["node_name"], r["values"]["absmax"]) for r in report["results"]] == [("sq", 9e6)]


def test_control_flow_on_the_numpy_engine_is_refused_with_one_line(tmp_path, capsys):
    then = h.make_graph([h.make_node("Identity", ["x"], ["t"])], "then", [], [tensor("t", "fp32")])
    other = h.make_graph([h.make_node("Neg", ["x"], ["e"])], "else", [], [tensor("e", "fp32")])
    nodes = [h.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other)]
    m = model(nodes, [tensor("x", "fp32"), h.make_tensor_value_info("c", T.BOOL, [])], [tensor("y", "fp32")])
    path = save(m, tmp_path / "if.onnx")
    assert main([str(path), "--trace", "--trace-engine", "numpy"]) == 2
    err = capsys.readouterr().err
    assert err == (f"precaudit: {path}: traced mode runs control flow on onnxruntime only: node 'branch' (If); "
                   "pip install 'precaudit[trace]' and use --trace-engine auto, or audit it without --trace\n")


@pytest.mark.requires("onnxruntime")
def test_onnxruntime_contrib_norm_kernels_match_onnxruntime(tmp_path):
    """SkipLayerNormalization and friends (in fp16 models ORT's optimizer fused) run in traced mode, as ORT computes them."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto as T
    from onnx import helper as h

    from fixtures.onnx_builders import const, model, save
    from precaudit.trace.kernels import MS_KERNELS, KernelContext

    shape = [2, 3, 8]
    rng = np.random.default_rng(0)
    gamma, beta, bias = rng.standard_normal(8), rng.standard_normal(8), rng.standard_normal(8)
    node = h.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta", "bias"], ["y", "", "", "sum"],
                       name="sln", domain="com.microsoft", epsilon=1e-5)
    m = model([node], [h.make_tensor_value_info(n, T.FLOAT, shape) for n in ("x", "skip")],
              [h.make_tensor_value_info(n, T.FLOAT, shape) for n in ("y", "sum")],
              [const("gamma", gamma), const("beta", beta), const("bias", bias)], extra_opsets=[("com.microsoft", 1)])
    path = save(m, tmp_path / "sln.onnx", check=False)
    x, skip = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)
    want_y, want_sum = ort.InferenceSession(str(path)).run(None, {"x": x, "skip": skip})

    from precaudit.frontends.onnx import load_onnx
    ir_node = load_onnx(str(path)).nodes[0]
    ctx = KernelContext(np.float32, round_stat=lambda a: a)
    args = [x, skip, gamma.astype(np.float32), beta.astype(np.float32), bias.astype(np.float32)]
    y, _, _, total = MS_KERNELS["SkipLayerNormalization"](ir_node, args, ctx)
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(total, want_sum, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("engine", ["onnxruntime", "numpy"])
def test_quantized_weights_and_old_batchnorm_run_in_traced_mode(engine, tmp_path):
    """A QDQ MatMul whose float16 product overflows, and a BatchNormalization-7 dividing by sqrt(0 + 1e-12)."""
    from onnx import numpy_helper

    from fixtures.onnx_builders import const

    pytest.importorskip("onnxruntime") if engine == "onnxruntime" else None
    wq = numpy_helper.from_array(np.arange(-32, 32, dtype=np.int8).reshape(8, 8), "wq")
    nodes = [h.make_node("DequantizeLinear", ["wq", "scale"], ["w"], name="dq"),
             h.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    qdq = save(model(nodes, [tensor("x", "fp32")], [tensor("y", "fp32")], [wq, const("scale", 1000.0)]),
               tmp_path / "qdq.onnx")
    np.savez(tmp_path / "x.npz", x=np.full((2, 8), 10.0, np.float32))
    _, report = run_json([qdq], "--trace", "--trace-engine", engine, "--inputs", str(tmp_path / "x.npz"),
                            "--select", "PA9", out_dir=tmp_path)
    found = {(r["rule_id"], r["node_name"]): r["values"] for r in report["results"]}
    assert set(found) == {("PA901", "mm"), ("PA906", "mm")}
    # column 0 of the int8 weights sums to -32: 10 * 1000 * 32 in the float reference
    assert found[("PA901", "mm")]["absmax"] == 320000.0

    channels = [const(n, np.full(4, 0.0 if n == "v" else 1.0)) for n in "sbmv"]
    bn = [h.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn", epsilon=1e-12)]
    old = save(model(bn, [tensor("x", "fp32", (2, 4, 3))], [tensor("y", "fp32", (2, 4, 3))], channels, opset=7),
               tmp_path / "bn7.onnx", check=False)
    _code, report = run_json([old], "--trace", "--trace-engine", engine, "--select", "PA9", out_dir=tmp_path)
    assert report["errors"] == []
    assert {(r["rule_id"], r["node_name"]) for r in report["results"]} == {("PA901", "bn"), ("PA906", "bn")}


@pytest.mark.parametrize("engine", ["onnxruntime", "numpy"])
def test_a_node_the_inputs_cannot_run_is_one_line(engine, tmp_path, capsys):
    """A MatMul of (2, 8) by (4, 4): onnxruntime refuses it quietly, the numpy kernel names the node, exit 2."""
    from fixtures.onnx_builders import const

    pytest.importorskip("onnxruntime") if engine == "onnxruntime" else None
    nodes = [h.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    path = save(model(nodes, [tensor("x", "fp32")], [tensor("y", "fp32")], [const("w", np.ones((4, 4)))]),
                tmp_path / "bad.onnx", check=False)
    assert main([str(path), "--trace", "--trace-engine", engine]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"precaudit: {path}: traced mode cannot run node 'mm' (MatMul): ValueError: matmul")
    assert err.count("\n") == 1
