"""--dtype mxfp8|mxfp4|nvfp4 on a float model: what MatMul, Gemm and Conv multiply is quantized block by block (the
weights checked with --check-weights, the activations in traced mode), the rest runs as stored; the error against
float32 is measured, and keep-list writes ModelOpt's quantization config for what to leave unquantized."""

from __future__ import annotations

import json
from typing import ClassVar

import numpy as np
import pytest

from fixtures.onnx_builders import decomposed_layernorm, save
from fixtures.quantized_models import float_linear, linear_weight
from precaudit.cli import main
from tests.helpers import run_json


def test_a_block_scaled_target_leaves_the_float_parts_float32(tmp_path):
    """A LayerNorm with eps 1e-12: 0.0 in float16 (PA101), but --dtype mxfp4 rounds only what MatMul, Gemm and Conv
    multiply, so its statistics stay float32 and nothing is found; the reason says so."""
    path = save(decomposed_layernorm(eps=1e-12, dtype="fp32")[0], tmp_path / "ln.onnx")
    _, fp16 = run_json([path], out_dir=tmp_path)
    assert "PA101" in {r["rule_id"] for r in fp16["results"]}
    code, mx = run_json([path], "--dtype", "mxfp4", out_dir=tmp_path)
    assert (code, mx["results"], mx["settings"]["dtype"]) == (0, [], "mxfp4")

    from precaudit.deployment import Deployment
    from precaudit.frontends.onnx import load_onnx

    graph = load_onnx(str(path))
    dtype = Deployment.named("mxfp4").resolver(graph).of_node(graph.nodes[0])
    assert (dtype.fmt.name, dtype.reason) == ("fp32", "--dtype mxfp4 quantizes what MatMul, Gemm and Conv read; the "
                                                      "rest runs as stored, in float32")


@pytest.mark.parametrize("name", ["mxfp8", "mxfp4", "nvfp4"])
def test_traced_gemm_error_is_its_quantized_inputs_product_against_float32(name, tmp_path):
    """The emulated Gemm reads x and W quantized along the axis they sum over (dtypes.quantize, NVFP4's global scale
    from each tensor), the reference reads them as stored: the output's measured error is exactly that product's."""
    from precaudit.deployment import Deployment
    from precaudit.dtypes import FORMATS, quantize
    from precaudit.frontends.onnx import load_onnx
    from precaudit.trace import Emulator

    w = linear_weight(16, 64)
    graph = load_onnx(str(float_linear(tmp_path / "fl.onnx", w)))
    x = np.random.RandomState(3).standard_normal((2, 64)).astype(np.float32)
    emulator = Emulator(graph, Deployment.named(name).resolver(graph), engine="auto")
    emulator.run({"x": x}, final=True)
    fmt = FORMATS[name]
    ref = x @ w.T
    emu = quantize(x, fmt, axis=1) @ quantize(w, fmt, axis=1).T
    stats = emulator.stats[id(graph.outputs[0])]
    assert stats.max_error == float(np.max(np.abs(emu - ref))) and stats.absmax == float(np.max(np.abs(ref)))
    assert emulator.ran_on == {"onnxruntime": 0, "numpy": 1}  # onnxruntime has no blocked-quantized Gemm


def test_weights_are_checked_block_by_block_with_check_weights(tmp_path):
    """--dtype nvfp4 --check-weights: a [4, 64] weight's 16 blocks are counted, its error against float32 given
    (PA505 fires on the outlier's block; without --check-weights no weight is read)."""
    w = linear_weight()
    w[2, 40] = 20.0
    path = float_linear(tmp_path / "w.onnx", w)
    _code, report = run_json([path], "--dtype", "nvfp4", "--check-weights", out_dir=tmp_path)
    (finding,) = report["results"]
    values = finding["values"]
    assert (finding["rule_id"], values["blocks"], values["owned_blocks"], values["elements"]) == ("PA505", 16, 1, 256)

    from precaudit.dtypes import FORMATS, quantize

    q, w64 = quantize(w, FORMATS["nvfp4"], axis=1).astype(np.float64), w.astype(np.float64)
    assert values["rel_error"] == pytest.approx(float(np.linalg.norm(q - w64) / np.linalg.norm(w64)), rel=1e-12)
    assert values["zeroed_count"] == int(np.count_nonzero((q == 0) & (w != 0)))
    assert run_json([path], "--dtype", "nvfp4", out_dir=tmp_path)[1]["results"] == []


def test_keep_list_writes_modelopts_quantization_config(tmp_path):
    """keep-list --for modelopt-quant: the Gemm whose outlier block PA505 names, kept out of MXFP4, as the plain list
    and as ModelOpt's {"*name*": {"enable": False}} entries; verified by emulation on synthesized inputs (exit 3)."""
    w = linear_weight()
    w[2, 40] = 20.0
    path = float_linear(tmp_path / "w.onnx", w)
    out = tmp_path / "keep.json"
    code = main(["keep-list", str(path), "--dtype", "mxfp4", "--for", "modelopt-quant", "--trace", "--format", "json",
                 "-o", str(out)])
    keep = json.loads(out.read_text())
    assert code == 3 and [n["name"] for n in keep["nodes"]] == ["linear"]
    assert keep["arguments"] == {"quant_cfg": {"*linear*": {"enable": False}}}
    assert "config = copy.deepcopy(mtq.MXFP4_DEFAULT_CFG)" in keep["snippet"]
    assert "    '*linear*': {'enable': False}," in keep["snippet"]
    assert keep["verification"]["verified"] and keep["verification"]["output_error"] == 0.0


@pytest.mark.parametrize("args,message", [
    (("--dtype", "mxfp4", "--for", "onnxruntime"),
     "--dtype mxfp4 quantizes what MatMul, Gemm and Conv read, which no converter undoes: --for modelopt-quant"),
    (("--dtype", "fp16", "--for", "modelopt-quant"),
     "--for modelopt-quant lists the nodes to leave out of a block-scaled format: use it with --dtype mxfp8, mxfp4"),
])
def test_keep_list_pairs_block_formats_with_modelopt_quant(args, message, tmp_path, capsys):
    path = float_linear(tmp_path / "w.onnx")
    assert main(["keep-list", str(path), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_quant_patterns_escape_wildcards():
    """A module path holding [ or * is matched literally by the pattern (fnmatch), and repeats are listed once."""
    from precaudit.ir import Node
    from precaudit.keeplist.render import quant_patterns

    class Keep:
        nodes: ClassVar[list[Node]] = [Node("/a/MatMul", "MatMul", scope="layers[0].mlp"), Node("/b/MatMul", "MatMul", scope="layers[0].mlp"),
                 Node("x*y", "Gemm")]

    assert quant_patterns(Keep()) == ["*layers[[]0].mlp*", "*x[*]y*"]


def test_fix_refuses_a_block_scaled_target_and_says_what_to_use(tmp_path, capsys):
    path = float_linear(tmp_path / "w.onnx")
    assert main(["fix", str(path), "-o", str(tmp_path / "fixed.onnx"), "--dtype", "nvfp4"]) == 2
    assert capsys.readouterr().err == (
        "precaudit: --dtype nvfp4: fix repairs what a narrower dtype breaks; choose fp16, bf16 or an fp8 format (a "
        "block-scaled format quantizes what MatMul, Gemm and Conv read: precaudit keep-list names those to keep)\n")
    assert not (tmp_path / "fixed.onnx").exists()
