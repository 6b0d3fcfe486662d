"""Traced mode under --converter: both engines hold the constants a converter converts as it leaves them.

onnxconverter-common (and Olive) clamp the float32 constants they convert into [1e-7, 1e4], onnxruntime's converter
into [5.96e-8, 65504], modelopt clips initializers only; a constant only blocked nodes read is not converted at all
(precaudit/converters/ says which, per converter). The emulated run must read those numbers, not the stored ones
rounded plainly: an eps of 1e-12 is 1.19e-7 under onnxconverter-common, not 0, and a -1e9 mask fill is -1e4, not -inf.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

pytest.importorskip("onnxruntime")

from fixtures.onnx_builders import chain_model, const, decomposed_layernorm, in_if_branch, model, save, tensor
from precaudit.analysis.compute_dtype import DtypeResolver
from precaudit.dtypes import FORMATS
from precaudit.frontends.onnx import load_onnx
from precaudit.trace.emulator import Emulator
from precaudit.trace.measure import attach_probes
from tests.helpers import run_json

ENGINES = ("numpy", "onnxruntime")
FP16_1E7 = float(np.float16(1e-7))  # 1.1920929e-07: onnxconverter-common's 1e-7, rounded
SUBNORMAL = float(np.float16(5.96e-8))  # 5.9604645e-08: onnxruntime's and modelopt's floor, the smallest subnormal


def _emulate(path, engine: str, converter: str, feeds: dict, watch: tuple[str, ...] = (), keep=(),
             samples: int = 1) -> tuple:
    """Run the sample `samples` times (weights are kept between samples, rounded outside onnxruntime's session; a
    last sample rounds them inside); per watched node, (its emulated inputs, its emulated outputs) in the last run."""
    graph = load_onnx(str(path))
    resolver = DtypeResolver(graph, FORMATS["fp16"], list(keep), converter)
    emulator = Emulator(graph, resolver, engine=engine)
    attach_probes(graph, resolver, emulator)
    seen = {}
    for node in graph.nodes:
        if node.name in watch:
            def hook(ref_args, emu_args, ref_outs, emu_outs, name=node.name):
                seen[name] = ([None if a is None else np.array(a) for a in emu_args], [np.array(o) for o in emu_outs])
            emulator.hooks.setdefault(id(node), []).append(hook)
    for i in range(samples):
        emulator.run(feeds, final=i == samples - 1)
    return emulator, graph, seen


def _stats(emulator, graph, name: str):
    return next(emulator.stats[id(v)] for n in graph.nodes for v in n.outputs if v.name == name)


def _zero_row() -> np.ndarray:
    x = np.zeros((2, 8), np.float32)
    x[1] = np.arange(8)  # row 0 is constant: variance 0, where only the eps keeps the norm finite
    return x


# --- the eps ----------------------------------------------------------------------------------------------------

EPS_READ = [  # (converter, where the eps is stored, the eps the emulated Add reads)
    ("plain", "initializer", 0.0),
    ("onnxconverter-common", "initializer", FP16_1E7),
    ("onnxconverter-common", "constant", FP16_1E7),
    ("olive", "initializer", FP16_1E7),
    ("onnxruntime", "initializer", SUBNORMAL),
    ("onnxruntime", "constant", SUBNORMAL),
    ("modelopt", "initializer", SUBNORMAL),
    ("modelopt", "constant", 0.0),  # modelopt casts a Constant node's value at run time, unclamped
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("converter,eps_at,want", EPS_READ, ids=[f"{c}-{a}" for c, a, _ in EPS_READ])
def test_the_eps_is_read_as_the_converter_stores_it(converter, eps_at, want, engine, tmp_path):
    m, _ = decomposed_layernorm(1e-12, dtype="fp32", eps_at=eps_at)
    path = save(m, tmp_path / "ln.onnx")
    emulator, graph, seen = _emulate(path, engine, converter, {"x": _zero_row()}, watch=("add_eps",))
    args, outs = seen["add_eps"]
    assert args[1].item() == np.float32(want)
    assert outs[0][0].item() == np.float32(want)  # the constant row: variance 0 + eps
    n = _stats(emulator, graph, "n")
    assert n.nonfinite == (8 if want == 0 else 0)  # 0/0 on the constant row only where the eps is 0
    assert n.ref_nonfinite == 0


@pytest.mark.parametrize("converter", ["plain", "onnxconverter-common"])
def test_traced_norm_findings_follow_the_converted_eps(converter, tmp_path):
    """Plain fp16 rounds 1e-12 to 0: the constant row is 0/0 (PA902 at the norm, PA906 at the Div). Converted by
    onnxconverter-common the eps is 1.19e-7 and the row is 0: neither fires, on either engine."""
    m, _ = decomposed_layernorm(1e-12, dtype="fp32")
    path = save(m, tmp_path / "ln.onnx")
    np.savez(tmp_path / "x.npz", x=_zero_row())
    found = {}
    for engine in ENGINES:
        _, report = run_json([path], "--dtype", "fp16", "--trace", "--trace-engine", engine, "--converter", converter,
                             "--inputs", str(tmp_path / "x.npz"), "--select", "PA9", out_dir=tmp_path)
        assert report["errors"] == []
        found[engine] = sorted((r["rule_id"], r["node_name"]) for r in report["results"])
    assert found["numpy"] == found["onnxruntime"]
    if converter == "plain":
        assert {("PA902", "add_eps"), ("PA906", "div")} <= set(found["numpy"])
    else:
        assert not [f for f in found["numpy"] if f[0] in ("PA902", "PA904", "PA906")]


# --- which readers read the converted copy ----------------------------------------------------------------------

def _two_readers(tmp_path):
    """x + eps in two nodes ('kept' and 'other'), one eps initializer of 1e-12 for both."""
    steps = [("Add", ["x", "eps"], "kept"), ("Add", ["x", "eps"], "other"), ("Add", ["kept", "other"], "sum")]
    return save(chain_model(steps, dtype="fp32", consts={"eps": 1e-12}), tmp_path / "two.onnx")


READERS = [  # converter, the eps as 'kept' (blocked) reads it, as 'other' reads it
    ("plain", 0.0, 0.0),  # no converter: every reader rounds the constant (precaudit's behaviour without one)
    ("onnxconverter-common", 1e-12, 1e-12),  # a blocked reader keeps the initializer float32 for everyone
    ("onnxruntime", SUBNORMAL, SUBNORMAL),  # one unblocked reader converts it; the blocked one reads it cast up
    ("modelopt", 1e-12, SUBNORMAL),  # a copy per precision
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("converter,kept,other", READERS, ids=[r[0] for r in READERS])
def test_an_initializer_a_blocked_node_reads(converter, kept, other, engine, tmp_path):
    path = _two_readers(tmp_path)
    x = np.zeros((2, 8), np.float32)
    _, _, seen = _emulate(path, engine, converter, {"x": x}, watch=("kept", "other"), keep=["kept"])
    assert seen["kept"][0][1].item() == np.float32(kept)
    assert seen["other"][0][1].item() == np.float32(other)


@pytest.mark.parametrize("engine", ENGINES)
def test_only_blocked_readers_leave_the_eps_float32(engine, tmp_path):
    """--keep-fp32 on the Add that reads the eps: onnxconverter-common does not convert what only blocked nodes read."""
    m, _ = decomposed_layernorm(1e-12, dtype="fp32")
    path = save(m, tmp_path / "ln.onnx")
    _, _, seen = _emulate(path, engine, "onnxconverter-common", {"x": _zero_row()}, watch=("add_eps",),
                          keep=["add_eps"])
    assert seen["add_eps"][0][1].item() == np.float32(1e-12)


# --- weights: fed to onnxruntime as inputs, clamped beside themselves ----------------------------------------------

@pytest.mark.parametrize("samples", [1, 2])
@pytest.mark.parametrize("converter,tiny,big", [("plain", 0.0, float("inf")), ("onnxconverter-common", FP16_1E7, 1e4),
                                                ("onnxruntime", SUBNORMAL, 65504.0)])
def test_a_weight_is_clamped_alike_on_both_engines(converter, tiny, big, samples, tmp_path):
    """A 129x128 float32 weight (over the 64 KB onnxruntime embeds) with one 1e-9 and one 2e5: x picks its rows."""
    rng = np.random.default_rng(0)
    w = rng.uniform(0.5, 1.0, (129, 128)).astype(np.float32)
    w[0, 0], w[1, 1] = 1e-9, 2e5
    m = model([h.make_node("MatMul", ["x", "w"], ["mm"], name="mm"), h.make_node("Identity", ["mm"], ["y"], name="out")],
              [tensor("x", "fp32", (2, 129))], [tensor("y", "fp32", (2, 128))], [const("w", w)])
    path = save(m, tmp_path / "mm.onnx")
    x = np.zeros((2, 129), np.float32)
    x[0, 0] = x[1, 1] = 1.0  # y = rows 0 and 1 of the weight, as the emulated run holds it
    rows = {}
    for engine in ENGINES:
        _, _, seen = _emulate(path, engine, converter, {"x": x}, watch=("mm",), samples=samples)
        rows[engine] = seen["mm"][1][0]
    assert np.array_equal(rows["numpy"], rows["onnxruntime"], equal_nan=True)  # (plain: 0 * inf is NaN)
    assert rows["numpy"][0, 0] == np.float32(tiny) and rows["numpy"][1, 1] == np.float32(big)
    assert np.array_equal(rows["numpy"][0, 2:], w[0, 2:].astype(np.float16).astype(np.float32))


def test_an_eps_inside_an_if_body_is_clamped(tmp_path):
    """Control flow runs on onnxruntime: a body's initializer is converted like any other."""
    m, _ = decomposed_layernorm(1e-12, dtype="fp32")
    path = save(in_if_branch(m), tmp_path / "if.onnx")
    for converter, nonfinite in (("plain", 8), ("onnxconverter-common", 0)):
        emulator, graph, _ = _emulate(path, "onnxruntime", converter, {"cond": np.array(True), "x": _zero_row()})
        assert _stats(emulator, graph, "y").nonfinite == nonfinite


# --- the mask fill --------------------------------------------------------------------------------------------------

def _masked_softmax(tmp_path, fill_at: str):
    """softmax(scores + Where(mask, 0, -1e9)): a padding mask, its fill an initializer or a Constant node."""
    nodes = [h.make_node("Where", ["mask", "zero", "fill"], ["bias"], name="mask_bias"),
             h.make_node("Add", ["s", "bias"], ["masked"], name="add_mask"),
             h.make_node("Softmax", ["masked"], ["p"], name="softmax", axis=-1),
             h.make_node("Identity", ["p"], ["y"], name="output")]
    inits = [const("zero", 0.0)]
    if fill_at == "initializer":
        inits.append(const("fill", -1e9))
    else:
        nodes.insert(0, h.make_node("Constant", [], ["fill"], name="fill_const", value=const("fill_value", -1e9)))
    m = model(nodes, [tensor("s", "fp32"), h.make_tensor_value_info("mask", T.BOOL, [2, 8])], [tensor("y", "fp32")],
              inits)
    path = save(m, tmp_path / f"mask_{fill_at}.onnx")
    scores = np.tile(np.array([1, 2, 3, 4, 2e4, 2e4, 2e4, 2e4], np.float32), (2, 1))  # the padding scores 2e4
    mask = np.tile(np.array([1, 1, 1, 1, 0, 0, 0, 0], bool), (2, 1))
    return path, {"s": scores, "mask": mask}


@pytest.mark.parametrize("fill_at", ["initializer", "constant"])
def test_a_clamped_mask_fill_stops_masking(fill_at, tmp_path):
    """-1e9 is -inf in plain fp16 (the padding gets 0); onnxconverter-common clamps it to -1e4, and a padding score
    of 2e4 minus 1e4 outweighs the real ones: the traced output shows the padding taking the attention."""
    path, feeds = _masked_softmax(tmp_path, fill_at)
    for engine in ENGINES:
        _, _, seen = _emulate(path, engine, "plain", feeds, watch=("mask_bias", "softmax"))
        assert seen["mask_bias"][1][0][0, 4] == -np.inf
        assert seen["softmax"][1][0][:, 4:].max() == 0.0
        emulator, graph, seen = _emulate(path, engine, "onnxconverter-common", feeds, watch=("mask_bias", "softmax"))
        assert seen["mask_bias"][1][0][0, 4] == -1e4
        assert seen["softmax"][1][0][:, 4:] == pytest.approx(np.full((2, 4), 0.25))
        y = _stats(emulator, graph, "y")
        assert y.nonfinite == 0 and y.max_error == pytest.approx(y.absmax, rel=1e-3)  # every weight in the wrong place
    np.savez(tmp_path / "in.npz", **feeds)
    rule = tmp_path / "error.yaml"
    rule.write_text("id: ORG901\nname: output-error\nseverity: warning\nsummary: s\nsites: [traced_value]\n"
                    "condition: op == 'Identity' and rel_error > 0.5\nmessage: 'error {rel_error:.2f}'\nfix: f\n")
    for converter, fires in (("plain", False), ("onnxconverter-common", True)):
        found = {}
        for engine in ENGINES:
            _, report = run_json([path], "--dtype", "fp16", "--trace", "--trace-engine", engine, "--converter",
                                 converter, "--inputs", str(tmp_path / "in.npz"), "--rules", str(rule),
                                 "--select", "ORG901,PA215", out_dir=tmp_path)
            found[engine] = sorted((r["rule_id"], r["node_name"]) for r in report["results"])
        assert found["numpy"] == found["onnxruntime"]
        assert (("ORG901", "output") in found["numpy"]) is fires
        assert (("PA215", "mask_bias") in found["numpy"]) is fires  # the static finding says why


# --- keep-list --trace ----------------------------------------------------------------------------------------------

def test_keep_list_verification_keeps_no_weights_after_its_last_batch(tmp_path, monkeypatch):
    from precaudit.deployment import Deployment
    from precaudit.keeplist.verify import emulate

    runs = []
    real = Emulator.run

    def run(self, feeds, progress=None, final=False):
        real(self, feeds, progress, final)
        runs.append((final, self.held_bytes))

    monkeypatch.setattr(Emulator, "run", run)
    m, _ = decomposed_layernorm(1e-12, dtype="fp32")
    graph = load_onnx(str(save(m, tmp_path / "ln.onnx")))
    batches = [{"x": _zero_row()}, {"x": _zero_row() + 1}]
    result = emulate(graph, Deployment.named("fp16", "onnxconverter-common"), [], batches, "onnxruntime")
    assert [final for final, _ in runs] == [False, True] and runs[-1][1] == 0
    assert result.finite  # the clamped eps: the constant rows stay finite in the verification run too
