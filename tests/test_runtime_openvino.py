"""--runtime openvino-cpu against OpenVINO's CPU plugin itself (the `openvino` wheel, the [openvino] extra): the
facts the model rests on hold on this machine (its inference precision, which layers the runtime model says run in
bfloat16 and write what), and traced mode's emulation gives the plugin's outputs: bit for bit where the plugin's
arithmetic is the emulation's, within a sliver of the measured bfloat16 error where only the order of a MatMul's
float32 sums differs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

ov = pytest.importorskip("openvino")

from precaudit.deployment import Deployment  # noqa: E402
from precaudit.frontends.onnx import load_onnx  # noqa: E402
from precaudit.trace import Emulator  # noqa: E402
from precaudit.trace.plan import Plan  # noqa: E402

CORE = ov.Core()
HINT = str(CORE.get_property("CPU", "INFERENCE_PRECISION_HINT"))  # "<Type: 'bfloat16'>" or "<Type: 'float32'>"
BF16_CPU = "BF16" in CORE.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
needs_bf16 = pytest.mark.skipif(not BF16_CPU, reason="this CPU has no bfloat16: the model describes CPUs that do "
                                                      "(the plugin runs float32 here)")
_TYPES = {np.float32: T.FLOAT, np.float16: T.FLOAT16}


def test_the_inference_precision_is_bfloat16_exactly_where_the_cpu_has_bfloat16():
    """The model's first fact: INFERENCE_PRECISION_HINT is bf16 on a CPU whose capabilities list BF16."""
    assert ("bfloat16" in HINT) == BF16_CPU
    assert ("float32" in HINT) == (not BF16_CPU)


def _save(path, nodes, inits, dtype, shape, outputs=("y",)):
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", _TYPES[dtype], shape)],
                         [h.make_tensor_value_info(o, _TYPES[dtype], None) for o in outputs],
                         [numpy_helper.from_array(np.asarray(v, dtype), k) for k, v in inits.items()])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=9), path)
    return path


def _openvino(path, feeds: dict, hint: str | None = None):
    """The plugin's outputs (by name) and its runtime model: per layer, the ONNX nodes fused into it, its
    runtimePrecision and outputPrecisions."""
    compiled = CORE.compile_model(CORE.read_model(str(path)), "CPU",
                                  {} if hint is None else {"INFERENCE_PRECISION_HINT": hint})
    results = compiled(feeds)
    outputs = {o.get_any_name(): np.asarray(results[o]) for o in compiled.outputs}
    layers = []
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        layers.append((info["originalLayersNames"].astype(str).split(","), info["layerType"].astype(str),
                       info["runtimePrecision"].astype(str), info["outputPrecisions"].astype(str)))
    return outputs, layers


def _emulated(path, feeds: dict, runtime: str | None = "openvino-cpu", dtype: str = "fp32") -> dict[str, np.ndarray]:
    """The graph's outputs as traced mode emulates them at this runtime (numpy engine: the kernels that read or
    write the runtime's own format run there)."""
    graph = load_onnx(str(path))
    emulator = Emulator(graph, Deployment.named(dtype, runtime=runtime).resolver(graph), engine="numpy")
    got: dict[str, np.ndarray] = {}
    for value in graph.outputs:
        index = value.producer.outputs.index(value)
        emulator.hooks.setdefault(id(value.producer), []).append(
            lambda ref_args, emu_args, ref_outs, emu_outs, i=index, name=value.name: got.__setitem__(name, emu_outs[i]))
    emulator.run(feeds, final=True)
    return got


def _layernorm_fp16(path):
    """ReduceMean → Sub → Pow 2 → ReduceMean → Add eps → Sqrt → Div, float16, the variance a graph output too."""
    nodes = [h.make_node("ReduceMean", ["x", "axes"], ["m"], name="mean"), h.make_node("Sub", ["x", "m"], ["d"], name="sub"),
             h.make_node("Pow", ["d", "two"], ["q"], name="pow"), h.make_node("ReduceMean", ["q", "axes"], ["v"], name="var"),
             h.make_node("Add", ["v", "eps"], ["ve"], name="add_eps"), h.make_node("Sqrt", ["ve"], ["s"], name="sqrt"),
             h.make_node("Div", ["d", "s"], ["y"], name="div")]
    graph = h.make_graph(nodes, "ln", [h.make_tensor_value_info("x", T.FLOAT16, [4, 64])],
                         [h.make_tensor_value_info("y", T.FLOAT16, None), h.make_tensor_value_info("v", T.FLOAT16, None)],
                         [numpy_helper.from_array(np.array(2, np.float16), "two"),
                          numpy_helper.from_array(np.array(1e-5, np.float16), "eps"),
                          numpy_helper.from_array(np.array([-1], np.int64), "axes")])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)], ir_version=9), path)
    return path


def test_a_float16_layernorm_with_large_deviations_runs_in_float32_and_emulates_bit_for_bit(tmp_path):
    """|x - mean| about 800: x² is 640,000, beyond float16. The plugin fuses the chain into an MVN at the graph's
    tail, in float32: y finite, and the variance output saturates only where it leaves the graph. The emulation at
    --runtime openvino-cpu gives both outputs bit for bit; without a runtime it predicts a float16 kernel's (inf
    variance, y all 0)."""
    path = _layernorm_fp16(tmp_path / "ln.onnx")
    x = (np.random.default_rng(0).standard_normal((4, 64)) * 800).astype(np.float16)
    real, layers = _openvino(path, {"x": x})
    assert [(kind, precision) for names, kind, precision, _ in layers if names == ["y"]] == [("MVN", "f32")]
    assert np.isinf(real["v"]).all() and np.isfinite(real["y"]).all() and float(np.abs(real["y"]).max()) == 2.705078125
    emulated = _emulated(path, {"x": x}, dtype="fp16")
    assert emulated["y"].astype(np.float16).tobytes() == real["y"].tobytes()
    assert emulated["v"].astype(np.float16).tobytes() == real["v"].tobytes()
    plain = _emulated(path, {"x": x}, runtime=None, dtype="fp16")
    assert np.isinf(plain["v"]).all() and (plain["y"] == 0).all()


def _elementwise(path, dtype):
    """Mul(x, x) → Sqrt → Sub(·, |x|) and · 0.001: exact operations (OpenVINO's Exp, a Div by a constant, a Mul
    then Add differ from numpy's in the last bit), and x² of 1000 is beyond float16."""
    nodes = [h.make_node("Mul", ["x", "x"], ["q"], name="square"), h.make_node("Sqrt", ["q"], ["s"], name="sqrt"),
             h.make_node("Abs", ["x"], ["a"], name="abs"), h.make_node("Sub", ["s", "a"], ["y"], name="sub"),
             h.make_node("Mul", ["s", "milli"], ["z"], name="scale")]
    return _save(path, nodes, {"milli": 0.001}, dtype, [16, 64], outputs=("y", "z"))


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
def test_an_elementwise_chain_runs_as_with_the_float32_hint_and_emulates_bit_for_bit(dtype, tmp_path):
    """All tail: the bf16 hint gives the f32 hint's outputs bit for bit, and x² of ±1000 never overflows, float16
    graph or not; the emulation gives the same bits."""
    path = _elementwise(tmp_path / "ew.onnx", dtype)
    x = (np.random.default_rng(1).standard_normal((16, 64)) * 1000).astype(dtype)
    real, layers = _openvino(path, {"x": x})
    as_f32, _ = _openvino(path, {"x": x}, hint="f32")
    assert all(real[k].tobytes() == as_f32[k].tobytes() for k in ("y", "z"))
    assert not any("bf16" in (precision, out) for _, _, precision, out in layers)
    assert (real["y"] == 0).all() and np.isfinite(real["z"]).all()
    emulated = _emulated(path, {"x": x}, dtype="fp16" if dtype is np.float16 else "fp32")
    assert all(emulated[k].astype(dtype).tobytes() == real[k].tobytes() for k in ("y", "z"))


def _matmul(path, dtype, rng):
    w = rng.standard_normal((256, 64)).astype(dtype)
    return _save(path, [h.make_node("MatMul", ["x", "w"], ["y"], name="mm")], {"w": w}, dtype, [64, 256]), w


@needs_bf16
def test_a_float32_matmul_runs_in_bfloat16_and_emulates_within_the_order_of_its_sums(tmp_path):
    """A FullyConnected in bf16: inputs and weights rounded to bfloat16, float32 sums, written float32 to the graph
    output. Its error against float64 is bfloat16's (2e-3 relative; the f32 hint's is 5e-7); the emulation's
    distance to it is what summing in another order gives: under 1% of that error, where plain float32 emulation is
    off by all of it."""
    rng = np.random.default_rng(0)
    path, w = _matmul(tmp_path / "mm.onnx", np.float32, rng)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    real, layers = _openvino(path, {"x": x})
    assert [(kind, precision, out) for names, kind, precision, out in layers if names == ["y"]] == \
        [("FullyConnected", "bf16", "f32")]
    exact = x.astype(np.float64) @ w.astype(np.float64)
    error = np.abs(real["y"] - exact).max()
    assert round(float(error / np.abs(exact).max()), 4) == 0.002
    emulated = _emulated(path, {"x": x})["y"]
    assert np.abs(emulated - real["y"]).max() < 0.01 * error
    plain = _emulated(path, {"x": x}, runtime=None)["y"]
    assert np.abs(plain - real["y"]).max() > 0.5 * error


@needs_bf16
def test_a_float16_matmul_writes_bfloat16_and_emulates_bit_for_bit(tmp_path):
    """In a float16 graph the FullyConnected writes bfloat16, converted to float16 at the edge: rounding twice hides
    the order of the sums, and the emulation gives the plugin's bits."""
    rng = np.random.default_rng(0)
    path, _ = _matmul(tmp_path / "mm16.onnx", np.float16, rng)
    x = rng.standard_normal((64, 256)).astype(np.float16)
    real, layers = _openvino(path, {"x": x})
    assert [(kind, precision, out) for names, kind, precision, out in layers if names == ["y"]] == \
        [("FullyConnected", "bf16", "bf16")]
    assert _emulated(path, {"x": x}, dtype="fp16")["y"].astype(np.float16).tobytes() == real["y"].tobytes()
    plain = _emulated(path, {"x": x}, runtime=None, dtype="fp16")["y"].astype(np.float16)
    assert plain.tobytes() != real["y"].tobytes()


def _probes(tmp_path):
    """Graphs whose layers show the model's facts: a fused elementwise pair before a MatMul, a MatMul before an Exp,
    a MatMul with its bias, a LayerNormalization before a MatMul."""
    rng = np.random.default_rng(2)
    w, b = rng.standard_normal((32, 32)), rng.standard_normal(32)
    mm = [h.make_node("MatMul", ["e", "w"], ["y"], name="mm")]
    return {
        "mul-exp-matmul": ([h.make_node("Mul", ["x", "c"], ["m"], name="mul"),
                            h.make_node("Exp", ["m"], ["e"], name="exp"), *mm], {"c": 0.1, "w": w}),
        "matmul-exp": ([h.make_node("MatMul", ["x", "w"], ["a"], name="mm"), h.make_node("Exp", ["a"], ["y"], name="exp")],
                       {"w": w}),
        "matmul-bias": ([h.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
                         h.make_node("Add", ["a", "b"], ["y"], name="bias")], {"w": w, "b": b}),
        "layernorm-matmul": ([h.make_node("LayerNormalization", ["x", "g", "beta"], ["e"], name="ln", axis=-1), *mm],
                             {"g": rng.standard_normal(32), "beta": rng.standard_normal(32), "w": w}),
    }


_NAMES = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}


@needs_bf16
@pytest.mark.parametrize("probe", ["mul-exp-matmul", "matmul-exp", "matmul-bias", "layernorm-matmul"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
def test_what_each_layer_runs_and_writes_in_is_what_the_model_says(probe, dtype, tmp_path):
    """Measured from the runtime model: for every layer the plugin made of the graph's nodes, the format it writes
    (outputPrecisions) is the one the emulation writes the last of those nodes' output in (the kernel's own, else
    the held one), and a layer's runtimePrecision is bf16 where the model's kernels read their inputs in bfloat16."""
    nodes, inits = _probes(tmp_path)[probe]
    path = _save(tmp_path / f"{probe}.onnx", nodes, inits, dtype, [8, 32])
    graph = load_onnx(str(path))
    plan = Plan(graph, Deployment.named("fp16" if dtype is np.float16 else "fp32", runtime="openvino-cpu")
                .resolver(graph))
    by_name = {s.node.name: s for s in plan.steps}
    by_name.update({s.node.outputs[0].name: s for s in plan.steps})  # the plugin names an output's maker after it
    measured, modelled = {}, {}
    for names, kind, precision, out in _openvino(path, {"x": np.ones((8, 32), dtype)})[1]:
        steps = [by_name[n] for n in names if n in by_name and by_name[n].node.op_type != "Constant"]
        if not steps or kind in ("Input", "Const", "Output"):
            continue
        last = steps[-1]
        if kind == "FullyConnected" and last.node.op_type == "Add":  # named after the bias it added: its MatMul too
            steps = [by_name[v.producer.name] for v in last.node.inputs if v.producer is not None] + steps
        written = last.spec.writes or last.outputs[0][1]
        measured[last.node.name] = (_NAMES[out], precision == "bf16")
        modelled[last.node.name] = (written.name, any(s.spec.reads is not None and s.spec.reads.name == "bf16"
                                                      for s in steps))
    assert measured == modelled


def _kernels(kind: str, rng):
    """Kernels whose outputs a MatMul by the identity reads (it adds no error of its own), or that end the graph."""
    eye = {"e": np.eye(32)}
    matmul = h.make_node("MatMul", ["z", "e"], ["y"], name="mm_eye")
    if kind == "layernorm":
        return [h.make_node("LayerNormalization", ["x", "g", "beta"], ["z"], name="ln", axis=-1), matmul], \
            {"g": rng.standard_normal(32), "beta": rng.standard_normal(32), **eye}
    if kind == "mul-exp":
        return [h.make_node("Mul", ["x", "c"], ["m"], name="mul"), h.make_node("Exp", ["m"], ["z"], name="exp"),
                matmul], {"c": 0.37, **eye}
    bias = [h.make_node("MatMul", ["x", "w"], ["a"], name="mm"), h.make_node("Add", ["a", "b"], ["r"], name="bias")]
    weights = {"w": rng.standard_normal((32, 32)) / 8, "b": rng.standard_normal(32)}
    if kind == "bias-relu":
        return [*bias, h.make_node("Relu", ["r"], ["z"], name="relu"), matmul], {**weights, **eye}
    if kind == "bias-exp":
        return [*bias, h.make_node("Exp", ["r"], ["y"], name="exp")], weights
    return [*bias, h.make_node("Relu", ["r"], ["y"], name="relu")], weights  # "bias-relu-out"


@needs_bf16
@pytest.mark.parametrize("kind, dtype", [(k, d) for k in ("layernorm", "mul-exp", "bias-relu")
                                         for d in (np.float32, np.float16)]
                         + [("bias-exp", np.float16), ("bias-relu-out", np.float16)],
                         ids=lambda v: v if isinstance(v, str) else np.dtype(v).name)
def test_what_passes_between_kernels_emulates_bit_for_bit(kind, dtype, tmp_path):
    """Outside the tail: a LayerNorm reads its input rounded to bfloat16, keeps float32 statistics and writes its
    normalized value in bfloat16 before the scale and shift; a Mul and an Exp fused into one kernel keep what passes
    between them in float32 and write bfloat16; a MatMul adds its bias and applies the Relu after it to its float32
    sums and writes bfloat16 before the next MatMul (one Snippets MLP kernel, its bias read in float32) and before an
    Exp (oneDNN's FullyConnected, its bias read in bfloat16), float32 where the Relu ends the graph (a float16
    graph's output, rounded once). The emulation gives the plugin's bits; without the runtime it does not. (A float32
    graph's output written in float32 shows the order of the sums, which the emulation does not follow.)"""
    rng = np.random.default_rng(4)
    nodes, inits = _kernels(kind, rng)
    path = _save(tmp_path / f"{kind}.onnx", nodes, inits, dtype, [8, 32])
    x = rng.standard_normal((8, 32)).astype(dtype)
    real, _ = _openvino(path, {"x": x})
    emulated = _emulated(path, {"x": x}, dtype="fp16" if dtype is np.float16 else "fp32")["y"].astype(dtype)
    assert emulated.tobytes() == real["y"].tobytes()
    plain = _emulated(path, {"x": x}, runtime=None, dtype="fp16" if dtype is np.float16 else "fp32")["y"]
    assert plain.astype(dtype).tobytes() != real["y"].tobytes()


def test_float32_subnormals_are_kept_under_the_default_hint(tmp_path):
    """Add(x, 0) keeps 1e-40, -3e-39 and the smallest subnormal: no flush to zero."""
    path = _save(tmp_path / "add.onnx", [h.make_node("Add", ["x", "zero"], ["y"], name="add")], {"zero": 0.0},
                 np.float32, [3])
    x = np.array([1e-40, -3e-39, 1.4e-45], np.float32)
    assert _openvino(path, {"x": x})[0]["y"].tobytes() == x.tobytes()
