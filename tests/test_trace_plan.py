"""The step plan both traced-mode engines run: each node's compute spec, formats and frees, decided once."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from fixtures.onnx_builders import const, model, save, tensor
from precaudit.analysis.compute_dtype import DtypeResolver
from precaudit.dtypes import FORMATS
from precaudit.frontends.onnx import load_onnx
from precaudit.trace import plan as plan_module
from precaudit.trace.emulator import Emulator
from precaudit.trace.measure import attach_probes
from precaudit.trace.plan import Plan
from precaudit.trace.spec import ComputeSpec

FP16, FP32 = FORMATS["fp16"], FORMATS["fp32"]


def _norm_model(tmp_path, stash: int | None = None):
    """x → LayerNormalization (stash_type as given) → Transpose → Cast to float32 → Mul by a constant."""
    ln_attrs = {} if stash is None else {"stash_type": stash}
    nodes = [h.make_node("LayerNormalization", ["x", "g"], ["y"], name="ln", epsilon=1e-5, **ln_attrs),
             h.make_node("Transpose", ["y"], ["t"], name="tr", perm=[1, 0]),
             h.make_node("Cast", ["t"], ["c"], name="cast", to=T.FLOAT),
             h.make_node("Mul", ["c", "k"], ["out"], name="mul")]
    m = model(nodes, [tensor("x", "fp16")], [tensor("out", "fp32", (8, 2))],
              [const("g", np.ones(8), "fp16"), const("k", 3.0)])
    return load_onnx(str(save(m, tmp_path / f"norm_{stash}.onnx", check=False)))


def test_each_step_holds_its_spec_formats_and_frees(tmp_path):
    graph = _norm_model(tmp_path, stash=T.FLOAT16)
    plan = Plan(graph, DtypeResolver(graph, FP16))
    ln, tr, cast, mul = plan.steps
    x, y, t, c, out = graph.inputs[0], ln.node.outputs[0], tr.node.outputs[0], cast.node.outputs[0], mul.node.outputs[0]
    assert [s.node.name for s in plan.steps] == ["ln", "tr", "cast", "mul"]
    # the norm keeps its statistics in its stash_type, float16: the only spec with an accumulate format
    assert [s.spec for s in plan.steps] == [ComputeSpec(FP16, FP16), ComputeSpec(FP16), ComputeSpec(FP16),
                                            ComputeSpec(FP32)]
    assert plan.stat_rounding(ln.node)(np.array([1 / 3], np.float32)) == np.float32(np.float16(1 / 3))
    assert [s.input_formats for s in plan.steps] == [[FP16, FP16], [FP16], [FP16], [FP32, FP32]]
    assert [[fmt for _, fmt in s.outputs] for s in plan.steps] == [[FP16], [FP16], [FP32], [FP32]]
    # a Transpose of float16 numbers into float16 is not rounded again, and its sample is its input's
    assert [s.rounds for s in plan.steps] == [[FP16], [None], [FP32], [FP32]]
    assert (tr.rearranges, ln.rearranges) == (id(y), None)
    # each value is freed after its last reader; the graph's output never
    assert [s.frees for s in plan.steps] == [[id(x)], [id(y)], [id(t)], [id(c)]]
    assert plan.last_read == {id(x): 0, id(y): 1, id(t): 2, id(c): 3} and id(out) not in plan.last_read
    assert plan.graph_input_formats == {id(x): FP16}


def test_a_norm_with_float32_statistics_has_no_accumulate_format(tmp_path):
    graph = _norm_model(tmp_path)  # stash_type absent: 1, float32
    plan = Plan(graph, DtypeResolver(graph, FP16))
    assert plan.steps[0].spec == ComputeSpec(FP16)
    assert plan.stat_rounding(plan.steps[0].node)(np.array([1 / 3], np.float32)) == np.float32(1 / 3)


@pytest.mark.parametrize("engine", ["onnxruntime", "numpy"])
def test_the_spec_decided_in_one_place_drives_both_engines(tmp_path, monkeypatch, engine):
    """A runtime that keeps a LayerNorm's statistics in float16 although stash_type says float32 plugs in at
    compute_spec alone: both engines then run the norm as the stash_type=float16 model runs (on numpy), number for
    number."""
    if engine == "onnxruntime":
        pytest.importorskip("onnxruntime")
    feeds = {"x": (np.random.default_rng(0).standard_normal((2, 8)) * 100).astype(np.float16)}

    def traced(graph):
        """(nodes per engine, each value's stats by name, the emulated norm's zero rows and the reference's rows)."""
        resolver = DtypeResolver(graph, FP16)
        emulator = Emulator(graph, resolver, engine=engine)
        probes = attach_probes(graph, resolver, emulator)
        emulator.run(feeds, final=True)
        stats = {v.name: repr(vars(emulator.stats[id(v)])) for n in graph.nodes for v in n.outputs
                 if id(v) in emulator.stats}
        return emulator.ran_on, stats, [(s.zero_rows, np.concatenate(s.ref).tolist()) for _, s in probes.norms]

    stash16 = traced(_norm_model(tmp_path, stash=T.FLOAT16))
    plain = traced(_norm_model(tmp_path))
    real = plan_module.compute_spec

    def runtime_model(node, resolver):
        spec = real(node, resolver)
        return dataclasses.replace(spec, accumulate=FP16) if node.op_type == "LayerNormalization" else spec

    monkeypatch.setattr(plan_module, "compute_spec", runtime_model)
    modelled = traced(_norm_model(tmp_path))
    assert modelled[0] == stash16[0] == (
        {"onnxruntime": 3, "numpy": 1} if engine == "onnxruntime" else {"onnxruntime": 0, "numpy": 4})
    assert modelled[1:] == stash16[1:]
    assert plain[1]["y"] != modelled[1]["y"]  # float16 statistics change the norm's numbers
