"""The onnxruntime engine against the numpy kernels: same values measured, same findings, on real exporter graphs.

Segments are forced small here so that values cross from one onnxruntime session to the next, and from
onnxruntime to numpy, many times in one model.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from fixtures.onnx_builders import chain_model, save  # noqa: E402
from fixtures.torch_exports import HF_CASES, ExportCase, _LastHiddenState, export, same  # noqa: E402
from precaudit.analysis.compute_dtype import DtypeResolver  # noqa: E402
from precaudit.dtypes import FORMATS  # noqa: E402
from precaudit.frontends.onnx import load_onnx  # noqa: E402
from precaudit.trace import ort_engine, ort_weights  # noqa: E402
from precaudit.trace.emulator import Emulator  # noqa: E402
from precaudit.trace.inputs import synthesize_inputs  # noqa: E402
from precaudit.trace.measure import attach_probes  # noqa: E402
from tests.helpers import assert_traced_alike, run_json  # noqa: E402

MODELS = [("hf_bert", "ts14", "fp32", "fp16"), ("hf_llama", "dynamo18", "fp32", "bf16"),
          ("hf_gpt2", "dynamo18", "fp16", "fp16"), ("hf_t5", "ts17", "fp16", "fp16")]


def _run(graph, target: str, engine: str, *samples: dict) -> Emulator:
    resolver = DtypeResolver(graph, FORMATS[target])
    emulator = Emulator(graph, resolver, engine=engine)
    attach_probes(graph, resolver, emulator)
    for feeds in samples:
        emulator.run(feeds)
    return emulator


@pytest.fixture
def small_segments(monkeypatch):
    monkeypatch.setattr(ort_engine, "_FIRST_SEGMENT", 7)
    monkeypatch.setattr(ort_engine, "_MIN_SEGMENT", 5)
    monkeypatch.setattr(ort_engine, "_BUDGET", 1)


@pytest.mark.parametrize("name,exporter,stored,target", MODELS, ids=[f"{m[0]}-{m[1]}-{m[2]}-{m[3]}" for m in MODELS])
def test_onnxruntime_runs_every_node_and_measures_what_numpy_measures(name, exporter, stored, target, tmp_path,
                                                                     small_segments):
    case = next(c for c in HF_CASES if c.name == name)
    graph = load_onnx(str(export(case, exporter, stored, tmp_path)))
    samples = [synthesize_inputs(graph, {}, seed=seed) for seed in (0, 1)]  # stats merge over samples alike
    fast = _run(graph, target, "onnxruntime", *samples)
    slow = _run(graph, target, "numpy", *samples)
    assert fast.ran_on == {"onnxruntime": len(fast.plan.steps), "numpy": 0}
    segments = [s for s in fast._ort._segments.values() if s is not None]
    assert len(segments) > 5  # values really crossed sessions
    assert fast.stats.keys() == slow.stats.keys() and len(fast.stats) > 20
    for vid, want in slow.stats.items():
        got = fast.stats[vid]
        assert (got.elements, got.overflow, got.nonfinite, got.ref_nonfinite) == \
               (want.elements, want.overflow, want.nonfinite, want.ref_nonfinite)
        assert got.absmax == pytest.approx(want.absmax, rel=1e-4, abs=1e-6)
        # two emulations differ by where their float32 sums round: errors of the same size, not the same bits;
        # and no smaller: a rounding Cast that onnxruntime optimized away would leave float32's tiny error
        assert got.max_error <= 4 * want.max_error + 1e-3 * want.absmax + 1e-7
        if want.max_error > 1e-5 * want.absmax:
            assert got.max_error >= want.max_error / 4
        assert abs(got.underflow - want.underflow) <= max(2, 0.01 * want.elements)


def _square_chain(tmp_path):
    """x * 300, squared, plus 1, then the graph output (an Identity): the square overflows in float16."""
    steps = [("Mul", ["x", "k"], "act"), ("Mul", ["act", "act"], "sq"), ("Add", ["sq", "one"], "out")]
    path = save(chain_model(steps, dtype="fp32", consts={"k": 300.0, "one": 1.0}), tmp_path / "sq.onnx")
    np.savez(tmp_path / "x.npz", x=np.ones((2, 8), np.float32))
    return path


def test_the_square_overflow_is_found_by_onnxruntime_casts(tmp_path):
    path = _square_chain(tmp_path)
    graph = load_onnx(str(path))
    emulator = _run(graph, "fp16", "onnxruntime", {"x": np.ones((2, 8), np.float32)})
    assert emulator.ran_on == {"onnxruntime": 4, "numpy": 0}
    by_name = {v.name: emulator.stats[id(v)] for n in graph.nodes for v in n.outputs if id(v) in emulator.stats}
    assert by_name["sq"].nonfinite == 16 and by_name["sq"].absmax == 90000.0
    assert by_name["act"].nonfinite == 0
    _code, report = run_json([path], "--trace", "--trace-engine", "onnxruntime", "--inputs", str(tmp_path / "x.npz"),
                            "--select", "PA9", out_dir=tmp_path)
    assert {(r["rule_id"], r["node_name"]) for r in report["results"]} == {("PA901", "sq"), ("PA906", "sq")}


def test_fp8_runs_on_numpy_kernels(tmp_path):
    """onnxruntime's Cast saturates fp8 by default: precaudit keeps fp8 on its own kernels (ml_dtypes)."""
    path = _square_chain(tmp_path)
    graph = load_onnx(str(path))
    emulator = _run(graph, "fp8-e4m3", "auto", {"x": np.ones((2, 8), np.float32)})
    # the three arithmetic nodes; the final Identity only moves values, which needs no rounding at all
    assert emulator.ran_on == {"onnxruntime": 1, "numpy": 3}
    act = next(emulator.stats[id(v)] for n in graph.nodes for v in n.outputs if v.name == "act")
    assert act.overflow == 0 and act.absmax == 300.0  # 300 fits e4m3 (max 448); 90000 does not
    sq = next(emulator.stats[id(v)] for n in graph.nodes for v in n.outputs if v.name == "sq")
    assert sq.overflow == 16 and not math.isinf(sq.absmax)


def test_unknown_trace_engine_is_one_line(tmp_path, capsys):
    from precaudit.cli import main

    path = _square_chain(tmp_path)
    assert main([str(path), "--trace", "--trace-engine", "gpu"]) == 2
    assert capsys.readouterr().err == "precaudit: --trace-engine: must be one of auto, onnxruntime, numpy, got 'gpu'\n"


def test_a_node_onnxruntime_refuses_runs_on_numpy_alone(tmp_path, monkeypatch, small_segments):
    """Whatever onnxruntime cannot build (an op it lacks, a type it rejects) falls back for that node only."""
    built = ort_engine.OrtSegments._build_range
    tried = []

    def refuse_node_3(self, start, end, emu, ref):
        tried.append((start, end))
        if start <= 3 < end:
            raise RuntimeError("onnxruntime: not implemented")
        return built(self, start, end, emu, ref)

    monkeypatch.setattr(ort_engine.OrtSegments, "_build_range", refuse_node_3)
    case = next(c for c in HF_CASES if c.name == "hf_bert")
    graph = load_onnx(str(export(case, "ts14", "fp32", tmp_path)))
    feeds = synthesize_inputs(graph, {}, seed=0)
    mixed = _run(graph, "fp16", "onnxruntime", feeds)
    # 0-7 is refused and halved: 0-3 runs; from 3 on, halved until node 3 stands alone and falls back to numpy
    assert tried[:6] == [(0, 7), (0, 3), (3, 8), (3, 5), (3, 4), (4, 9)]
    assert mixed.ran_on == {"onnxruntime": len(mixed.plan.steps) - 1, "numpy": 1}
    slow = _run(graph, "fp16", "numpy", feeds)
    for vid, want in slow.stats.items():
        assert mixed.stats[vid].absmax == pytest.approx(want.absmax, rel=1e-4, abs=1e-6)


def test_omitted_optional_outputs_in_one_segment(tmp_path):
    """Two LayerNorms that skip their Mean output (an empty name between two outputs) share one session."""
    from onnx import helper as h

    from fixtures.onnx_builders import const, model, tensor

    nodes = [h.make_node("LayerNormalization", ["x", "g"], ["a", "", "a_istd"], name="ln1", epsilon=1e-5),
             h.make_node("Mul", ["a", "k"], ["b"], name="scale"),
             h.make_node("LayerNormalization", ["b", "g"], ["y", "", "y_istd"], name="ln2", epsilon=1e-5)]
    m = model(nodes, [tensor("x", "fp32")], [tensor("y", "fp32")],
              [const("g", np.ones(8), "fp32"), const("k", 300.0, "fp32")])
    graph = load_onnx(str(save(m, tmp_path / "ln.onnx")))
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)}
    fast = _run(graph, "fp16", "onnxruntime", feeds)
    slow = _run(graph, "fp16", "numpy", feeds)
    assert fast.ran_on == {"onnxruntime": 3, "numpy": 0}
    for vid, want in slow.stats.items():
        assert fast.stats[vid].absmax == pytest.approx(want.absmax, rel=1e-5)


def _vision(kind: str):
    import transformers as tf

    if kind == "vit":
        return tf.ViTModel(tf.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                        intermediate_size=64, image_size=32, patch_size=8))
    if kind == "resnet":
        return tf.ResNetModel(tf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1]))
    return tf.ConvNextModel(tf.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2))


@pytest.mark.parametrize("kind", ["vit", "resnet", "convnext"])
@pytest.mark.parametrize("half", [False, True], ids=["fp32", "fp16"])
@pytest.mark.requires("transformers")
def test_vision_models_trace_alike_on_both_engines(kind, half, tmp_path):
    """Conv, BatchNorm, and ConvNeXt's LayerNorm after a permute: every node on onnxruntime, same findings."""
    case = ExportCase(kind, lambda: _LastHiddenState(_vision(kind), "pixel_values"), same(),
                      example=lambda: (torch.randn(1, 3, 32, 32),))
    assert_traced_alike(export(case, "ts17", "fp16" if half else "fp32", tmp_path), tmp_path)


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_onnxruntime_casts_round_as_ml_dtypes_bit_for_bit(fmt):
    """The onnxruntime engine rounds only through Cast pairs: they must round exactly as the numpy engine does,
    ties to even, subnormals, overflow to inf and NaN included (every bfloat16 tie pattern, 1M random floats)."""
    import onnxruntime as ort
    from onnx import TensorProto as T
    from onnx import helper as h

    from precaudit.trace.ort_nodes import round_trip
    from precaudit.trace.rounding import round_into

    narrow = {"fp16": T.FLOAT16, "bf16": T.BFLOAT16}[fmt]
    graph = h.make_graph(round_trip("x", "y", narrow), "round", [h.make_tensor_value_info("x", T.FLOAT, None)],
                         [h.make_tensor_value_info("y", T.FLOAT, None)])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    ties = (np.arange(1 << 16, dtype=np.uint32) << 16 | 0x8000).view(np.float32)  # exactly halfway for bf16
    x = np.concatenate([rng.integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32), ties,
                        np.array([65504, 65519.99, 65520, 1e-45, 2**-24, 3 * 2**-25, -0.0, np.inf, -np.inf, np.nan],
                                 np.float32)])
    got = session.run(None, {"x": x})[0]
    with np.errstate(all="ignore"):
        want = np.asarray(round_into(x, FORMATS[fmt]))
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    assert np.array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))


def _weighted_chain(tmp_path):
    """Two float32 MatMuls with 256x256 weights (over the 64 KB onnxruntime embeds: session inputs) and a GELU-ish
    tail, for runs of several samples."""
    from onnx import helper as h

    from fixtures.onnx_builders import const, model, tensor

    rng = np.random.default_rng(1)
    nodes = [h.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"), h.make_node("Tanh", ["a"], ["t"], name="tanh"),
             h.make_node("MatMul", ["t", "w2"], ["b"], name="mm2"), h.make_node("Mul", ["b", "b"], ["y"], name="sq")]
    inits = [const("w1", rng.standard_normal((256, 256)) * 0.1), const("w2", rng.standard_normal((256, 256)) * 0.1)]
    return save(model(nodes, [tensor("x", "fp32", (4, 256))], [tensor("y", "fp32", (4, 256))], inits), tmp_path / "w.onnx")


def test_weights_are_rounded_once_when_a_sample_follows(tmp_path, monkeypatch):
    """With a next sample to come, a float32 weight held in float16 is rounded outside the session, once, and kept
    with the weight; the last sample of a run, and a one-sample run, round it in the session. Same numbers as numpy."""
    graph = load_onnx(str(_weighted_chain(tmp_path)))
    rounds = []
    real = ort_weights.WeightFeeder.round
    monkeypatch.setattr(ort_weights.WeightFeeder, "round", lambda self, data, narrow: rounds.append(data.shape)
                        or real(self, data, narrow))
    samples = [{"x": np.random.default_rng(seed).standard_normal((4, 256)).astype(np.float32)} for seed in range(3)]
    fast = _run(graph, "fp16", "onnxruntime", *samples)
    assert rounds == [(256, 256), (256, 256)]  # the first sample; the next two read the kept copies
    segment = next(s for s in fast._ort._segments.values() if s is not None)
    assert [name for name, _, _, _ in segment.rounded] == ["emu::w1", "emu::w2"] and segment.held is not None
    slow = _run(graph, "fp16", "numpy", *samples)
    for vid, want in slow.stats.items():
        got = fast.stats[vid]
        assert (got.elements, got.overflow, got.nonfinite) == (want.elements, want.overflow, want.nonfinite)
        assert got.absmax == pytest.approx(want.absmax, rel=1e-6)
        assert got.max_error == pytest.approx(want.max_error, rel=1e-3, abs=1e-7)
    rounds.clear()
    resolver = DtypeResolver(graph, FORMATS["fp16"])
    one = Emulator(graph, resolver, engine="onnxruntime")
    one.run(samples[0], final=True)
    assert rounds == [] and one.held_bytes == 0  # a one-sample run rounds inside the session, keeps nothing


def test_a_measurement_error_on_the_second_thread_is_raised_by_the_run(tmp_path, monkeypatch):
    """Values are measured on a second thread while the next segment runs: what goes wrong there is raised by run(),
    after which no measurement is still going on."""
    from precaudit.errors import InputError

    graph = load_onnx(str(_weighted_chain(tmp_path)))
    resolver = DtypeResolver(graph, FORMATS["fp16"])
    emulator = Emulator(graph, resolver, engine="onnxruntime")
    measured, real = [], Emulator.measure

    def measure(self, step, *args):
        if step.node.name == "tanh":
            raise InputError(graph.path, "traced mode: node 'tanh' took another path")
        measured.append(step.node.name)
        return real(self, step, *args)

    monkeypatch.setattr(Emulator, "measure", measure)
    monkeypatch.setattr(ort_engine, "_FIRST_SEGMENT", 2)  # mm1 and tanh, then the rest: two segments
    with pytest.raises(InputError, match="took another path"):
        emulator.run({"x": np.ones((4, 256), np.float32)})
    assert emulator._ort._pending is None and measured == ["mm1"]
