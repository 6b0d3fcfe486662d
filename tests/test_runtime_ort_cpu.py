"""--runtime ort-cpu against onnxruntime's CPU execution provider itself: the float16 kernels the model lists are
the ones this onnxruntime has, and traced mode's emulation gives the outputs onnxruntime gives, bit for bit."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

ort = pytest.importorskip("onnxruntime")

from precaudit.deployment import Deployment  # noqa: E402
from precaudit.frontends.onnx import load_onnx  # noqa: E402
from precaudit.runtime.ort_cpu import FP16_KERNELS  # noqa: E402
from precaudit.trace import Emulator  # noqa: E402

_MS = "com.microsoft"
# (domain, op, inputs, attributes): one float16 node each, inputs of shape [2, 4, 8] unless named
PROBES = [("", op, 1, {}) for op in ("Sqrt", "Reciprocal", "Exp", "Log", "Neg", "Abs", "Relu", "Sigmoid", "Tanh", "Erf",
                                     "Transpose", "Round", "Softmax", "Cast", "Floor", "Sin")] + \
         [("", op, 2, {}) for op in ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum")] + \
         [("", "ReduceMean", 1, {"keepdims": 1}), ("", "ReduceSum", 1, {"keepdims": 1}),
          ("", "LayerNormalization", 3, {"axis": -1}), ("", "Concat", 2, {"axis": 0}), ("", "Clip", 1, {}),
          (_MS, "SkipLayerNormalization", 3, {}), ("", "MatMul", 2, {})]


def _probe_model(domain: str, op: str, n: int, attrs: dict) -> onnx.ModelProto:
    shapes = {"LayerNormalization": [[2, 4, 8], [8], [8]], "SkipLayerNormalization": [[2, 4, 8], [2, 4, 8], [8]],
              "MatMul": [[2, 4, 8], [2, 8, 4]]}.get(op, [[2, 4, 8]] * n)
    inputs = [h.make_tensor_value_info(f"i{k}", T.FLOAT16, s) for k, s in enumerate(shapes)]
    if op == "Cast":
        attrs = {"to": T.FLOAT16}
    node = h.make_node(op, [f"i{k}" for k in range(n)], ["y"], domain=domain, **attrs)
    opsets = [h.make_opsetid("", 21)] + ([h.make_opsetid(_MS, 1)] if domain else [])
    graph = h.make_graph([node], "probe", inputs, [h.make_tensor_value_info("y", T.FLOAT16, None)])
    return h.make_model(graph, opset_imports=opsets, ir_version=9)


def _runs_in_float16(model: onnx.ModelProto, tmp_path) -> bool:
    """onnxruntime keeps the node on a float16 kernel: it inserts no Cast around it in the optimized graph."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]
    return "Cast" not in ops or ops == ["Cast"]


def test_the_float16_kernels_the_model_lists_are_this_onnxruntimes(tmp_path):
    """Measured now, on the installed onnxruntime: which ops keep float16 and which run float32 between Casts."""
    measured = {(d, op) for d, op, n, attrs in PROBES if _runs_in_float16(_probe_model(d, op, n, attrs), tmp_path)}
    listed = {(d, op) for d, op, _, _ in PROBES if (d, op) in FP16_KERNELS}
    assert measured == listed


def _outputs(path, runtime: str | None, feeds: dict, engine: str) -> dict[str, np.ndarray]:
    """The graph's outputs as traced mode emulates them at this runtime."""
    graph = load_onnx(str(path))
    emulator = Emulator(graph, Deployment.named("fp16", runtime=runtime).resolver(graph), engine=engine)
    got: dict[str, np.ndarray] = {}
    for value in graph.outputs:
        node = value.producer
        index = node.outputs.index(value)
        emulator.hooks.setdefault(id(node), []).append(
            lambda ref_args, emu_args, ref_outs, emu_outs, i=index, name=value.name: got.__setitem__(name, emu_outs[i]))
    emulator.run(feeds, final=True)
    return got


def _ort_cpu(path, feeds: dict) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _decomposed_layernorm_fp16(path):
    nodes = [h.make_node("ReduceMean", ["x"], ["m"], axes=[-1], name="mean"),
             h.make_node("Sub", ["x", "m"], ["d"], name="sub"),
             h.make_node("Pow", ["d", "two"], ["q"], name="pow"),
             h.make_node("ReduceMean", ["q"], ["v"], axes=[-1], name="var"),
             h.make_node("Add", ["v", "eps"], ["ve"], name="add_eps"),
             h.make_node("Sqrt", ["ve"], ["s"], name="sqrt"),
             h.make_node("Div", ["d", "s"], ["y"], name="div")]
    graph = h.make_graph(nodes, "ln", [h.make_tensor_value_info("x", T.FLOAT16, [4, 64])],
                         [h.make_tensor_value_info("y", T.FLOAT16, [4, 64]),
                          h.make_tensor_value_info("v", T.FLOAT16, [4, 1])],
                         [numpy_helper.from_array(np.array(2, np.float16), "two"),
                          numpy_helper.from_array(np.array(1e-5, np.float16), "eps")])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)], ir_version=9), path)
    return path


def _between(path, ops: list[str]):
    """Mul(x, 100) → ops... → Mul(·, 0.01): what passes between holds 100·x."""
    nodes, last = [h.make_node("Mul", ["x", "hundred"], ["a0"], name="up")], "a0"
    for k, op in enumerate(ops):
        inputs = [last, last] if op == "Concat" else [last]
        nodes.append(h.make_node(op, inputs, [f"a{k + 1}"], name=op.lower(), **({"axis": 0} if op == "Concat" else {})))
        last = f"a{k + 1}"
    nodes.append(h.make_node("Mul", [last, "hundredth"], ["y"], name="down"))
    graph = h.make_graph(nodes, "between", [h.make_tensor_value_info("x", T.FLOAT16, [2, 2])],
                         [h.make_tensor_value_info("y", T.FLOAT16, None)],
                         [numpy_helper.from_array(np.array(100, np.float16), "hundred"),
                          numpy_helper.from_array(np.array(0.01, np.float16), "hundredth")])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)], ir_version=9), path)
    return path


@pytest.mark.parametrize("engine", ["numpy", "onnxruntime"])
def test_a_float16_layernorm_with_large_deviations_emulates_as_onnxruntime_cpu_runs_it(engine, tmp_path):
    """|x - mean| about 800: x² is 640,000, beyond float16; onnxruntime CPU computes the chain in float32 and
    rounds only the outputs. The emulation at --runtime ort-cpu gives its outputs bit for bit; without a runtime it
    predicts what a float16 GPU kernel does (inf variance, y all 0)."""
    path = _decomposed_layernorm_fp16(tmp_path / "ln.onnx")
    x = (np.random.default_rng(0).standard_normal((4, 64)) * 800).astype(np.float16)
    real = _ort_cpu(path, {"x": x})
    assert np.isinf(real["v"]).all() and np.isfinite(real["y"]).all()  # the variance output itself saturates
    emulated = _outputs(path, "ort-cpu", {"x": x}, engine)
    assert emulated["y"].astype(np.float16).tobytes() == real["y"].tobytes()
    assert emulated["v"].astype(np.float16).tobytes() == real["v"].tobytes()
    plain = _outputs(path, None, {"x": x}, engine)
    assert np.isinf(plain["v"]).all() and (plain["y"] == 0).all()


@pytest.mark.parametrize("ops, overflows", [(["Transpose"], False), (["Relu", "Transpose"], True),
                                            (["Transpose", "Concat"], True), (["Max"], False)],
                         ids=["isolated-transpose", "relu-transpose", "transpose-concat", "isolated-max"])
def test_float16_kernels_side_by_side_round_what_passes_between(ops, overflows, tmp_path):
    """One float16-capable op between float32 ones is run in float32 too (isolated); two in a row keep float16
    between them, and 100·x = 100,000 is inf there: as onnxruntime CPU computes it, measured here. (Relu at opset
    18 is inlined as Max, a float16 kernel: with Transpose beside it, the pair rounds.)"""
    path = _between(tmp_path / "m.onnx", ops)
    x = np.full((2, 2), 1000, np.float16)
    real = _ort_cpu(path, {"x": x})["y"]
    assert bool(np.isinf(real).any()) == overflows
    emulated = _outputs(path, "ort-cpu", {"x": x}, "numpy")["y"]
    assert emulated.astype(np.float16).tobytes() == real.tobytes()
