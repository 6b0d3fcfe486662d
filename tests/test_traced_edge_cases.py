"""Traced-mode edge cases from a review of the onnxruntime engine: each ran wrong, crashed or fell back before.

Each runs on both engines where both can run it, and asserts what a user sees: findings, exit code, one line.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from fixtures.onnx_builders import const, model, save, tensor
from precaudit.cli import main
from precaudit.frontends.onnx import load_onnx
from tests.helpers import run_json

ENGINES = ["onnxruntime", "numpy"]


@pytest.fixture(params=ENGINES)
def engine(request):
    if request.param == "onnxruntime":
        pytest.importorskip("onnxruntime")
    return request.param


def _npz(tmp_path, **arrays) -> str:
    path = tmp_path / "in.npz"
    np.savez(path, **arrays)
    return str(path)


def test_a_shape_computed_from_data_that_differs_between_the_runs_is_one_line(tmp_path, engine, capsys):
    """x * 1e-8 underflows to 0 in float16: NonZero finds 16 elements in float32 and none in float16."""
    nodes = [h.make_node("Mul", ["x", "tiny"], ["a"], name="mul"),
             h.make_node("NonZero", ["a"], ["nz"], name="nonzero"),
             h.make_node("Shape", ["nz"], ["shape"], name="shape"),
             h.make_node("ConstantOfShape", ["shape"], ["c"], name="ones",
                         value=numpy_helper.from_array(np.array([1.0], np.float32))),
             h.make_node("ReduceSum", ["c"], ["y"], name="count", keepdims=0)]
    path = save(model(nodes, [tensor("x", "fp32")], [tensor("y", "fp32", ())], [const("tiny", 1e-8)]),
                tmp_path / "nonzero.onnx", check=False)
    assert main([str(path), "--trace", "--trace-engine", engine, "--inputs", _npz(tmp_path, x=np.ones((2, 8)))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gives shape (2, 16) in the float reference and (2, 0) in float16" in err


def test_an_omitted_optional_output_is_not_measured(tmp_path, engine):
    """SkipLayerNormalization with its mean and inv_std outputs left out (empty names): nothing to report there,
    although inv_std would be 1/sqrt(1e-12) = 1e6 on these constant rows."""
    nodes = [h.make_node("SkipLayerNormalization", ["x", "s", "g", "b"], ["y", "", "", "sum"], name="sln",
                         domain="com.microsoft", epsilon=1e-12),
             h.make_node("Add", ["y", "sum"], ["z"], name="add")]
    shape = (2, 4, 8)
    m = model(nodes, [tensor("x", "fp16", shape), tensor("s", "fp16", shape)], [tensor("z", "fp16", shape)],
              [const("g", np.ones(8), "fp16"), const("b", np.zeros(8), "fp16")])
    m.opset_import.append(h.make_opsetid("com.microsoft", 1))
    path = save(m, tmp_path / "skip.onnx", check=False)
    ones = np.ones(shape, np.float16)
    code, report = run_json([path], "--trace", "--trace-engine", engine, "--select", "PA9",
                            "--inputs", _npz(tmp_path, x=ones, s=ones), out_dir=tmp_path)
    assert (code, report["errors"], report["results"]) == (0, [], [])


@pytest.mark.requires("onnxruntime")
def test_float64_arrays_in_the_npz_run_as_the_model_declares(tmp_path):
    """numpy.savez writes float64 by default: the reference still computes in float32, and on onnxruntime."""
    steps = [h.make_node("Mul", ["x", "k"], ["a"], name="act"), h.make_node("Mul", ["a", "a"], ["y"], name="sq")]
    path = save(model(steps, [tensor("x", "fp32")], [tensor("y", "fp32")], [const("k", 300.0)]), tmp_path / "m.onnx")
    _code, report = run_json([path], "--trace", "--select", "PA901",
                            "--inputs", _npz(tmp_path, x=np.ones((2, 8), np.float64)), out_dir=tmp_path)
    assert report["trace"][0]["nodes"] == {"onnxruntime": 2, "numpy": 0}
    assert [(r["node_name"], r["values"]["absmax"]) for r in report["results"]] == [("sq", 90000.0)]


def test_layernorm_statistics_read_downstream(tmp_path, engine):
    """LayerNormalization's InvStdDev output, used by the next node: 1/sqrt(0 + 1e-4) = 100, times 1000."""
    nodes = [h.make_node("LayerNormalization", ["x", "g"], ["y", "mean", "istd"], name="ln", epsilon=1e-4),
             h.make_node("Mul", ["istd", "thousand"], ["scaled"], name="scale")]
    m = model(nodes, [tensor("x", "fp32")], [tensor("y", "fp32"), tensor("scaled", "fp32", (2, 1))],
              [const("g", np.ones(8)), const("thousand", 1000.0)])
    path = save(m, tmp_path / "ln.onnx", check=False)
    _code, report = run_json([path], "--trace", "--trace-engine", engine, "--select", "PA901",
                            "--inputs", _npz(tmp_path, x=np.ones((2, 8))), out_dir=tmp_path)
    assert report["errors"] == []
    assert [(r["node_name"], r["values"]["absmax"]) for r in report["results"]] == [("scale", pytest.approx(1e5, rel=1e-3))]


def test_integer_mod_takes_the_sign_of_the_divisor(tmp_path, engine):
    """Mod(-7, 3) is 2 with fmod=0 (C's fmod gives -1): 2 * 40000 overflows float16, 1 * 40000 would not."""
    nodes = [h.make_node("Mod", ["i", "three"], ["m"], name="mod"),
             h.make_node("Cast", ["m"], ["mf"], name="cast", to=T.FLOAT),
             h.make_node("Mul", ["mf", "big"], ["y"], name="scale")]
    m = model(nodes, [h.make_tensor_value_info("i", T.INT64, [2])], [tensor("y", "fp32", (2,))],
              [numpy_helper.from_array(np.array(3, np.int64), "three"), const("big", 40000.0)])
    path = save(m, tmp_path / "mod.onnx")
    _code, report = run_json([path], "--trace", "--trace-engine", engine, "--select", "PA901",
                            "--inputs", _npz(tmp_path, i=np.array([-7, 1], np.int64)), out_dir=tmp_path)
    assert [(r["node_name"], r["values"]["absmax"], r["values"]["overflow_fraction"]) for r in report["results"]] == \
        [("scale", 80000.0, 0.5)]


@pytest.mark.requires("onnxruntime")
def test_a_numpy_scalar_feeds_an_onnxruntime_segment(tmp_path):
    """fp8: ReduceSum (numpy, rounds into e4m3) gives a 0-d result; Relu and Neg after it only move values, which
    needs no rounding, so onnxruntime runs them, fed that result."""
    nodes = [h.make_node("ReduceSum", ["x"], ["s"], name="rsum", keepdims=0),
             h.make_node("Relu", ["s"], ["r"], name="relu"), h.make_node("Neg", ["r"], ["y"], name="neg")]
    path = save(model(nodes, [tensor("x", "fp32")], [tensor("y", "fp32", ())], opset=13), tmp_path / "m.onnx")
    _code, report = run_json([path], "--trace", "--dtype", "fp8-e4m3", out_dir=tmp_path)
    assert report["errors"] == []
    assert report["trace"][0]["nodes"] == {"onnxruntime": 2, "numpy": 1}


def test_sequence_ops_are_one_line(tmp_path, engine, capsys):
    nodes = [h.make_node("SplitToSequence", ["x"], ["seq"], name="split", axis=1),
             h.make_node("ConcatFromSequence", ["seq"], ["y"], name="concat", axis=1)]
    path = save(model(nodes, [tensor("x", "fp32")], [tensor("y", "fp32")]), tmp_path / "seq.onnx", check=False)
    assert main([str(path), "--trace", "--trace-engine", engine]) == 2
    assert capsys.readouterr().err == (f"precaudit: {path}: traced mode does not run sequence ops yet: node 'split' "
                                       "(SplitToSequence); audit it without --trace\n")


def test_an_explicit_ai_onnx_import_sets_the_opset(tmp_path):
    """The import names the domain "ai.onnx", the node leaves it empty: the same domain."""
    nodes = [h.make_node("Relu", ["x"], ["y"], name="relu")]
    g = h.make_graph(nodes, "g", [tensor("x", "fp32")], [tensor("y", "fp32")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("ai.onnx", 13)])
    graph = load_onnx(str(save(m, tmp_path / "m.onnx", check=False)))
    assert graph.nodes[0].opset == 13


def test_an_input_keeps_its_shape_when_an_output_of_the_same_name_has_none(tmp_path):
    nodes = [h.make_node("Relu", ["x"], ["y"], name="relu")]
    g = h.make_graph(nodes, "g", [tensor("x", "fp32")], [tensor("y", "fp32"), h.make_tensor_value_info("x", T.FLOAT, None)])
    graph = load_onnx(str(save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "m.onnx",
                               check=False)))
    assert graph.inputs[0].shape == (2, 8)


def test_a_norm_whose_input_only_rearranges_another_value(tmp_path, engine):
    """Transpose → LayerNormalization (ConvNeXt's channels-last norm): the norm's row variances are measured
    from the Transpose's output, whose own numbers are its input's; a constant row with eps 0 is 0/0."""
    nodes = [h.make_node("Mul", ["x", "k"], ["a"], name="scale"),
             h.make_node("Transpose", ["a"], ["t"], name="to_last", perm=[1, 0]),
             h.make_node("LayerNormalization", ["t", "g"], ["y"], name="ln", epsilon=0.0)]
    m = model(nodes, [tensor("x", "fp32", (8, 2))], [tensor("y", "fp32", (2, 8))], [const("k", 1.0), const("g", np.ones(8))])
    path = save(m, tmp_path / "ln.onnx")
    x = np.random.default_rng(0).standard_normal((8, 2)).astype(np.float32)
    x[:, 0] = 3.0  # after the Transpose, row 0 is constant
    _code, report = run_json([path], "--trace", "--trace-engine", engine, "--select", "PA902",
                            "--inputs", _npz(tmp_path, x=x), out_dir=tmp_path)
    assert report["errors"] == []
    assert [(r["node_name"], r["values"]["zero_variance_rows"], r["values"]["rows"]) for r in report["results"]] == \
        [("ln", 1, 2)]


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.requires("onnxruntime")
def test_dropout_exported_in_training_mode_runs_as_in_inference(tmp_path, training):
    """torch.export of a module left in training mode writes Dropout(x, 0.5, training_mode=True): both runs must read
    the same x (inference: the identity), or every value after it differs by far more than rounding (PA908)."""
    nodes = [h.make_node("Dropout", ["x", "ratio", "training"], ["d"], name="dropout"),
             h.make_node("Mul", ["d", "d"], ["sq"], name="square"),
             h.make_node("ReduceMean", ["sq", "axes"], ["ms"], name="mean"),
             h.make_node("Add", ["ms", "eps"], ["var"], name="add_eps"),
             h.make_node("Sqrt", ["var"], ["rms"], name="root"),
             h.make_node("Div", ["d", "rms"], ["y"], name="normalize")]
    inits = [const("ratio", 0.5), const("eps", 1e-3), numpy_helper.from_array(np.array(training), "training"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    path = save(model(nodes, [tensor("x", "fp32", (4, 64))], [tensor("y", "fp32", (4, 64))], inits, opset=18),
                tmp_path / "dropout.onnx")
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    for engine in ENGINES:
        _, report = run_json([path], "--trace", "--trace-engine", engine, "--inputs", _npz(tmp_path, x=x),
                             "--select", "PA9", out_dir=tmp_path)
        assert report["errors"] == [] and report["results"] == [], engine
        if engine == "onnxruntime":
            assert report["trace"][0]["nodes"]["numpy"] == 0
