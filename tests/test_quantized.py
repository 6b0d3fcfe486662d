"""Quantized models: the report says which parts are quantized and what the audit judges, and the float twin of
the same graph says nothing of the kind."""

from __future__ import annotations

import numpy as np
import pytest

from fixtures.quantized_models import int8_linear_layernorm, mxfp4_linear, nvfp4_linear, trt_nvfp4_activation
from precaudit.cli import main
from tests.helpers import run_json


def test_an_int8_matmulinteger_graph_is_named_quantized(tmp_path):
    path = int8_linear_layernorm(tmp_path / "int8.onnx")
    code, report = run_json([path], out_dir=tmp_path)
    assert report["quantized"] == [{"model": str(path), "ops": {"DynamicQuantizeLinear": 1, "MatMulInteger": 1},
                                    "integer_nodes": 1, "float_nodes": 11, "accumulator_casts": ["to_float"]}]
    # the float parts are audited as ever: the LayerNorm's eps 1e-12 is 0.0 in float16; and DynamicQuantizeLinear
    # takes float32 only: converted to float16, the model would not load
    assert sorted((r["rule_id"], r["node_name"]) for r in report["results"]) == [
        ("PA101", "add_eps"), ("PA208", "add_eps"), ("PA220", "quantize_x")]
    assert code == 1


def test_an_accumulator_cast_after_an_int32_bias_add_is_counted(tmp_path):
    """onnxruntime's quantizer adds the int32 bias before the Cast (ConvInteger → Add → Cast): still a Cast of the
    accumulator, which a float16 converter makes float16, and which overflows on these inputs."""
    path = int8_linear_layernorm(tmp_path / "int8.onnx", bias=True)
    _, report = run_json([path], out_dir=tmp_path)
    assert report["quantized"][0]["accumulator_casts"] == ["to_float"]
    _, report = run_json([path], "--trace", "--select", "PA901", out_dir=tmp_path)
    assert [(r["rule_id"], r["node_name"]) for r in report["results"]] == [("PA901", "to_float")]


def test_the_text_report_says_what_is_audited(tmp_path, capsys):
    path = int8_linear_layernorm(tmp_path / "int8.onnx")
    main([str(path)])
    out = capsys.readouterr().out
    assert (f"{path}: quantized (1 DynamicQuantizeLinear, 1 MatMulInteger): 1 node computes in integers and is not "
            "judged as float; the audit covers the 11 float nodes (scales, rescales, norms, softmaxes); 1 Cast of an "
            "integer accumulator to float, which a float16 converter makes float16") in out


def test_the_float_twin_is_not_quantized(tmp_path):
    path = int8_linear_layernorm(tmp_path / "float.onnx", quantized=False)
    _, report = run_json([path], out_dir=tmp_path)
    assert "quantized" not in report
    assert sorted(r["rule_id"] for r in report["results"]) == ["PA101", "PA208"]


def test_traced_the_integer_accumulator_cast_to_float16_overflows(tmp_path):
    """|acc| of 64 int8 x uint8 products passes 65504: the Cast a float16 converter makes float16 overflows."""
    path = int8_linear_layernorm(tmp_path / "int8.onnx")
    _, report = run_json([path], "--trace", "--select", "PA901", out_dir=tmp_path)
    assert [(r["rule_id"], r["node_name"], r["inputs"]) for r in report["results"]] == \
        [("PA901", "to_float", "synthesized")]


# ---- QDQ graphs of opsets 21-25 and ModelOpt's TensorRT ops -------------------------------------------------------

def _one_node(tmp_path, op: str, inits: list, attrs: dict, opset: int, x=None):
    """A one-node model of op over the initializers (and a float input x): its reference-evaluator output, and the
    node and arguments as precaudit's frontend reads them."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    from precaudit.frontends.onnx import load_onnx

    names, feeds, inputs = [n for n, _ in inits], {}, []
    if x is not None:
        names, feeds = ["x", *names], {"x": x}
        inputs = [h.make_tensor_value_info("x", T.FLOAT, list(x.shape))]
    node = h.make_node(op, names, ["y"], name="n", **attrs)
    graph = h.make_graph([node], "g", inputs, [h.make_tensor_value_info("y", T.UNDEFINED, None)],
                         [numpy_helper.from_array(a, n) for n, a in inits])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 11
    onnx.save(model, str(tmp_path / "one.onnx"))
    read = load_onnx(str(tmp_path / "one.onnx")).nodes[0]
    return ReferenceEvaluator(model).run(None, feeds)[0], read, [feeds["x"] if v.name == "x" else v.const()
                                                                  for v in read.inputs]


def _qdq_cases():
    import ml_dtypes
    from onnx import TensorProto as T

    rs = np.random.RandomState(0)
    codes = rs.randint(100, 140, (4, 3)).astype(np.uint8)
    codes[0, 0], codes[1, 1] = 255, 0  # an E8M0 NaN and 2**-127
    x = rs.uniform(-10, 10, (4, 40)).astype(np.float32)
    ties = np.array([[2.5, 3.5, -2.5, 300, -300, 0.49]], np.float32)
    big = np.array([[1.0, 500.0, -1000.0, 3.3]], np.float32)
    fp8_zero = ("z", np.array(0, ml_dtypes.float8_e4m3fn))
    return [
        # FP4 data, E8M0 scales, 40 columns in blocks of 16 (the last block has 8)
        ("DequantizeLinear", [("d", rs.uniform(-6, 6, (4, 40)).astype(ml_dtypes.float4_e2m1fn)),
                              ("s", codes.view(ml_dtypes.float8_e8m0fnu))],
         {"axis": 1, "block_size": 16, "output_dtype": T.FLOAT}, 25, None),
        ("DequantizeLinear", [("d", rs.randint(-8, 8, (40, 3)).astype(ml_dtypes.int4)),
                              ("s", rs.uniform(0.1, 1, (3, 3)).astype(np.float32)),
                              ("z", rs.randint(-2, 2, (3, 3)).astype(ml_dtypes.int4))], {"axis": 0, "block_size": 16}, 21, None),
        ("DequantizeLinear", [("d", rs.uniform(-400, 400, (3, 5)).astype(ml_dtypes.float8_e4m3fn)),
                              ("s", np.array([0.5, 0.25, 2], np.float16))], {"axis": 0}, 23, None),
        ("QuantizeLinear", [("s", rs.uniform(0.5, 2, (4, 3)).astype(np.float32)),
                            ("z", np.zeros((4, 3), ml_dtypes.float4_e2m1fn))], {"axis": 1, "block_size": 16}, 23, x),
        ("QuantizeLinear", [("s", np.array(1.0, np.float32)), fp8_zero], {"saturate": 0}, 21, big),
        ("QuantizeLinear", [("s", np.array(1.0, np.float32)), fp8_zero], {}, 21, big),
        ("QuantizeLinear", [("s", np.array(1.0, np.float32)), ("z", np.array(3, np.int8))], {}, 21, ties),
        ("QuantizeLinear", [("s", np.array([0.5, 1, 2, 4, 0.1, 1], np.float32)),
                            ("z", np.array([1, 2, 3, 4, 5, 6], ml_dtypes.uint4))], {"axis": 1}, 25, ties),
        ("QuantizeLinear", [("s", np.array(0.5, np.float32))], {"output_dtype": T.INT16}, 25, ties),
    ]


@pytest.mark.parametrize("case", range(9))
def test_quantize_and_dequantize_kernels_give_the_onnx_reference_numbers(case, tmp_path):
    """Blocked, per-axis and per-tensor; FP4, int4, FP8, int8/int16 data; E8M0 scales with a NaN and a 2**-127;
    saturate=0 (1000 in E4M3 is NaN) and 1 (448); ties to even: the numpy kernels agree with onnx's own reference
    implementation number for number (the blocked DequantizeLinear used to raise NotImplementedError)."""
    from precaudit.trace.kernels import KernelContext
    from precaudit.trace.qdq import QDQ_KERNELS

    op, inits, attrs, opset, x = _qdq_cases()[case]
    expected, node, args = _one_node(tmp_path, op, inits, attrs, opset, x)
    got = QDQ_KERNELS[op](node, args, KernelContext(np.float32))[0]
    assert np.array_equal(np.asarray(got).astype(np.float64), np.asarray(expected).astype(np.float64), equal_nan=True)
    # integer and FP4 data come out as their own type; FP8 and dequantized values as float32, rounded after
    assert got.dtype == (np.float32 if expected.dtype.name.startswith(("float8", "float16")) else expected.dtype)


def test_the_frontend_reads_fp4_data_and_e8m0_scales(tmp_path):
    """FLOAT4E2M1 is stored two values a byte and FLOAT8E8M0 one exponent a byte: read inline and as external data,
    the weights and scales are the numbers dtypes.quantize_blocks made."""
    import onnx

    from fixtures.quantized_models import linear_weight
    from precaudit.dtypes import FORMATS, quantize_blocks
    from precaudit.frontends.onnx import load_onnx

    w = linear_weight()
    elements, scales = quantize_blocks(w, FORMATS["mxfp4"], axis=1)
    path = mxfp4_linear(tmp_path / "mx.onnx", w)
    external = tmp_path / "ext" / "mx.onnx"
    external.parent.mkdir()
    onnx.save(onnx.load(str(path)), str(external), save_as_external_data=True, size_threshold=0)
    for model in (path, external):
        values = {v.name: v for n in load_onnx(str(model)).nodes for v in n.inputs if v is not None}
        assert (values["w_fp4"].dtype, values["w_scale"].dtype) == ("fp4-e2m1", "fp8-e8m0")
        assert np.array_equal(values["w_fp4"].const().astype(np.float32), elements)
        assert np.array_equal(values["w_scale"].const().astype(np.float64), scales.stored)
        assert values["w_fp4"].const().shape == (4, 64) and scales.stored.shape == (4, 2)


@pytest.mark.parametrize("engine", ["onnxruntime", "numpy"])
def test_traced_mode_runs_blocked_qdq_graphs_on_both_engines(engine, tmp_path):
    """NVFP4 (two DequantizeLinear), MXFP4 (FP4 data, E8M0 scales) and ModelOpt's TensorRT ops: every node runs
    (onnxruntime 1.32 has no FP4 kernel, numpy runs those), nothing is found in the float parts, and the report
    names the block-scaled data."""
    models = {"nv": (nvfp4_linear(tmp_path / "nv.onnx"), {"float4_e2m1fn in blocks of 16": 1}, 3),
              "mx": (mxfp4_linear(tmp_path / "mx.onnx"), {"float4_e2m1fn in blocks of 32": 1}, 2),
              "trt": (trt_nvfp4_activation(tmp_path / "trt.onnx"),
                      {"NVFP4 blocks of 16": 2, "float4_e2m1fn in blocks of 16": 1}, 6)}
    for path, blocks, nodes in models.values():
        code, report = run_json([path], "--trace", "--trace-engine", engine, out_dir=tmp_path)
        assert (code, report["errors"], report["results"]) == (0, [], [])
        assert report["quantized"][0]["blocks"] == blocks
        ran = report["trace"][0]["nodes"]
        assert sum(ran.values()) == nodes and (engine == "onnxruntime" or ran["onnxruntime"] == 0)


def test_modelopt_trt_ops_quantize_as_dtypes_does():
    """TRT_FP4DynamicQuantize then the two DequantizeLinear nodes give x in NVFP4 with the global scale given;
    TRT_MXFP8DynamicQuantize then TRT_MXFP8DequantizeLinear give x in MXFP8 (E8M0 codes as uint8): the numbers of
    dtypes.quantize, the one place that says what a value becomes."""
    from onnx import TensorProto as T

    from precaudit.dtypes import FORMATS, quantize
    from precaudit.ir import Node
    from precaudit.trace.kernels import KernelContext
    from precaudit.trace.qdq import QDQ_KERNELS, TRT_KERNELS

    ctx = KernelContext(np.float32)
    x = np.random.RandomState(1).standard_normal((3, 64)).astype(np.float32)
    x[0, :16] = 0.0  # an all-zero NVFP4 block: scale 1.0, no 0/0
    x[1, 32:] = 0.0  # an all-zero MX block: E8M0 code 0 (2**-127)
    x[2, 0] = 300.0  # floor(log2 300) - 8 = 0: code 127, scale 1
    gs = np.array(3.0 / 6 / 448, np.float32)
    data, scale = TRT_KERNELS["TRT_FP4DynamicQuantize"](Node("q", "TRT_FP4DynamicQuantize", "trt",
                                                             {"axis": -1, "block_size": 16}), [x, gs], ctx)
    scale_f = QDQ_KERNELS["DequantizeLinear"](Node("s", "DequantizeLinear"), [scale, gs], ctx)[0]
    back = QDQ_KERNELS["DequantizeLinear"](Node("d", "DequantizeLinear", "", {"axis": -1, "block_size": 16}),
                                           [data, scale_f], ctx)[0]
    assert data.dtype.name == "float4_e2m1fn" and scale.shape == (3, 4)
    assert np.array_equal(back, quantize(x, FORMATS["nvfp4"], global_scale=float(gs)), equal_nan=True)
    assert int(np.count_nonzero(back[0, :16])) == 0 and float(scale[0, 0]) == 1.0
    # 300 against a global scale calibrated for amax 3: its block scale 300 / (6 * 3/2688) = 44800 is beyond E4M3
    assert np.isnan(scale[2, 0]) and np.isnan(back[2, :16]).all() and not np.isnan(back[2, 16:]).any()
    data8, codes = TRT_KERNELS["TRT_MXFP8DynamicQuantize"](Node("q", "TRT_MXFP8DynamicQuantize", "trt",
                                                                {"axis": -1, "block_size": 32}), [x], ctx)
    back8 = TRT_KERNELS["TRT_MXFP8DequantizeLinear"](Node("d", "TRT_MXFP8DequantizeLinear", "trt",
                                                          {"axis": -1, "block_size": 32, "output_dtype": T.FLOAT}),
                                                     [data8, codes], ctx)[0]
    assert codes.dtype == np.uint8 and (codes[1, 1], codes[2, 0]) == (0, 127)
    assert np.array_equal(back8, quantize(x, FORMATS["mxfp8"]))


def test_a_block_size_that_is_no_positive_integer_is_one_line(tmp_path, capsys):
    """ModelOpt's ops carry no ONNX schema, so a stranger's file may write block_size 0 or -3: the static audit
    skips such a node, traced mode refuses it in one line naming the node (exit 2), and nothing crashes."""
    import onnx

    model = onnx.load(str(trt_nvfp4_activation(tmp_path / "trt.onnx")))
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.name == "block_size":
                attr.i = -3 if node.op_type == "TRT_FP4QDQ" else 0
    path = tmp_path / "bad.onnx"
    onnx.save(model, str(path))
    code, report = run_json([path], "--check-weights", out_dir=tmp_path)
    assert (code, report["results"], report["errors"]) == (0, [], [])
    assert main([str(path), "--trace"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"precaudit: {path}: traced mode cannot run node 'quantize_x' (TRT_FP4DynamicQuantize): "
                   "ValueError: block_size 0 is no positive integer"]
