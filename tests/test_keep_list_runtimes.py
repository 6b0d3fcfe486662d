"""keep-list --for tensorrt, dml, webgpu, qnn, coreml: the list judged as that runtime computes, printed in what it
honours, and each snippet run as printed: the casts it writes into an ONNX graph (onnx.checker and onnxruntime CPU
load the result, and the kept nodes read float32 there, read back with onnx's own shape inference), onnxruntime's
converter on a float32 model, QNN's float-fallback list, coremltools' op_selector (it converts here; Core ML
predicts on macOS only)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto

from fixtures.keep_list_models import ffn_overflow_transformer
from fixtures.onnx_builders import decomposed_layernorm, fused_norm, save
from precaudit.cli import main
from tests.test_keep_list import SYNTHESIZED, keep_json

CHAIN = ["mean", "sub", "pow", "var", "add_eps", "sqrt", "div"]  # decomposed_layernorm's nodes, in graph order
HOSTILE = 'sub\'"\n\\x'  # a node name as a stranger's model may hold it: quotes, a newline, a backslash
FFN = ["/layers.1/ffn/wo/MatMul", "/layers.1/ffn/Add", "/layers.1.ffn_norm/LayerNormalization"]
NORMS = [f"/layers.{i}.{n}_norm/LayerNormalization" for i in range(3) for n in ("attn", "ffn")]


def _hostile_ln16(path: Path) -> Path:
    """decomposed_layernorm in float16 (eps 1e-5, a float16 subnormal; its variance overflows float16 past
    |x - mean| 256) with its Sub named as a stranger may."""
    model, _ = decomposed_layernorm(1e-5, dtype="fp16")
    for node in model.graph.node:
        node.name = HOSTILE if node.name == "sub" else node.name
    return save(model, path)


def _run_as_printed(snippet: str, folder: Path) -> subprocess.CompletedProcess:
    folder.mkdir()
    (folder / "snippet.py").write_text(snippet)
    return subprocess.run([sys.executable, "-I", "snippet.py"], cwd=folder, capture_output=True, text=True, timeout=600)


def _written(snippet: str, folder: Path, name: str) -> onnx.ModelProto:
    """The model the snippet writes, run as printed in a folder of its own; onnx.checker and onnxruntime CPU load
    it."""
    import onnxruntime as ort

    proc = _run_as_printed(snippet, folder)
    assert proc.returncode == 0, proc.stderr
    onnx.checker.check_model(str(folder / name))
    ort.InferenceSession(str(folder / name), providers=["CPUExecutionProvider"])
    return onnx.load(str(folder / name))


def _input_types(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Per node name, the element types of its inputs (onnx's shape inference, the initializers, the inputs)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.value_info, *graph.output]}
    types.update({t.name: t.data_type for t in graph.initializer})
    return {n.name: [types.get(i, 0) for i in n.input if i] for n in graph.node}


def test_tensorrt_writes_the_casts_into_a_float16_graph(tmp_path):
    """A float16 decomposed LayerNorm: TensorRT 11 computes it op by op in float16 (strongly typed), so its chain is
    listed; run as printed, the written graph casts each kept node's float16 inputs to float32, keeps the value
    passed between kept nodes float32, casts the normalized value back to float16 for the Identity that is not
    kept, and leaves the graph's inputs and outputs float16. The same model on onnxruntime CPU needs no list."""
    path = _hostile_ln16(tmp_path / "ln.onnx")
    code, keep = keep_json(tmp_path, path, "--for", "tensorrt")
    names = [CHAIN[0], HOSTILE, *CHAIN[2:]]
    assert (code, [n["name"] for n in keep["nodes"]], keep["runtime"]) == (0, names, "tensorrt@11")
    assert keep["arguments"]["casts"] == {"mean": {"inputs": [0], "outputs": {"0": "FLOAT16"}},
                                          HOSTILE: {"inputs": [0, 1], "outputs": {"0": "FLOAT16"}},
                                          "pow": {"inputs": [0, 1], "outputs": {"0": "FLOAT16"}},
                                          "var": {"inputs": [0], "outputs": {"0": "FLOAT16"}},
                                          "add_eps": {"inputs": [0, 1], "outputs": {"0": "FLOAT16"}},
                                          "sqrt": {"inputs": [0], "outputs": {"0": "FLOAT16"}},
                                          "div": {"inputs": [0, 1], "outputs": {"0": "FLOAT16"}}}
    assert keep["snippet_check"]["how"] == ("ran with the installed onnx; onnx.checker accepts its model, and each of "
                                            "the 7 listed nodes reads float32 there; no TensorRT here, so what it "
                                            "computes is emulated only")
    written = _written(keep["snippet"], tmp_path / "run", "ln.fp16.onnx")
    types = _input_types(written)
    assert all(set(types[n]) == {TensorProto.FLOAT} for n in names)
    # x, eps and the exponent are cast up once each (x is read by mean and the Sub alike); every value a kept node
    # makes is cast back down under its own name, for the Identity and the graph output
    down = {n.output[0] for n in written.graph.node if n.op_type == "Cast" and n.attribute[0].i == TensorProto.FLOAT16}
    up = {n.input[0] for n in written.graph.node if n.op_type == "Cast" and n.attribute[0].i == TensorProto.FLOAT}
    assert up == {"x", "two", "eps"} and down == {"mean", "d", "d2", "var", "ve", "std", "n"}
    assert types["out"] == [TensorProto.FLOAT16]
    assert [(v.name, v.type.tensor_type.elem_type) for v in [*written.graph.input, *written.graph.output]] == \
        [("x", TensorProto.FLOAT16), ("y", TensorProto.FLOAT16)]
    code, cpu = keep_json(tmp_path, path, "--for", "modelopt", "--runtime", "ort-cpu")
    assert (code, cpu["nodes"], cpu["runtime"]) == (SYNTHESIZED, [], "ort-cpu@1.32")


def test_tensorrt_on_a_converted_transformer_keeps_the_overflow_and_its_float16_norms(tmp_path):
    """The FFN-overflow transformer converted to float16 (onnxruntime's converter, no list): traced at TensorRT 11
    the list holds the overflowing MatMul, the residual Add and every LayerNormalization, which TensorRT computes in
    float16 (it has no stash_type; safe, the default on synthesized inputs, keeps every static finding's nodes);
    minimal, it is the FFN's three. Run as printed, the written model holds the kept nodes reading float32 and
    onnxruntime runs it finite; keep-list's own run said the same."""
    path = _float16(ffn_overflow_transformer(tmp_path / "ffn32.onnx"), tmp_path / "ffn.onnx")
    code, keep = keep_json(tmp_path, path, "--for", "tensorrt", "--trace")
    listed = [n["name"] for n in keep["nodes"]]
    assert (code, listed) == (SYNTHESIZED, [*NORMS[:3], *FFN[:2], FFN[2], *NORMS[4:]])
    check = keep["snippet_check"]
    assert (check["loads"], check["problem"], check["errors"], check["finite"]) == (True, None, [], True)
    written = _written(keep["snippet"], tmp_path / "run", "ffn.fp16.onnx")
    types = _input_types(written)
    assert all(set(types[n]) == {TensorProto.FLOAT} for n in listed)
    code, cpu = keep_json(tmp_path, path, "--for", "tensorrt", "--trace", "--policy", "minimal")
    assert [n["name"] for n in cpu["nodes"]] == FFN


def _float16(fp32: Path, path: Path) -> Path:
    """The model converted to float16 with onnxruntime's converter, no list, float16 inputs and outputs."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    onnx.save(convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=False), str(path))
    return path


def test_unnamed_nodes_are_named_by_the_snippet_before_the_casts(tmp_path):
    """The converted transformer with its MatMuls and Adds unnamed: the list names them as precaudit does (op type
    _ first output), and the printed snippet names them so before it casts; run as printed, exactly those nodes read
    float32."""
    path = _float16(ffn_overflow_transformer(tmp_path / "ffn32.onnx", names=False), tmp_path / "ffn.onnx")
    code, keep = keep_json(tmp_path, path, "--for", "tensorrt", "--trace", "--policy", "minimal")
    listed = ["MatMul_/layers.1/ffn/wo/MatMul_output_0", "Add_/layers.1/ffn/Add_output_0", FFN[2]]
    assert (code, [n["name"] for n in keep["nodes"]], keep["unnamed_nodes"]) == (SYNTHESIZED, listed, True)
    types = _input_types(_written(keep["snippet"], tmp_path / "run", "ffn.fp16.onnx"))
    assert sorted(n for n, t in types.items() if t and set(t) == {TensorProto.FLOAT} and not n.endswith(
        ("_to_fp32", "_cast_back"))) == sorted(listed)


def test_a_kept_if_has_the_casts_written_into_its_bodies(tmp_path):
    """An If kept by --keep-fp32 in a float16 graph: its outputs keep their type, and the nodes of both bodies are
    cast around (the then-branch's MatMul reads x and W, the else-branch's Identity x, both from outside the body):
    run as printed, onnx.checker accepts the model and each reads float32 inside its body."""
    from tests.test_keep_list import _if_model

    path = _float16(_if_model(tmp_path / "if32.onnx"), tmp_path / "if.onnx")
    code, keep = keep_json(tmp_path, path, "--for", "tensorrt", "--keep-fp32", "if")
    assert (code, [n["name"] for n in keep["nodes"]]) == (0, ["norm"])
    assert list(keep["arguments"]["casts"]) == ["ident", "big_matmul", "norm"]
    written = _written(keep["snippet"], tmp_path / "run", "if.fp16.onnx")
    branch = {a.name: a.g for a in next(n for n in written.graph.node if n.op_type == "If").attribute}
    assert [(n.op_type, n.name) for n in branch["then_branch"].node] == [
        ("Cast", "big_matmul_to_fp32"), ("Cast", "big_matmul_to_fp32~1"), ("MatMul", "big_matmul"),
        ("Cast", "big_matmul_cast_back")]
    assert [(n.op_type, n.name) for n in branch["else_branch"].node] == [
        ("Cast", "ident_to_fp32"), ("Identity", "ident"), ("Cast", "ident_cast_back")]


def test_tensorrt_on_a_float32_model_is_onnxruntimes_converter_and_autocast(tmp_path):
    """A float32 fused LayerNormalization: TensorRT 11 computes it in float16 once converted, so it is listed, as
    onnxruntime's converter's node_block_list (which writes the casts) and, commented out, AutoCast's
    nodes_to_exclude. Run as printed: the norm reads float32 in the converted model."""
    path = save(fused_norm("LayerNormalization", dtype="fp32", epsilon=1e-12), tmp_path / "ln.onnx")
    code, keep = keep_json(tmp_path, path, "--for", "tensorrt")
    assert (code, keep["arguments"]) == (0, {"node_block_list": ["norm"], "nodes_to_exclude": ["^norm\\Z"]})
    assert keep["converter"] == "onnxruntime 1.32.0's float16 converter"
    snippet = keep["snippet"]
    tail = snippet[snippet.index("# or ModelOpt AutoCast"):].splitlines()
    assert all(line.startswith("#") for line in tail) and "#     nodes_to_exclude=['^norm\\\\Z']," in tail
    written = _written(snippet, tmp_path / "run", "ln.fp16.onnx")
    types = _input_types(written)
    assert set(types["norm"]) == {TensorProto.FLOAT}
    assert written.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT16


@pytest.mark.parametrize("target, listed", [("dml", ["norm"]), ("webgpu", []), ("tensorrt", ["norm"])])
def test_stash_type_1_is_kept_with_casts_where_the_runtime_ignores_it(target, listed, tmp_path):
    """A float16 LayerNormalization with stash_type=1: DirectML never reads stash_type and computes its statistics
    in float16 (eps 1e-12 is 0 there), TensorRT 11 computes in its input's dtype; WebGPU's shader sums in float32.
    Listed where it is ignored, with a Cast to float32 on its input and its scale and one back on its output: run as
    printed, the norm reads float32 and its output is cast back to float16."""
    path = save(fused_norm("LayerNormalization", dtype="fp16", epsilon=1e-12, stash_type=1), tmp_path / "ln.onnx")
    code, keep = keep_json(tmp_path, path, "--for", target)
    assert (code, [n["name"] for n in keep["nodes"]]) == (0, listed)
    written = _written(keep["snippet"], tmp_path / "run", "ln.fp16.onnx")
    ops = [(n.op_type, n.attribute[0].i if n.op_type == "Cast" else None) for n in written.graph.node]
    if listed:
        assert ops == [("Cast", TensorProto.FLOAT)] * 2 + [("LayerNormalization", None),
                                                           ("Cast", TensorProto.FLOAT16)]
        assert set(_input_types(written)["norm"]) == {TensorProto.FLOAT}
    else:
        assert ops == [("LayerNormalization", None)]


def test_dml_on_a_float32_model_blocks_the_norm_in_onnxruntimes_converter(tmp_path):
    path = save(fused_norm("LayerNormalization", dtype="fp32", epsilon=1e-12, stash_type=1), tmp_path / "ln.onnx")
    code, keep = keep_json(tmp_path, path, "--for", "dml")
    assert (code, keep["arguments"], keep["runtime"]) == (0, {"node_block_list": ["norm"]}, "ort-dml@1.32")
    written = _written(keep["snippet"], tmp_path / "run", "ln.fp16.onnx")
    assert set(_input_types(written)["norm"]) == {TensorProto.FLOAT}


def test_qnn_prints_the_float_fallback_list_and_why_no_setting_keeps_it(tmp_path):
    """A float32 LayerNorm with eps 1e-12: the HTP runs it in float16 (eps 0), so its chain is the float-fallback
    list; no QNN option keeps a node float32 on the HTP, so the snippet is the list (a Python literal: the hostile
    name comes back exactly) and why, never run here: exit 3."""
    model, _ = decomposed_layernorm(1e-12, dtype="fp32")
    for node in model.graph.node:
        node.name = HOSTILE if node.name == "sub" else node.name
    path = save(model, tmp_path / "ln.onnx")
    code, keep = keep_json(tmp_path, path, "--for", "qnn")
    names = [CHAIN[0], HOSTILE, *CHAIN[2:]]
    assert (code, [n["name"] for n in keep["nodes"]], keep["runtime"]) == (SYNTHESIZED, names, "ort-qnn@2.35")
    check = keep["snippet_check"]
    assert (check["ran"], check["how"]) == (False, "not run: no HTP here, and no QNN option keeps a node in float32 "
                                                   "there: the list is where to split the model for the CPU execution "
                                                   "provider")
    space: dict = {}
    exec(compile(keep["snippet"], "<snippet>", "exec"), space)
    assert space["FLOAT_FALLBACK"] == names and keep["arguments"]["float_fallback"] == names
    assert "onnxruntime-qnn PR #599 was closed unmerged" in keep["snippet"].replace("\n# ", " ")
    code, cpu = keep_json(tmp_path, path, "--for", "onnxruntime", "--runtime", "ort-cpu")
    assert (code, cpu["nodes"]) == (0, [])  # the same model converted for onnxruntime CPU needs nothing


@pytest.mark.parametrize("args, message", [
    (("--for", "tensorrt", "--runtime", "ort-cpu"),
     "--for tensorrt keeps nodes for tensorrt, not for --runtime ort-cpu@1.32: leave --runtime out, or name a version "
     "of tensorrt (--runtime tensorrt@VERSION)"),
    (("--for", "coreml"), "--for coreml does not apply to an ONNX model; choose onnxconverter-common or onnxruntime or "
                          "olive or modelopt or openvino or tensorrt or qnn or dml or webgpu"),
    (("--for", "tensorrt", "--dtype", "bf16"), "--for tensorrt on a float32 model converts it with onnxruntime's "
                                               "float16 converter, which converts to float16 only, not bfloat16"),
])
def test_usage_errors_are_one_line(args, message, tmp_path, capsys):
    path = save(fused_norm("LayerNormalization", dtype="fp32"), tmp_path / "ln.onnx")
    assert main(["keep-list", str(path), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_a_tensorrt_version_is_judged_at_that_version(tmp_path):
    """TensorRT 10 honours stash_type (setComputePrecision): the float16 norm needs no list there; 11 lists it."""
    path = save(fused_norm("LayerNormalization", dtype="fp16", epsilon=1e-12, stash_type=1), tmp_path / "ln.onnx")
    _, ten = keep_json(tmp_path, path, "--for", "tensorrt", "--runtime", "tensorrt@10")
    _, eleven = keep_json(tmp_path, path, "--for", "tensorrt", "--runtime", "tensorrt@11")
    assert ([n["name"] for n in ten["nodes"]], ten["runtime"]) == ([], "tensorrt@10")
    assert [n["name"] for n in eleven["nodes"]] == ["norm"]


# ---- Core ML ----------------------------------------------------------------------------------------------------

SPEC = f"{Path(__file__).resolve().parent.parent}/fixtures/torch_src/hazards.py:hand_layernorm"
KEPT_FX = ["mean", "sub", "pow_1", "mean_1", "sub_1", "add", "sqrt", "div"]


@pytest.mark.requires("torch", "coremltools")
def test_coreml_names_the_ops_by_the_torch_export_nodes_and_converts_here(tmp_path):
    """x - mean over a hand-written LayerNorm with eps 1e-12 (5.96e-8 in coremltools' float16): the whole chain,
    named as torch.export names the nodes. coremltools converts the printed snippet here: every op writing a listed
    value computes in float32 (the second x - mean is merged into the first by coremltools' passes: said); Core ML
    predicts on macOS only, so the check is not run to the end: exit 3."""
    code, keep = keep_json(tmp_path, SPEC, "--for", "coreml")
    assert (code, [n["name"] for n in keep["nodes"]], keep["runtime"]) == (SYNTHESIZED, KEPT_FX, "coreml@9.0")
    assert keep["arguments"] == {"op_selector_keeps": KEPT_FX}
    check = keep["snippet_check"]
    assert (check["ran"], check["loads"], check["problem"], check["loader"], check["unverified"]) == \
        (True, True, None, "coremltools", "Core ML predicts on macOS only")
    assert check["how"].startswith("converted with the installed coremltools 9.0: the 7 ops writing a listed value "
                                   "compute in float32; no op writes 'sub_1' (coremltools merged, folded or fused it")
    text = tmp_path / "keep.txt"
    assert main(["keep-list", SPEC, "--for", "coreml", "-o", str(text)]) == SYNTHESIZED
    assert "coremltools converts the model; not verified: Core ML predicts on macOS only" in text.read_text()
    ops = _converted_ops(keep["snippet"])
    kept = {name: dtypes for name, dtypes in ops.items() if name in KEPT_FX}
    assert sorted(kept) == sorted(set(KEPT_FX) - {"sub_1"}) and all(d == {"fp32"} for d in kept.values())


def _converted_ops(snippet: str) -> dict[str, set[str]]:
    """The printed snippet run on the fixture's module: each op's first output name, with the dtypes of its float
    inputs and outputs."""
    from coremltools.converters.mil.mil import types

    from fixtures.torch_src.hazards import hand_layernorm

    model, inputs = hand_layernorm()
    space = {"model": model.eval(), "inputs": inputs}
    exec(compile(snippet.replace("mlmodel.save(OUTPUT_PATH)", ""), "<snippet>", "exec"), space)
    found = {}
    for op in space["mlmodel"]._mil_program.functions["main"].operations:
        dtypes = {types.builtin_to_string(v.dtype) for v in [*op.outputs, *op.inputs.values()] if hasattr(v, "dtype")}
        found[op.outputs[0].name] = {d for d in dtypes if d.startswith("fp")}
    return found


@pytest.mark.requires("torch")
def test_coreml_without_coremltools_is_not_run(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "coremltools" else real(name, *a))
    code, keep = keep_json(tmp_path, SPEC, "--for", "coreml")
    assert (code, keep["snippet_check"]["ran"]) == (SYNTHESIZED, False)
    assert keep["snippet_check"]["how"] == ("not run: coremltools is not installed, so the snippet was checked against "
                                            "precaudit's model of Core ML only; Core ML predicts on macOS only")
    assert [n["name"] for n in keep["nodes"]] == KEPT_FX
