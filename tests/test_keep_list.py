"""precaudit keep-list: static lists from findings, lists verified by emulation, and each converter's arguments."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from fixtures.keep_list_models import ffn_overflow_transformer
from fixtures.onnx_builders import decomposed_layernorm, fused_norm, save
from precaudit.cli import main

SYNTHESIZED = 3  # keep-list's exit code: verified on synthesized inputs only, or the snippet could not run here
FFN = ["/layers.1/ffn/wo/MatMul", "/layers.1/ffn/Add", "/layers.1.ffn_norm/LayerNormalization"]


def keep_json(tmp_path: Path, *args: str) -> tuple[int, dict]:
    out = tmp_path / "keep.json"
    code = main(["keep-list", *map(str, args), "--format", "json", "-o", str(out)])
    return code, json.loads(out.read_text()) if out.exists() else {}


def keep_text(tmp_path: Path, *args: str, code: int = SYNTHESIZED) -> str:
    out = tmp_path / "keep.txt"
    assert main(["keep-list", *map(str, args), "-o", str(out)]) == code
    return out.read_text()


@pytest.fixture(scope="module")
def ffn_model(tmp_path_factory) -> Path:
    return ffn_overflow_transformer(tmp_path_factory.mktemp("ffn") / "ffn.onnx")


def test_a_t5_style_ffn_overflow_gets_a_verified_list_smaller_than_blocking_matmul(ffn_model, tmp_path):
    code, keep = keep_json(tmp_path, ffn_model, "--for", "onnxconverter-common", "--trace")
    assert code == SYNTHESIZED
    assert [n["name"] for n in keep["nodes"]] == FFN
    verdict = keep["verification"]
    assert verdict["verified"] and verdict["outputs_finite"] and verdict["output_error"] < 0.01
    # run 1: the static list (empty) overflows at wo; run 2: with wo's overflow closure, clean; run 3: without it,
    # inf again, so it stays
    assert verdict["emulation_runs"] == 3
    matmuls = sum(1 for n in onnx.load(str(ffn_model)).graph.node if n.op_type == "MatMul")
    assert keep["count"] == 3 < matmuls == keep["op_type_counts"]["MatMul"] == 25
    assert keep["count_blocking_op_types"] == 25 + 6 + 6  # MatMul, Add, LayerNormalization
    [entry] = keep["entries"]
    assert entry["source"] == "traced" and "first inf/NaN starts at '/layers.1/ffn/wo/MatMul'" in entry["reasons"][0]


def test_blocking_every_matmul_does_not_fix_it(ffn_model):
    """A kept MatMul's output is cast back to float16 for the Add that reads it: the overflow comes back there."""
    from precaudit.deployment import Deployment
    from precaudit.frontends.onnx import load_onnx
    from precaudit.keeplist.verify import emulate
    from precaudit.trace.inputs import synthesize_inputs

    graph = load_onnx(str(ffn_model))
    batches = [synthesize_inputs(graph, {}, 0)]
    occ = Deployment.named("fp16", "onnxconverter-common")
    matmuls = [n for n in graph.nodes if n.op_type == "MatMul"]
    assert not emulate(graph, occ, [], batches, "auto").finite
    assert not emulate(graph, occ, matmuls, batches, "auto").finite
    listed = [n for n in graph.nodes if n.name in FFN]
    assert emulate(graph, occ, listed, batches, "auto").ok(0.01)


def test_a_clean_model_needs_no_list(tmp_path):
    path = ffn_overflow_transformer(tmp_path / "clean.onnx", hot=None)
    code, keep = keep_json(tmp_path, path, "--for", "onnxruntime", "--trace")
    assert code == SYNTHESIZED and keep["nodes"] == [] and keep["verification"]["verified"]
    assert keep["verification"]["emulation_runs"] == 1


def test_static_lists_a_norms_whole_chain_and_what_float32_cannot_fix(tmp_path):
    m, _ = decomposed_layernorm(1e-12, dtype="fp32", opset=14)
    path = save(m, tmp_path / "ln.onnx")
    code, keep = keep_json(tmp_path, path, "--for", "onnxconverter-common")
    assert code == 0 and keep["verification"] is None  # the real converter ran the snippet, its model loads
    assert keep["snippet_check"]["ran"] and keep["snippet_check"]["loads"]
    assert [n["name"] for n in keep["nodes"]] == ["mean", "sub", "pow", "var", "add_eps", "sqrt", "div"]
    assert keep["entries"][0]["reasons"] == ["PA102 eps-subnormal at 'add_eps'", "PA208 statistic-overflow at 'add_eps'"]
    # MeanVarianceNormalization: its fixed eps 1e-9 sits outside the sqrt (PA104, wrong in every dtype) and is 0.0
    # in float16 (PA101, which keeping the node in float32 fixes)
    mvn = save(fused_norm("MeanVarianceNormalization", "fp32"), tmp_path / "mvn.onnx")
    _, keep = keep_json(tmp_path, mvn, "--for", "onnxruntime")
    assert [e["reasons"] for e in keep["entries"]] == [["PA101 eps-underflow at 'norm'"]]
    assert [(f["rule_id"], f["node"]) for f in keep["not_fixed"]] == [("PA104", "norm")]


def _parse_python(code: str) -> None:
    compile("\n".join(line for line in code.splitlines() if not line.startswith("python -m ")), "<snippet>", "exec")


@pytest.mark.parametrize("target", ["onnxconverter-common", "onnxruntime", "olive", "modelopt"])
def test_each_converter_gets_its_arguments(ffn_model, target, tmp_path):
    code, keep = keep_json(tmp_path, ffn_model, "--for", target, "--keep-fp32", "Softmax")
    # onnxconverter-common and onnxruntime run the printed snippet here; Olive and modelopt are not installed
    assert code == (0 if target in ("onnxconverter-common", "onnxruntime") else SYNTHESIZED)
    assert keep["snippet_check"]["ran"] == (code == 0)
    args, snippet = keep["arguments"], keep["snippet"]
    if target == "onnxconverter-common":
        assert args["op_block_list"][-1] == "Softmax" and "Resize" in args["op_block_list"]
        assert "op_block_list=float16.DEFAULT_OP_BLOCK_LIST + ['Softmax']" in snippet
    elif target == "onnxruntime":
        assert "Resize" not in args["op_block_list"] and "OnnxModel(model)" in snippet
        assert "keep_io_types=False" in snippet
    elif target == "olive":
        config = json.loads(snippet)["passes"]["fp16"]
        assert config["type"] == "OnnxFloatToFloat16" and config["op_block_list"][-1] == "Softmax"
    else:
        assert args["op_types_to_exclude"] == ["Softmax"] and "--data_max inf" in snippet
    if target != "olive":
        _parse_python(snippet)


def test_modelopt_regexes_are_anchored_and_escaped(tmp_path):
    """re.match anchors at the start only: '^name\\Z' with every metacharacter escaped matches the node and no other."""
    path = ffn_overflow_transformer(tmp_path / "m.onnx")
    model = onnx.load(str(path))
    for node in model.graph.node:  # names with regex metacharacters: dots, brackets, a plus, a star
        node.name = node.name.replace("/layers.1/ffn/wo/MatMul", "/layers.1/ffn/wo[0]+*/MatMul")
    onnx.save(model, str(path))
    _, keep = keep_json(tmp_path, path, "--for", "modelopt", "--trace")
    regexes = keep["arguments"]["nodes_to_exclude"]
    assert regexes[0] == r"^/layers\.1/ffn/wo\[0\]\+\*/MatMul\Z"
    names = [n.name for n in model.graph.node]
    for regex in regexes:
        assert [n for n in names if re.match(regex, n)] == [n for n in names if n == regex[1:-2].replace("\\", "")]
    assert "'^/layers\\.1/ffn/wo\\[0\\]\\+\\*/MatMul\\Z'" in keep["snippet"]  # shell-quoted on the command line


def test_unnamed_nodes_are_named_by_the_snippet_as_listed(tmp_path):
    path = ffn_overflow_transformer(tmp_path / "unnamed.onnx", names=False)
    _, keep = keep_json(tmp_path, path, "--for", "onnxconverter-common", "--trace")
    assert keep["unnamed_nodes"] and keep["verification"]["verified"]
    listed = [n["name"] for n in keep["nodes"]]
    assert listed[0] == "MatMul_/layers.1/ffn/wo/MatMul_output_0" and keep["nodes"][0]["unnamed"]
    snippet = keep["snippet"]
    model = onnx.load(str(path))
    exec(_naming(snippet), {"model": model})  # the loop the snippet runs before converting
    names = {n.name for n in model.graph.node}
    assert set(listed) <= names


def test_olive_snippet_is_json_with_unnamed_nodes(tmp_path):
    """The Olive snippet is the pass's JSON and nothing else (a note appended as a // comment made it no JSON); the
    note on unnamed nodes is the report's."""
    path = ffn_overflow_transformer(tmp_path / "unnamed.onnx", names=False)
    _, keep = keep_json(tmp_path, path, "--for", "olive", "--trace")
    assert keep["unnamed_nodes"]
    config = json.loads(keep["snippet"])
    assert config["passes"]["fp16"]["node_block_list"] == [n["name"] for n in keep["nodes"]]
    text = keep_text(tmp_path, path, "--for", "olive", "--trace", code=3)
    assert "name them so first (keep-list --for onnxruntime prints the loop)" in text


def _naming(snippet: str) -> str:
    """The snippet's loop that names unnamed nodes, as printed."""
    end = snippet.index("node.name = name") + len("node.name = name")
    return snippet[snippet.index("def graphs(graph):"):end]


def _if_model(path: Path) -> Path:
    """x → If(cond: then MatMul by a weight that overflows float16, else Identity) → Add(x) → LayerNorm."""
    w = (np.random.default_rng(0).standard_normal((32, 32)) * 30000 / np.sqrt(32)).astype(np.float32)
    out = lambda name: h.make_tensor_value_info(name, T.FLOAT, [1, 16, 32])  # noqa: E731
    then = h.make_graph([h.make_node("MatMul", ["x", "W"], ["t"], name="big_matmul")], "then", [], [out("t")])
    other = h.make_graph([h.make_node("Identity", ["x"], ["e"], name="ident")], "else", [], [out("e")])
    nodes = [h.make_node("If", ["cond"], ["branch"], name="if", then_branch=then, else_branch=other),
             h.make_node("Add", ["branch", "x"], ["s"], name="residual"),
             h.make_node("LayerNormalization", ["s", "g", "b"], ["y"], name="norm", axis=-1)]
    graph = h.make_graph(nodes, "cf", [out("x"), h.make_tensor_value_info("cond", T.BOOL, [])], [out("y")],
                         [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.ones(32, np.float32), "g"),
                          numpy_helper.from_array(np.zeros(32, np.float32), "b")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 9
    return save(model, path)


def test_an_overflow_inside_an_if_body_keeps_the_if_where_the_converter_can(tmp_path):
    """A kept If keeps its bodies in float32 (converters do not descend into a blocked node's bodies); modelopt
    keeps a blocked If whole (modelled here: not installed), so its list keeps the If."""
    code, keep = keep_json(tmp_path, _if_model(tmp_path / "if.onnx"), "--for", "modelopt", "--trace")
    assert code == SYNTHESIZED and [n["name"] for n in keep["nodes"]] == ["if", "residual", "norm"]
    assert keep["verification"]["verified"] and keep["control_flow_problem"] is None
    assert keep["snippet_check"]["ran"] is False


@pytest.mark.parametrize(("target", "kept"), [("onnxconverter-common", "'if', 'if/then_branch/big_matmul'"),
                                              ("onnxruntime", "'if'")])
def test_a_list_the_converter_turns_into_a_refused_model_is_not_the_answer(target, kept, tmp_path):
    """onnxconverter-common 1.16.0 and onnxruntime 1.32.0 leave a blocked If's outer-scope reads uncast: run as
    printed, the list with the If writes a model onnxruntime refuses. The list printed is the one without it, whose
    model loads; the overflow inside the branch then stays in float16, and the real converter's model shows it on
    the inputs: NOT verified, exit 1. onnxconverter-common also clamps 50 of W's values (up to 2.1e4) to 1e4 (PA212
    at the MatMul that reads it), so its list with the If keeps that MatMul too."""
    code, keep = keep_json(tmp_path, _if_model(tmp_path / "if.onnx"), "--for", target, "--trace")
    assert code == 1
    assert [n["name"] for n in keep["nodes"]] == ["residual", "norm"]
    assert keep["alternative"].startswith(f"the list with {kept} kept: onnxruntime refuses the model the snippet writes:")
    assert "TypeInferenceError" in keep["alternative"] or "does not match expected type" in keep["alternative"]
    check = keep["snippet_check"]
    assert check["ran"] and check["loads"] and check["finite"] is False
    assert not keep["verification"]["verified"]
    assert "node_block_list=['residual', 'norm']" in keep["snippet"]


@pytest.mark.slow
def test_a_model_over_2gb_with_external_data(tmp_path):
    """A static list never reads weights: a 2.2 GB external tensor (a sparse file here) costs nothing, and the
    snippets keep the weights in external data."""
    m, _ = decomposed_layernorm(1e-12, dtype="fp32", opset=14)
    big = onnx.TensorProto(name="big", data_type=T.FLOAT, dims=[550_000_000])
    big.data_location = T.EXTERNAL
    for key, value in (("location", "weights.bin"), ("offset", "0"), ("length", str(550_000_000 * 4))):
        entry = big.external_data.add()
        entry.key, entry.value = key, value
    m.graph.initializer.append(big)
    m.graph.node.append(h.make_node("Identity", ["big"], ["big_out"], name="hold"))
    m.graph.output.append(h.make_tensor_value_info("big_out", T.FLOAT, [550_000_000]))
    with open(tmp_path / "weights.bin", "wb") as fh:
        fh.truncate(550_000_000 * 4)
    path = save(m, tmp_path / "big.onnx", check=False)
    _, occ = keep_json(tmp_path, path, "--for", "onnxconverter-common")
    assert occ["external_data_over_2gb"] and "infer_shapes_path" in occ["snippet"]
    assert "save_as_external_data=True" in occ["snippet"] and "disable_shape_infer=True" in occ["snippet"]
    _, ort = keep_json(tmp_path, path, "--for", "onnxruntime")
    assert "use_external_data_format=True" in ort["snippet"]
    _parse_python(occ["snippet"])


def test_text_output(ffn_model, tmp_path):
    text = keep_text(tmp_path, ffn_model, "--for", "onnxconverter-common", "--trace")
    assert "  verified on 1 synthesized sample (seed 0): emulated outputs finite" in text
    assert "  NOT CHECKED ON YOUR DATA: synthesized inputs have no silence" in text
    assert "snippet checked as printed (ran with the installed onnxconverter_common): onnxruntime loads its model" in text
    assert text.splitlines()[1] == ("  keeps 3 nodes in float32; blocking their op types instead keeps 37 "
                                    "(MatMul 25, Add 6, LayerNormalization 6)")
    assert "node_block_list=['/layers.1/ffn/wo/MatMul', '/layers.1/ffn/Add', " in text


@pytest.mark.parametrize("args,message", [
    ((), "keep-list needs --for"),
    (("--for", "pytorch"), "--for pytorch does not apply to an ONNX model"),
    (("--for", "tvm"), "--for: must be one of onnxconverter-common, onnxruntime, olive, modelopt, openvino, pytorch, "
                        "torch-tensorrt, modelopt-quant, tensorrt, coreml, qnn, dml, webgpu, got 'tvm'"),
    (("--for", "onnxruntime", "--dtype", "bf16"), "converts to float16 only"),
])
def test_usage_errors(ffn_model, args, message, capsys):
    assert main(["keep-list", str(ffn_model), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_a_generated_name_never_takes_a_real_nodes_name(tmp_path):
    """A real node named as precaudit would name an unnamed one: the unnamed node becomes name~1, in the report and
    in the snippet's naming loop alike, and the list verifies on the model the snippet writes (run as printed)."""
    path = ffn_overflow_transformer(tmp_path / "unnamed.onnx", names=False)
    model = onnx.load(str(path))
    taken = "MatMul_/layers.1/ffn/wo/MatMul_output_0"
    decoy = next(n for n in model.graph.node if n.op_type == "Add")
    decoy.name = taken  # a real Add, named like the generated name of the unnamed MatMul
    onnx.save(model, str(path))
    _, keep = keep_json(tmp_path, path, "--for", "onnxconverter-common", "--trace")
    listed = [n["name"] for n in keep["nodes"]]
    assert listed[0] == taken + "~1" and keep["nodes"][0]["unnamed"] and keep["nodes"][0]["op"] == "MatMul"
    assert keep["verification"]["verified"]
    named = onnx.load(str(path))
    exec(_naming(keep["snippet"]), {"model": named})  # the loop the snippet runs before converting
    assert [n.name for n in named.graph.node if n.op_type == "MatMul" and n.name.startswith(taken)] == [taken + "~1"]
    assert sum(n.name == taken for n in named.graph.node) == 1  # the real Add keeps its name, alone
    assert keep["snippet_check"]["ran"] and keep["snippet_check"]["loads"]


@pytest.mark.requires("torch")
def test_pytorch_modules_and_torch_tensorrt_names(tmp_path):
    root = Path(__file__).resolve().parent.parent
    spec = f"{root}/fixtures/torch_src/hazards.py:hand_layernorm"
    _, keep = keep_json(tmp_path, spec, "--for", "pytorch")
    assert keep["arguments"]["modules"] == [""] and "def keep_in_fp32" in keep["snippet"]
    _parse_python(keep["snippet"])
    _, trt = keep_json(tmp_path, spec, "--for", "torch-tensorrt")
    assert "^add\\Z" in trt["arguments"]["nodes_to_exclude"]
    _parse_python(trt["snippet"])


# --- the real converters, where they install (a scratch environment: they are no dependency of precaudit) ------

@pytest.mark.parametrize("target", ["onnxconverter-common", "onnxruntime", "modelopt"])
def test_real_converters_turn_the_list_into_a_model_that_stays_finite(ffn_model, target, tmp_path):
    """Convert with and without the list, then trace the converted float16 model: without it the first inf
    starts at wo (PA906); with it, none."""
    _, keep = keep_json(tmp_path, ffn_model, "--for", target, "--trace")
    converted = {}
    for label, args in (("without", {}), ("with", keep["arguments"])):
        if target == "onnxconverter-common":
            float16 = pytest.importorskip("onnxconverter_common.float16")
            model = float16.convert_float_to_float16(onnx.load(str(ffn_model)), **args)
        elif target == "onnxruntime":
            onnx_model = pytest.importorskip("onnxruntime.transformers.onnx_model")
            wrapped = onnx_model.OnnxModel(onnx.load(str(ffn_model)))
            wrapped.convert_float_to_float16(keep_io_types=False, **{k: v for k, v in args.items() if v is not None})
            model = wrapped.model
        else:
            autocast = pytest.importorskip("modelopt.onnx.autocast")
            model = autocast.convert_to_mixed_precision(
                onnx_path=str(ffn_model), data_max=float("inf"),
                nodes_to_exclude=args.get("nodes_to_exclude"), op_types_to_exclude=args.get("op_types_to_exclude"))
        converted[label] = tmp_path / f"{label}.onnx"
        onnx.save(model, str(converted[label]))
    for label, expect in (("without", 1), ("with", 0)):
        out = tmp_path / f"{label}.json"
        main([str(converted[label]), "--trace", "--select", "PA906", "--format", "json", "-o", str(out)])
        assert len(json.loads(out.read_text())["results"]) == expect, label


def test_int16_scale_inputs_are_kept_float32_with_keep_io_types(tmp_path):
    """An audio front end on int16-scale samples, traced on real-shaped audio: the power overflows float16 (the
    first entry), and after that the error still enters at the Conv that reads the samples, which keep_io_types=False
    has rounded to float16 before any kept node sees them. The loop then keeps the inputs float32
    (keep_io_types=True) with their reader: verified, on the user's inputs, and the real converter's model agrees
    (error 0 against float32); exit 0. Before, it stopped with 'nothing left to keep' and exited 0 unverified."""
    from fixtures.keep_list_models import int16_audio, mel_front_end

    model, audio = mel_front_end(tmp_path / "mel.onnx"), int16_audio(tmp_path / "audio.npz")
    code, keep = keep_json(tmp_path, model, "--for", "onnxruntime", "--trace", "--inputs", audio, "--tolerance", "1e-4")
    assert code == 0 and keep["verification"]["verified"] and not keep["verification"]["synthesized"]
    assert keep["keep_io_types"] and keep["verification"]["keep_io_types"]
    assert [n["name"] for n in keep["nodes"]] == ["stft", "power", "t", "mel", "add_eps", "log"]
    assert "keep_io_types=True," in keep["snippet"]
    check = keep["snippet_check"]
    assert check["ran"] and check["loads"] and check["finite"] and check["error"] <= 1e-4
    inputs_entry = [e for e in keep["entries"] if "graph's float inputs ('x') and outputs" in e["reasons"][0]]
    assert len(inputs_entry) == 1 and not inputs_entry[0]["dropped"]
    # keep_io_types=False leaves 4.5e-4 of error however many nodes are kept: with the tolerance above that, the
    # samples' rounding is within it and no keep_io_types is asked for
    code, keep = keep_json(tmp_path, model, "--for", "onnxruntime", "--trace", "--inputs", audio)
    assert code == 0 and keep["verification"]["verified"] and not keep["keep_io_types"]
    assert "keep_io_types=False," in keep["snippet"]


def test_a_sum_of_exponentials_keeps_its_exp_and_the_sum(tmp_path):
    """PA216 spans the Exp and the sum: keeping only the ReduceSum would leave exp(x) to overflow in float16. On
    inputs where the sum's square passes 65504 (x in [9, 12]) the output itself needs float32: keep_io_types=True."""
    from fixtures.PA216_exp_sum_without_max import PARTITION, _with_axes

    path = save(_with_axes(PARTITION, "fp32"), tmp_path / "partition.onnx")
    code, keep = keep_json(tmp_path, path, "--for", "onnxruntime")
    assert code == 0 and [n["name"] for n in keep["nodes"]] == ["e", "z"] and keep["not_fixed"] == []
    assert keep["entries"][0]["reasons"] == ["PA216 exp-sum-without-max at 'z'"]
    code, keep = keep_json(tmp_path, path, "--for", "onnxruntime", "--trace", "--range", "x=9:12")
    assert code == SYNTHESIZED and keep["verification"]["verified"] and keep["keep_io_types"]
    assert [n["name"] for n in keep["nodes"]] == ["e", "z", "energy", "output"]
    assert keep["snippet_check"]["finite"] and keep["snippet_check"]["error"] == 0


ODD_NAMES = '''
import torch
from torch import nn


class Norm(nn.Module):
    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-12)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.add_module("(x|y)+", Norm())
        self.add_module("a[0]", Norm())
        self.add_module("q'x", Norm())
        self.d = nn.ModuleDict({"k-1": Norm()})

    def forward(self, x):
        x = getattr(self, "(x|y)+")(self.lin(x))
        return self.d["k-1"](getattr(self, "q'x")(getattr(self, "a[0]")(x)))


def make():
    torch.manual_seed(0)
    return Model(), (torch.randn(2, 8),)
'''


@pytest.mark.requires("torch")
def test_a_pytorch_snippet_runs_as_printed_on_modules_named_like_regexes(tmp_path):
    """Module names with brackets, bars, quotes and dashes: the printed wrapper reaches exactly those modules
    (get_submodule takes the name as the module holds it) and the half model then runs."""
    import torch
    (tmp_path / "odd.py").write_text(ODD_NAMES)
    _, keep = keep_json(tmp_path, f"{tmp_path}/odd.py:make", "--for", "pytorch")
    assert keep["arguments"]["modules"] == ["(x|y)+", "a[0]", "d.k-1", "q'x"]
    import importlib.util

    spec = importlib.util.spec_from_file_location("odd_names", tmp_path / "odd.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model, (x,) = module.make()
    wrapper = keep["snippet"].split("\n\n", 1)[1]  # the autocast wrapper, after the transformers lines
    exec(compile(wrapper, "<snippet>", "exec"), {"model": model})
    wrapped = sorted(name for name, m in model.named_modules() if "forward" in vars(m))
    assert wrapped == keep["arguments"]["modules"]
    assert model.lin.weight.dtype == torch.float16
    out = model(x.half())
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    names = [n for n, _ in model.named_modules() if n]
    for module, regex in zip(keep["arguments"]["modules"], keep["arguments"]["_keep_in_fp32_modules"]):
        assert [n for n in names if re.search(regex, n + ".")] == [module]  # transformers searches parameter names


def _norms_sharing_names(path: Path) -> Path:
    """Seven harmless ops, then a decomposed LayerNorm with eps 1e-12 (0.0 in fp16) whose nodes carry the same seven
    names (an exporter that names by op); a last node already named 'add_eps~1', which the renaming passes over."""
    names = ["mean", "sub", "sq", "var", "add_eps", "sqrt", "div"]
    nodes = [h.make_node("Relu", [f"r{i}"], [f"r{i + 1}"], name=name) for i, name in enumerate(names)]
    nodes += [h.make_node("ReduceMean", ["r7"], ["m"], name="mean", axes=[-1]),
              h.make_node("Sub", ["r7", "m"], ["d"], name="sub"),
              h.make_node("Mul", ["d", "d"], ["q"], name="sq"),
              h.make_node("ReduceMean", ["q"], ["v"], name="var", axes=[-1]),
              h.make_node("Add", ["v", "eps"], ["ve"], name="add_eps"),
              h.make_node("Sqrt", ["ve"], ["s"], name="sqrt"),
              h.make_node("Div", ["d", "s"], ["n"], name="div"),
              h.make_node("Relu", ["n"], ["y"], name="add_eps~1")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("r0", T.FLOAT, [2, 8])],
                         [h.make_tensor_value_info("y", T.FLOAT, [2, 8])],
                         [numpy_helper.from_array(np.array(1e-12, np.float32), "eps")])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)]), path)
    return path


@pytest.mark.parametrize("target", ["onnxconverter-common", "onnxruntime"])
def test_nodes_sharing_a_name_are_renamed_by_the_snippet_and_listed_so(tmp_path, target):
    """onnxruntime refuses two nodes of one name in a graph (the original model too), and a name-based block list
    cannot tell them apart: the snippet renames each repeat first, and only the second norm's nodes are listed."""
    model = _norms_sharing_names(tmp_path / "dup.onnx")
    code, keep = keep_json(tmp_path, model, "--for", target)
    assert code == 0 and keep["renamed_repeats"] is True
    second = ["mean~1", "sub~1", "sq~1", "var~1", "add_eps~2", "sqrt~1", "div~1"]
    assert keep["arguments"]["node_block_list"] == second
    names = ["mean", "sub", "sq", "var", "add_eps", "sqrt", "div"]
    assert [n["name_in_file"] for n in keep["nodes"]] == names
    assert keep["snippet_check"]["ran"] and keep["snippet_check"]["loads"]
    namespace: dict = {}
    start = keep["snippet"].index("# name the nodes")
    end = keep["snippet"].index("seen.add(node.name)\n", start) + len("seen.add(node.name)\n")
    named = namespace["model"] = onnx.load(model)
    exec(compile(keep["snippet"][start:end], "<snippet>", "exec"), namespace)  # the snippet's own naming loop
    assert [n.name for n in named.graph.node] == [*names, *second, "add_eps~1"]


@pytest.mark.requires("onnxruntime")
def test_an_error_no_float32_node_fixes_does_not_fail_the_list(tmp_path):
    """eps = inf divides every row by inf in float32 too: PA107 is 'not fixed by float32', said apart, and the
    converted model still having it does not make the verified list 'NOT verified' (exit 3: synthesized inputs)."""
    model = save(decomposed_layernorm(float("inf"), dtype="fp32")[0], tmp_path / "inf.onnx")
    code, keep = keep_json(tmp_path, model, "--for", "onnxruntime", "--trace")
    assert code == SYNTHESIZED and keep["verification"]["verified"] is True
    assert [f["rule_id"] for f in keep["not_fixed"]] == ["PA103", "PA107"]
    assert keep["snippet_check"]["loads"] is True and keep["snippet_check"]["errors"] == []
