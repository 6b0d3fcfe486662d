"""keep-list --for openvino: the Python that keeps the listed nodes in float32 through OpenVINO's fp16 compression,
run as printed with the installed openvino (the [openvino] extra), and what the IR it writes keeps: exactly the
listed nodes' layers and their weights in float32, every other weight in float16 but what OpenVINO keeps itself."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import onnx
import pytest

ov = pytest.importorskip("openvino")

from fixtures.keep_list_models import ffn_overflow_transformer  # noqa: E402
from fixtures.onnx_builders import decomposed_layernorm, save  # noqa: E402
from precaudit.converters import KeepArgs  # noqa: E402
from precaudit.converters.openvino import paste  # noqa: E402
from tests.test_keep_list import SYNTHESIZED, keep_json  # noqa: E402

# names a stranger's model may hold: quotes, a newline, XML that would close the layer, a comma (the IR joins a
# port's tensor names with commas) and backslashes
NODE = 'wo\'"\n</layer><layer id="9" name="x">'
TENSOR = 'h,"</port>\n\\,y'
WO, WO_OUT = "/layers.1/ffn/wo/MatMul", "/layers.1/ffn/wo/MatMul_output_0"
BF16_CPU = "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


@pytest.fixture(scope="module")
def hostile_ffn(tmp_path_factory) -> Path:
    """The FFN-overflow transformer with the MatMul that overflows (and the tensor it makes) named as a stranger may."""
    folder = tmp_path_factory.mktemp("ffn")
    model = onnx.load(str(ffn_overflow_transformer(folder / "ffn.onnx")))
    for node in model.graph.node:
        node.name = NODE if node.name == WO else node.name
        node.input[:] = [TENSOR if i == WO_OUT else i for i in node.input]
        node.output[:] = [TENSOR if o == WO_OUT else o for o in node.output]
    onnx.save(model, str(folder / "hostile.onnx"))
    return folder / "hostile.onnx"


def _run_as_printed(snippet: str, folder: Path) -> subprocess.CompletedProcess:
    folder.mkdir()
    (folder / "snippet.py").write_text(snippet)
    return subprocess.run([sys.executable, "-I", "snippet.py"], cwd=folder, capture_output=True, text=True, timeout=600)


def _printed_ir(snippet: str, folder: Path, name: str) -> list[tuple[str, str, str | None, bool]]:
    """The IR's layers, the snippet run as printed in a folder of its own."""
    proc = _run_as_printed(snippet, folder)
    assert proc.returncode == 0, proc.stderr
    return _ir_layers(folder / name)


def _ir_layers(path: Path) -> list[tuple[str, str, str | None, bool]]:
    """(type, name, a Const's element type, kept: DisablePrecisionConversion on it) of every layer of the IR, those
    of If and Loop bodies too."""
    layers = []
    for layer in ET.parse(path).getroot().iter("layer"):
        data, info = layer.find("data"), layer.find("rt_info")
        kept = info is not None and any(a.get("name") == "DisablePrecisionConversion" and a.get("value") == "dynamic:f16"
                                        for a in info.findall("attribute"))
        layers.append((layer.get("type"), layer.get("name"), data.get("element_type") if data is not None else None,
                       kept))
    return layers


def test_the_printed_snippet_keeps_exactly_the_listed_layers_and_their_weights_in_float32(hostile_ffn, tmp_path):
    """Traced, the list is the overflowing MatMul, the residual Add and the LayerNorm after it. Run as printed, the
    snippet writes an IR in which exactly their layers (the LayerNorm is an MVN, a Multiply and an Add) and their
    weights carry DisablePrecisionConversion and stayed float32; every other weight is float16 but the attention
    scale, a scalar float16 cannot hold, which OpenVINO keeps in float32 itself. On this CPU the kept MatMul runs in
    float32 where the others run in bfloat16. keep-list's own run of the snippet said the same."""
    code, keep = keep_json(tmp_path, hostile_ffn, "--for", "openvino", "--trace")
    assert code == SYNTHESIZED
    assert [n["name"] for n in keep["nodes"]] == [NODE, "/layers.1/ffn/Add", "/layers.1.ffn_norm/LayerNormalization"]
    check = keep["snippet_check"]
    assert (check["ran"], check["loads"], check["problem"], check["loader"]) == (True, True, None, "OpenVINO")
    assert check["how"].startswith("ran with the installed openvino 2026.4.1; the IR keeps the layers of the 3 listed "
                                   "nodes and their 3 float weights in float32, 28 other weights float16 and 1 float32")
    layers = _printed_ir(keep["snippet"], tmp_path / "run", "hostile.fp16.xml")
    kept = sorted((kind, name if not name.startswith(("MVN_", "Multiply_")) else kind, dtype)
                  for kind, name, dtype, marked in layers if marked)
    assert kept == [("Add", "/layers.1.ffn_norm/LayerNormalization", None), ("Add", "/layers.1/ffn/Add", None),
                    ("Const", "layers.1.ffn.wo.weight", "f32"), ("Const", "layers.1.ffn_norm.bias", "f32"),
                    ("Const", "layers.1.ffn_norm.weight", "f32"), ("MVN", "MVN", None), ("MatMul", NODE, None),
                    ("Multiply", "Multiply", None)]
    others = {name: dtype for kind, name, dtype, marked in layers if kind == "Const" and not marked
              and dtype in ("f32", "f16")}
    assert len(others) == 29 and {n: d for n, d in others.items() if d != "f16"} == {"scale": "f32"}
    if BF16_CPU:
        core = ov.Core()
        compiled = core.compile_model(core.read_model(str(tmp_path / "run" / "hostile.fp16.xml")), "CPU")
        runs = {op.get_friendly_name(): op.get_rt_info()["runtimePrecision"].astype(str)
                for op in compiled.get_runtime_model().get_ordered_ops()}
        assert (runs[NODE], runs["/layers.1/ffn/wi/MatMul"]) == ("f32", "bf16")


LAYERS = [("Add", "add_eps"), ("Const", "eps"), ("Const", "two"), ("Divide", "div"), ("Power", "pow"),
          ("ReduceMean", "mean"), ("ReduceMean", "var"), ("Sqrt", "sqrt"), ("Subtract", "sub")]


@pytest.mark.parametrize("eps, listed", [(1e-12, []), (1e-3, ["mean", "sub", "pow", "var", "add_eps", "sqrt", "div"])])
def test_openvino_keeps_a_small_eps_layernorm_itself_and_the_list_only_what_it_does_not(eps, listed, tmp_path):
    """fp16 compression keeps x / sqrt(var + eps) in float32 by itself when eps ≤ 6.1e-5 (MarkDivWithEps): the list
    is empty, where --for onnxruntime keeps the chain; with eps 1e-3 it squares in float16 and the chain is listed:
    run as printed, exactly its layers and its two constants are kept (exit 0: static, checked)."""
    path = save(decomposed_layernorm(eps, dtype="fp32")[0], tmp_path / "ln.onnx")
    code, keep = keep_json(tmp_path, path, "--for", "openvino")
    assert (code, [n["name"] for n in keep["nodes"]], keep["snippet_check"]["problem"]) == (0, listed, None)
    assert keep["converter"] == "OpenVINO 2026.4.1's fp16 compression"
    kept = sorted((kind, name) for kind, name, _, marked in _printed_ir(keep["snippet"], tmp_path / "run", "ln.fp16.xml")
                  if marked)
    assert kept == (LAYERS if listed else [])


def test_a_kept_if_keeps_its_bodies_and_their_weights(tmp_path):
    """The overflow is a MatMul inside an If's branch: the list keeps the If (and the Add and LayerNorm after it, the
    graph's output). Run as printed, the If and every layer of both bodies are kept, the branch's weight too, and the
    LayerNorm's MVN, Multiply and Add (named after the output, whose Result carries the same tensor name: the layer
    is found, not the Result) with its scale and bias: no weight is float16. keep-list's own check says so too."""
    from tests.test_keep_list import _if_model

    code, keep = keep_json(tmp_path, _if_model(tmp_path / "if.onnx"), "--for", "openvino", "--trace")
    assert (code, [n["name"] for n in keep["nodes"]]) == (SYNTHESIZED, ["if", "residual", "norm"])
    assert keep["snippet_check"]["problem"] is None
    layers = _printed_ir(keep["snippet"], tmp_path / "run", "if.fp16.xml")
    kept = sorted((kind, name if not name.startswith(("MVN_", "Multiply_")) else kind, dtype)
                  for kind, name, dtype, marked in layers if marked)
    assert kept == [("Add", "residual", None), ("Add", "y", None), ("Const", "W", "f32"), ("Const", "b", "f32"),
                    ("Const", "g", "f32"), ("Identity", "e", None), ("If", "if", None), ("MVN", "MVN", None),
                    ("MatMul", "t", None), ("Multiply", "Multiply", None), ("Parameter", "x_1", "f32"),
                    ("Parameter", "x_2", "f32"), ("Result", "e/sink_port_0", None), ("Result", "t/sink_port_0", None)]
    assert not [layer for layer in layers if layer[2] == "f16"]


def test_a_node_openvino_makes_no_layer_of_stops_the_snippet(tmp_path):
    """A tensor OpenVINO's model does not hold: the snippet exits with a message naming the node, before it writes
    anything; an IR the list was not applied to is never left to pass for a kept one."""
    path = save(decomposed_layernorm(1e-3, dtype="fp32")[0], tmp_path / "ln.onnx")
    snippet = paste(KeepArgs(model=str(path), nodes=["div", "ghost\n"], outputs=[["n"], ["no such tensor"]]))
    proc = _run_as_printed(snippet, tmp_path / "run")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == ("OpenVINO made no layer of ['ghost\\n']: the list cannot be applied "
                                                    "to this model")
    assert not list((tmp_path / "run").glob("*.xml"))


def test_an_ir_that_does_not_keep_the_list_is_not_verified(tmp_path):
    """keep-list's check reads the IR: one written without the marks keeps no listed layer, and says which."""
    from precaudit.keeplist.snippet_openvino import check_ir
    from precaudit.keeplist.snippet_run import SnippetCheck

    path = save(decomposed_layernorm(1e-3, dtype="fp32")[0], tmp_path / "ln.onnx")
    core = ov.Core()
    ov.save_model(core.read_model(str(path)), str(tmp_path / "plain.xml"), compress_to_fp16=True)
    check = SnippetCheck(True, "")
    check_ir(str(tmp_path / "plain.xml"), {"div": ["n"], "pow": ["d2"]}, check)
    assert (check.loads, check.problem) == (True, "the IR keeps no layer of 'div', 'pow' in float32")
    assert not check.ok


@pytest.mark.parametrize("key, round_trip, weight", [("DisablePrecisionConversion", True, "f16"),
                                                      ("precise_0", False, "f16"), ("precise_0", True, "f32")],
                         ids=["new-name-as-a-string", "legacy-saved-once", "legacy-read-back"])
def test_why_the_snippet_saves_the_ir_twice(key, round_trip, weight, tmp_path):
    """The routes converters/openvino.py measured, measured again: the new attribute's name set from Python is a
    plain string the IR never carries; the legacy precise_0 reaches the IR as DisablePrecisionConversion, but a
    weight marked so and saved once with compress_to_fp16 is compressed all the same; read back and saved again, it
    stays float32."""
    path = save(decomposed_layernorm(1e-3, dtype="fp32")[0], tmp_path / "ln.onnx")
    core = ov.Core()
    model = core.read_model(str(path))
    for op in model.get_ordered_ops():
        if op.get_friendly_name() in ("pow", "two"):  # the Pow and its exponent (2.0: compressed unless marked)
            op.get_rt_info()[key] = "dynamic:f16" if key != "precise_0" else ""
    if round_trip:
        ov.save_model(model, str(tmp_path / "marked.xml"), compress_to_fp16=False)
        model = core.read_model(str(tmp_path / "marked.xml"))
    ov.save_model(model, str(tmp_path / "out.xml"), compress_to_fp16=True)
    layers = {(kind, name): (dtype, kept) for kind, name, dtype, kept in _ir_layers(tmp_path / "out.xml")}
    marked = key == "precise_0"
    assert layers[("Power", "pow")] == (None, marked)
    assert layers[("Const", "two" if weight == "f32" else "two_compressed")] == (weight, marked)
