"""Traced mode's memory: weights memory-mapped and read when their segment runs, held by no one afterwards.

A 7B-parameter model is traced in under 1 GB (benchmarks/trace_memory.py); here, on small models, the mechanisms:
external data is mapped (never past the end of the file) and equals what onnx reads; Value.const() keeps small
constants only; segments read at most _WEIGHT_BUDGET of weights; a tied weight is read again by each segment that
reads it; weights kept for the next sample change no number; and a child process tracing a 1 GB model stays well
under the model's size.
"""

from __future__ import annotations

import gc
import mmap
import sys
import weakref
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from precaudit.analysis.compute_dtype import DtypeResolver
from precaudit.dtypes import FORMATS
from precaudit.errors import InputError
from precaudit.frontends.onnx import load_onnx
from precaudit.frontends.onnx_data import MAP_BYTES
from precaudit.ir import CONST_CACHE_BYTES
from precaudit.trace import consts as consts_module
from precaudit.trace import ort_engine
from precaudit.trace.emulator import Emulator
from precaudit.trace.inputs import synthesize_inputs
from precaudit.trace.measure import attach_probes
from precaudit.trace.sites import _absmax_reaches
from tests.helpers import assert_traced_alike, run_cli_process

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from llama_onnx import LlamaShape, write_llama

pytest.importorskip("onnxruntime")


# ---- external data: mapped, exact, never past the file -------------------------------------------------------


def _external_model(folder: Path, arrays: dict[str, tuple[int, np.ndarray]], pad: int = 12345) -> Path:
    """A model whose graph outputs are Identity copies of initializers stored one after another (after `pad` bytes,
    so offsets are not page-aligned) in one external data file."""
    inits, nodes, outputs = [], [], []
    offset = pad
    with open(folder / "w.bin", "wb") as fh:
        fh.write(b"\x01" * pad)
        for name, (onnx_type, array) in arrays.items():
            raw = numpy_helper.from_array(array, name).raw_data
            fh.write(raw)
            tensor = T(name=name, data_type=onnx_type, dims=array.shape, data_location=T.EXTERNAL)
            for key, value in (("location", "w.bin"), ("offset", str(offset)), ("length", str(len(raw)))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            offset += len(raw)
            inits.append(tensor)
            nodes.append(h.make_node("Identity", [name], [f"{name}_out"], name=f"id_{name}"))
            outputs.append(h.make_tensor_value_info(f"{name}_out", onnx_type, array.shape))
    graph = h.make_graph(nodes, "external", [], outputs, inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    return path


def _base_mmap(array: np.ndarray) -> mmap.mmap | None:
    base = array
    while base is not None and not isinstance(base, mmap.mmap):
        base = getattr(base, "base", None) if isinstance(base, np.ndarray) else getattr(base, "obj", None)
    return base


_DTYPES = [(T.FLOAT16, np.float16), (T.FLOAT, np.float32), (T.DOUBLE, np.float64), (T.BFLOAT16, ml_dtypes.bfloat16),
           (T.FLOAT8E4M3FN, ml_dtypes.float8_e4m3fn), (T.INT8, np.int8), (T.INT64, np.int64), (T.UINT16, np.uint16),
           (T.BOOL, np.bool_)]


@pytest.mark.parametrize("onnx_type,np_type", _DTYPES, ids=[t[1].__name__ for t in _DTYPES])
def test_external_data_is_what_onnx_reads_mapped_when_large(tmp_path, onnx_type, np_type):
    rng = np.random.default_rng(0)
    itemsize = np.dtype(np_type).itemsize
    big_n = MAP_BYTES // itemsize + 3  # just over the mapping threshold, and an odd number of elements
    arrays = {}
    for name, n in (("small", 1000), ("big", big_n)):
        arrays[name] = (onnx_type, (rng.standard_normal(n).astype(np.float32) * 4).astype(np_type))
    path = _external_model(tmp_path, arrays)
    want = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}  # onnx reads the file
    graph = load_onnx(str(path))
    consts = {v.name: v for n in graph.nodes for v in n.inputs}
    for name in ("small", "big"):
        got = consts[name].const()
        assert got.dtype == want[name].dtype and got.shape == want[name].shape
        assert got.tobytes() == want[name].tobytes()  # bit for bit (NaN payloads too)
        assert not got.flags.writeable
        mapped = _base_mmap(got)
        assert (mapped is not None) == (name == "big")
        if mapped is not None:  # the mapping covers the tensor's bytes from the page boundary below, no more
            offset = 12345 + want["small"].nbytes
            assert len(mapped) == offset % mmap.ALLOCATIONGRANULARITY + got.nbytes


def test_a_tensor_that_ends_the_file_maps_and_one_byte_past_it_is_refused(tmp_path):
    data = np.arange(MAP_BYTES // 4 + 1, dtype=np.float32)
    path = _external_model(tmp_path, {"w": (T.FLOAT, data)})
    [value] = [v for n in load_onnx(str(path)).nodes for v in n.inputs]
    assert np.array_equal(value.const(), data)
    with open(tmp_path / "w.bin", "r+b") as fh:  # the file loses its last byte
        fh.truncate((tmp_path / "w.bin").stat().st_size - 1)
    [value] = [v for n in load_onnx(str(path)).nodes for v in n.inputs]
    with pytest.raises(InputError, match="fewer than offset 12345"):
        value.const()


def test_large_constants_are_read_again_small_ones_kept(tmp_path):
    big = np.ones(CONST_CACHE_BYTES // 4 + 1, np.float32)
    path = _external_model(tmp_path, {"eps": (T.FLOAT, np.full(4, 1e-5, np.float32)), "w": (T.FLOAT, big)})
    consts = {v.name: v for n in load_onnx(str(path)).nodes for v in n.inputs}
    assert consts["eps"].const() is consts["eps"].const()  # static mode reads small constants once
    first = consts["w"].const()
    assert consts["w"]._const_cache is None and consts["w"].const() is not first
    assert np.array_equal(consts["w"].const(), first)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_absmax_of_a_constant_as_max_and_min_said(dtype):
    rng = np.random.default_rng(1)
    for case in range(300):
        with np.errstate(over="ignore"):  # large values become inf in float16: cases too
            x = (rng.standard_normal(int(rng.integers(1, 40))) * 10.0 ** int(rng.integers(-8, 8))).astype(dtype)
        kind = case % 4
        if kind == 1:
            x[rng.integers(0, x.size)] = np.inf * rng.choice([-1, 1])
        elif kind == 2:
            x[rng.integers(0, x.size)] = np.nan  # max and min are NaN: no overflow said
        elif kind == 3:
            x[rng.integers(0, x.size)] = -0.0
        finite = np.abs(x[np.isfinite(x)])
        for threshold in (65520.0, 1.0, float(finite.max()) if finite.size else 1.0):
            assert _absmax_reaches(x, threshold) == (max(float(x.max()), -float(x.min())) >= threshold)


# ---- traced runs -----------------------------------------------------------------------------------------------


_SMALL = LlamaShape(2, 512, 1376, 8, 4, 1024)  # weights of ~1.4 MB: mapped, and fed to onnxruntime


def _emulator(graph, engine: str = "onnxruntime") -> Emulator:
    resolver = DtypeResolver(graph, FORMATS["fp16"])
    emulator = Emulator(graph, resolver, engine=engine)
    attach_probes(graph, resolver, emulator)
    return emulator


def _watch_weights(graph) -> list:
    """Weak references to every array a large constant's loader hands out, from now on."""
    refs = []
    for value in {id(v): v for n in graph.nodes for v in n.inputs if v is not None and v.is_const}.values():
        if (value.const_size or 0) * 2 <= CONST_CACHE_BYTES:  # (fp16) small enough for Value.const() to keep
            continue
        loader = value.const_loader

        def counted(loader=loader):
            array = loader()
            refs.append(weakref.ref(array))
            return array
        value.const_loader = counted
    return refs


@pytest.fixture
def small_weight_budget(monkeypatch):
    monkeypatch.setattr(ort_engine, "_WEIGHT_BUDGET", 3 * 2 ** 20)


def test_segments_read_at_most_their_weight_budget_and_hold_nothing_after_the_last_sample(tmp_path,
                                                                                           small_weight_budget):
    graph = load_onnx(str(write_llama(tmp_path, _SMALL, weights="random")))
    refs = _watch_weights(graph)
    emulator = _emulator(graph)
    built = []
    build = ort_engine.OrtSegments._build_range

    def recording(self, start, end, emu, ref):
        segment = build(self, start, end, emu, ref)
        built.append(segment)  # noqa: F821 - the name is deleted only after the last call
        return segment
    ort_engine.OrtSegments._build_range = recording
    try:
        emulator.run(synthesize_inputs(graph, {}, seed=0), final=True)
    finally:
        ort_engine.OrtSegments._build_range = build
    assert emulator.ran_on == {"onnxruntime": len(emulator.plan.steps), "numpy": 0}
    assert len(built) > 10
    for segment in built:
        fed = sum(emulator._ort._weight_bytes(value) for _, value in segment.weights)
        assert fed <= ort_engine._WEIGHT_BUDGET or segment.end - segment.start == 1
    del built, segment
    gc.collect()
    assert refs and not [r for r in refs if r() is not None]  # no weight outlives its segment
    assert emulator._ort._segments == {} and emulator.held_bytes == 0
    assert all(a.nbytes <= consts_module.SMALL_CONST_BYTES for pair in emulator.consts.pairs.values() for a in pair)


def test_findings_do_not_depend_on_the_weight_budget(tmp_path, monkeypatch):
    model = write_llama(tmp_path / "model", _SMALL, weights="sparse")  # zero weights: norms of rows of zeros
    found = assert_traced_alike(model, tmp_path)
    assert found
    monkeypatch.setattr(ort_engine, "_WEIGHT_BUDGET", 2 ** 20)  # about a weight per segment
    assert assert_traced_alike(model, tmp_path) == found


def _tied_model(folder: Path, vocab: int = 2048, hidden: int = 512, blocks: int = 40) -> Path:
    """Token embedding and LM head share one fp16 table (tie_word_embeddings): Gather at the start, and a
    Transpose + MatMul at the end, with `blocks` elementwise blocks between them."""
    rng = np.random.default_rng(0)
    table = (rng.standard_normal((vocab, hidden)) * 0.5).astype(np.float16)
    (folder / "w.bin").write_bytes(table.tobytes())
    tensor = T(name="embed", data_type=T.FLOAT16, dims=table.shape, data_location=T.EXTERNAL)
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "w.bin"
    nodes = [h.make_node("Gather", ["embed", "ids"], ["x0"], name="embed_tokens")]
    scale = numpy_helper.from_array(np.array(0.9, np.float16), "scale")
    for i in range(blocks):
        nodes += [h.make_node("Mul", [f"x{i}", "scale"], [f"m{i}"], name=f"scale_{i}"),
                  h.make_node("Tanh", [f"m{i}"], [f"t{i}"], name=f"tanh_{i}"),
                  h.make_node("Add", [f"t{i}", f"x{i}"], [f"x{i + 1}"], name=f"residual_{i}")]
    nodes += [h.make_node("Transpose", ["embed"], ["embed_t"], name="lm_head_t", perm=[1, 0]),
              h.make_node("MatMul", [f"x{blocks}", "embed_t"], ["logits"], name="lm_head")]
    graph = h.make_graph(nodes, "tied", [h.make_tensor_value_info("ids", T.INT64, [1, 16])],
                         [h.make_tensor_value_info("logits", T.FLOAT16, [1, 16, vocab])], [tensor, scale])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "tied.onnx"
    onnx.save(model, str(path))
    return path


@pytest.mark.slow
def test_a_tied_weight_is_read_again_by_each_segment_not_held_between(tmp_path, small_weight_budget):
    graph = load_onnx(str(_tied_model(tmp_path)))
    refs = _watch_weights(graph)
    emulator = _emulator(graph)
    seen_between = []
    run_from = ort_engine.OrtSegments.run_from

    def watching(self, i, emu, ref):
        after = run_from(self, i, emu, ref)
        gc.collect()
        seen_between.append(sum(r() is not None for r in refs))
        return after
    ort_engine.OrtSegments.run_from = watching
    try:
        emulator.run(synthesize_inputs(graph, {}, seed=0), final=True)
    finally:
        ort_engine.OrtSegments.run_from = run_from
    assert emulator.ran_on == {"onnxruntime": len(emulator.plan.steps), "numpy": 0}
    assert len(seen_between) >= 3  # the Gather and the Transpose are in different segments
    assert set(seen_between) == {0}  # between segments, no copy of the table is alive
    assert len(refs) >= 2  # it was read for each
    stats = emulator.stats
    numpy_run = _emulator(load_onnx(str(tmp_path / "tied.onnx")), engine="numpy")
    numpy_run.run(synthesize_inputs(graph, {}, seed=0), final=True)
    logits = next(v for v in graph.outputs)
    theirs = next(s for vid, s in numpy_run.stats.items() if vid in {id(v) for v in numpy_run.graph.outputs})
    assert stats[id(logits)].absmax == pytest.approx(theirs.absmax, rel=1e-5)


def test_weights_kept_for_the_next_sample_change_no_number(tmp_path, monkeypatch):
    graph = load_onnx(str(write_llama(tmp_path, _SMALL, weights="random")))
    samples = [synthesize_inputs(graph, {}, seed=seed) for seed in (0, 1, 2)]
    results = {}
    for hold in (consts_module.HOLD_BYTES, 0):
        monkeypatch.setattr(consts_module, "HOLD_BYTES", hold)
        emulator = _emulator(graph)
        refs = _watch_weights(graph)
        reads = []
        for i, feeds in enumerate(samples):
            before = len(refs)
            emulator.run(feeds, final=i == len(samples) - 1)
            reads.append(len(refs) - before)
            if i == 0:  # kept for the next sample only within the budget
                assert (emulator.held_bytes > 0) == (hold > 0)
        # within the budget, the weights are read in the first sample only; without one, in every sample
        assert reads[0] > 0 and (reads[1:] == [0, 0] if hold else reads[1] == reads[2] > 0), reads
        gc.collect()
        assert not [r for r in refs if r() is not None] and emulator.held_bytes == 0
        assert emulator._ort._segments == {}
        results[hold] = dict(emulator.stats)
    assert results[consts_module.HOLD_BYTES] == results[0]


# ---- a child process: memory against the model's size ---------------------------------------------------------


@pytest.mark.slow
def test_tracing_a_1_gb_model_takes_well_under_its_size(tmp_path):
    """Eight TinyLlama-wide layers and a 32,000-token vocabulary: 0.97 GB of fp16 weights (holes in a sparse file,
    so the test costs no disk). Before weights were read per segment, this took 5.5 GB; now about 0.5 GB."""
    shape = LlamaShape(8, 2048, 5632, 32, 4, 32000)
    model = write_llama(tmp_path / "model", shape, weights="sparse")
    weights_mb = (model.parent / "model.weights").stat().st_size / 2 ** 20
    code, _, err, peak = run_cli_process([model, "--trace", "--dim", "batch=1", "-f", "json", "-o",
                                          tmp_path / "report.json"], tmp_path, timeout=300)
    assert code in (0, 1), err
    assert peak < 0.75 * weights_mb, f"peak RSS {peak:.0f} MB for {weights_mb:.0f} MB of weights"
