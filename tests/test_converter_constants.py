"""What the fp16 converters do with a Constant node a kept node reads, and with a kept Cast — read off the real
converters (onnxruntime 1.32.0's transformers/float16.py convert_float_to_float16 and onnx_model.py's
OnnxModel.convert_float_to_float16; onnxconverter-common 1.16.0's float16.py convert_float_to_float16,
process_tensor_in_node and insert_cast16_after_node), checked against them where they install, and precaudit's
model of them (converters/base.py reads_converted, the traced run, keep-list) checked against the same numbers.

- A Constant node read by a blocked node is converted unless it is blocked itself: its value is clamped into the
  float16 range (65504 / 5.96e-8 onnxruntime, 1e4 / 1e-7 onnxconverter-common) and cast back to float32 before the
  reader. Blocked too: onnxruntime's OnnxModel leaves it float32; onnxconverter-common casts its output to float16
  all the same (1e8 is inf).
- A blocked Cast(to=float32) keeps to=float32, and what a reader outside the block list reads is cast to float16:
  an int32 accumulator of 1e5 is inf there unless the reader is blocked too.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from fixtures.onnx_builders import save
from precaudit.cli import main
from precaudit.converters import converter_named
from tests.helpers import run_json

VALUES = np.array([1e8, 1e-9, 0.3, -1e8], np.float32)
F16_03 = float(np.float16(0.3))
# what the node 'keep' reads, by converter and by whether the Constant node is blocked too (the real converters')
READ = {
    ("onnxruntime", False): [65504.0, float(np.float16(5.96e-8)), F16_03, -65504.0],
    ("onnxruntime", True): VALUES.tolist(),
    ("onnxconverter-common", False): [1e4, float(np.float16(1e-7)), F16_03, -1e4],
    ("onnxconverter-common", True): [np.inf, 0.0, F16_03, -np.inf],
}
CASES = sorted(READ)


def _constant_model(name: str) -> onnx.ModelProto:
    """x * c in the node 'keep', c a Constant node (named `name`, '' for none) holding VALUES."""
    nodes = [h.make_node("Constant", [], ["c"], name=name, value=numpy_helper.from_array(VALUES)),
             h.make_node("Mul", ["x", "c"], ["y"], name="keep"), h.make_node("Relu", ["y"], ["z"], name="relu")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [4])],
                         [h.make_tensor_value_info("z", T.FLOAT, [4])])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def _convert(m: onnx.ModelProto, converter: str, blocked: list[str]) -> onnx.ModelProto:
    """The real converter as precaudit's snippets call it (onnxruntime: OnnxModel, which removes Cast pairs)."""
    m = copy.deepcopy(m)
    if converter == "onnxruntime":
        from onnxruntime.transformers.onnx_model import OnnxModel

        wrapped = OnnxModel(m)
        wrapped.convert_float_to_float16(keep_io_types=True, node_block_list=blocked)
        wrapped.topological_sort()  # (as save_model_to_file does: the Casts it adds come last)
        return wrapped.model
    from onnxconverter_common import float16

    return float16.convert_float_to_float16(m, keep_io_types=True, node_block_list=blocked)


def _read_by(m: onnx.ModelProto, node: str, index: int, feeds: dict) -> np.ndarray:
    """What a node of the converted model reads at input `index`, by the ONNX reference evaluator (no runtime
    fuses its Casts away)."""
    from onnx.reference import ReferenceEvaluator

    name = next(n for n in m.graph.node if n.name == node).input[index]
    with np.errstate(over="ignore"):
        return np.asarray(ReferenceEvaluator(m).run([name], feeds)[0], np.float32)


@pytest.mark.requires("onnxruntime", "onnxconverter_common")
@pytest.mark.parametrize("const_name", ["", "cst"])
@pytest.mark.parametrize("converter,const_blocked", CASES)
def test_real_converters_convert_a_constant_a_blocked_node_reads(converter, const_blocked, const_name):
    m = _constant_model(const_name)
    if const_name == "":  # the name precaudit gives it, and its snippet writes into the file first
        m.graph.node[0].name = "Constant_c" if const_blocked else ""
    blocked = ["keep", m.graph.node[0].name] if const_blocked else ["keep"]
    out = _convert(m, converter, blocked)
    constant = out.graph.node[[n.op_type for n in out.graph.node].index("Constant")]
    stored = constant.attribute[0].t.data_type
    assert stored == (T.FLOAT if const_blocked else T.FLOAT16)
    read = _read_by(out, "keep", 1, {"x": np.ones(4, np.float32)})
    assert read.dtype == np.float32 and read.tolist() == READ[(converter, const_blocked)]


@pytest.mark.parametrize("converter,const_blocked", CASES)
def test_the_converter_model_reads_the_constant_as_the_real_one(converter, const_blocked):
    """converters/base.py: reads_converted and the clamp give the numbers the real converter's model reads."""
    model = converter_named(converter)
    converted, clamped = model.reads_converted(False, const_blocked, [True], True)
    clamp = model.clamps["fp16"]
    value = clamp.array(VALUES) if clamped else VALUES
    with np.errstate(over="ignore"):
        read = value.astype(np.float16).astype(np.float32) if converted else value
    assert read.tolist() == READ[(converter, const_blocked)]
    assert model.keeps_constant_nodes() == (converter == "onnxruntime")


# --- a kept Cast ------------------------------------------------------------------------------------------------

ACC = np.array([100000, 1000, -70000], np.int32)  # an int32 accumulator: 1e5 is beyond float16


def _cast_model() -> onnx.ModelProto:
    """An integer accumulator cast to float32 ('acc_cast') and rescaled ('scale'), as a dynamic quantizer writes."""
    nodes = [h.make_node("Cast", ["acc"], ["f"], name="acc_cast", to=T.FLOAT),
             h.make_node("Mul", ["f", "s"], ["y"], name="scale")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("acc", T.INT32, [3])],
                         [h.make_tensor_value_info("y", T.FLOAT, [3])],
                         [numpy_helper.from_array(np.array([0.001], np.float32), "s")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.requires("onnxruntime", "onnxconverter_common")
@pytest.mark.parametrize("converter", ["onnxruntime", "onnxconverter-common"])
def test_real_converters_keep_a_blocked_cast_float32_and_cast_its_output_down(converter):
    from onnx.reference import ReferenceEvaluator

    out = _convert(_cast_model(), converter, ["acc_cast"])
    casts = {n.name: n.attribute[0].i for n in out.graph.node if n.op_type == "Cast"}
    if converter == "onnxconverter-common":  # the kept Cast, then insert_cast16_after_node's
        assert casts == {"acc_cast": T.FLOAT, "acc_cast_output_cast0": T.FLOAT16, "scale_cast_to_y": T.FLOAT}
    else:  # OnnxModel folds the kept Cast and the Cast to float16 after it into one
        assert casts == {"f_cast_to_fp16_node": T.FLOAT16, "graph_output_cast0": T.FLOAT}
    with np.errstate(over="ignore"):
        assert _read_by(out, "scale", 0, {"acc": ACC}).tolist() == [np.inf, 1000.0, -np.inf]
        both = _convert(_cast_model(), converter, ["acc_cast", "scale"])  # the reader kept too: float32 all along
        y = np.asarray(ReferenceEvaluator(both).run(None, {"acc": ACC})[0], np.float32)
    assert _read_by(both, "scale", 0, {"acc": ACC}).tolist() == [100000.0, 1000.0, -70000.0]
    assert np.allclose(y, [100.0, 1.0, -70.0], rtol=1e-3)


@pytest.mark.parametrize("kept,fires", [("acc_cast", True), ("acc_cast,scale", False)])
def test_a_kept_cast_still_overflows_where_its_reader_is_not_kept(kept, fires, tmp_path):
    """Traced, --converter onnxruntime: the accumulator overflows at the Cast to float16 the converter puts after
    the kept Cast, so PA901 stays (saying the Cast is kept and cast back for 'scale'); with 'scale' kept, quiet."""
    path = save(_cast_model(), tmp_path / "acc.onnx")
    np.savez(tmp_path / "acc.npz", acc=ACC)
    _, report = run_json([path], "--trace", "--inputs", str(tmp_path / "acc.npz"), "--converter", "onnxruntime",
                         "--keep-fp32", kept, "--select", "PA901", out_dir=tmp_path)
    found = [(r["rule_id"], r["node_name"]) for r in report["results"]]
    assert found == ([("PA901", "acc_cast")] if fires else [])
    if fires:
        assert report["results"][0]["values"]["compute_reason"] == (
            "made by 'acc_cast', kept in float32 by --keep-fp32 acc_cast; the converter casts its output to float16 "
            "for 'scale' (Mul), which it converts")


# --- a BatchNormalization whose statistics are Constant nodes (paddle2onnx) -----------------------------------

VAR = 9.79e7  # PP-OCRv4 det's BatchNormalization.1: a running variance beyond float16


def _bn_model(path: Path) -> tuple[Path, Path]:
    """x → BatchNormalization 'bn' (scale, bias, mean, var in unnamed Constant nodes; channel 0's variance 9.79e7,
    its scale sqrt of it: the output is about x) → Sigmoid; and its inputs."""
    stats = {"scale": [VAR ** 0.5, 1.0], "bias": [0.0, 0.0], "mean": [0.0, 0.0], "var": [VAR, 1.0]}
    nodes = [h.make_node("Constant", [], [k], value=numpy_helper.from_array(np.array(v, np.float32)))
             for k, v in stats.items()]
    nodes += [h.make_node("BatchNormalization", ["x", *stats], ["n"], name="bn"),
              h.make_node("Sigmoid", ["n"], ["y"], name="sig")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 4])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 2, 4, 4])])
    save(h.make_model(graph, opset_imports=[h.make_opsetid("", 15)]), path)
    x = np.random.default_rng(0).normal(size=(1, 2, 4, 4)).astype(np.float32)
    np.savez(path.with_suffix(".npz"), x=x)
    return path, path.with_suffix(".npz")


CONSTANTS = ["Constant_scale", "Constant_bias", "Constant_mean", "Constant_var"]


@pytest.mark.parametrize("kept,finding", [
    ("bn", ("PA911", "sig", "Constant_var")),  # the variance is clamped to 65504 all the same: output off by ~0.5
    ("bn," + ",".join(CONSTANTS), None),  # its Constant nodes kept too: float32, as the real converter leaves it
])
def test_traced_keep_of_a_node_reading_constant_nodes(kept, finding, tmp_path):
    path, inputs = _bn_model(tmp_path / "bn.onnx")
    _, report = run_json([path], "--trace", "--inputs", str(inputs), "--converter", "onnxruntime",
                         "--keep-fp32", kept, out_dir=tmp_path)
    found = [(r["rule_id"], r["node_name"], r["values"].get("cause_node")) for r in report["results"]]
    assert found == ([finding] if finding else [])
    if finding:
        values = report["results"][0]["values"]
        assert values["cause_overflow_fraction"] == 0.5 and values["cause_nonfinite_fraction"] == 0.0
        assert values["rel_error"] > 0.3


@pytest.mark.requires("onnxruntime")
@pytest.mark.parametrize("with_constants,bad", [(False, True), (True, False)])
def test_the_real_converter_agrees_on_the_kept_batchnorm(with_constants, bad, tmp_path):
    """OnnxModel with node_block_list=['bn']: the output is off as the traced run says; with the Constants: not."""
    import onnxruntime as ort

    path, inputs = _bn_model(tmp_path / "bn.onnx")
    m = onnx.load(str(path))
    for node, name in zip(m.graph.node, CONSTANTS):
        node.name = name  # as precaudit's snippet names them
    out = _convert(m, "onnxruntime", ["bn", *CONSTANTS] if with_constants else ["bn"])
    x = np.load(inputs)["x"]
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    error = float(np.abs(got.astype(np.float64) - ref).max())
    assert (error > 0.3) if bad else (error < 1e-2)


@pytest.mark.requires("onnxruntime")
def test_keep_list_keeps_the_constant_nodes_a_kept_node_reads(tmp_path):
    """keep-list --for onnxruntime --trace: BatchNormalization 'bn' and the four Constant nodes it reads (named in
    the snippet as precaudit names them); verified, and the printed snippet, run, writes a model within tolerance."""
    path, inputs = _bn_model(tmp_path / "bn.onnx")
    out = tmp_path / "keep.json"
    code = main(["keep-list", str(path), "--for", "onnxruntime", "--trace", "--inputs", str(inputs),
                 "--tolerance", "0.01", "--format", "json", "-o", str(out)])
    keep = json.loads(out.read_text())
    assert code == 0 and keep["verification"]["verified"]
    assert [n["name"] for n in keep["nodes"]] == [*CONSTANTS, "bn"]
    assert keep["unnamed_nodes"]
    check = keep["snippet_check"]
    assert check["ran"] and check["loads"] and check["finite"] and check["error"] < 1e-2
