"""Deep graphs: thousands of nodes in a row, audited without an internal error.

Every walk along producers, consumers and bodies is iterative, so a graph far deeper than Python's recursion
limit audits like a short one. The chains here are 10,000 nodes long at the default recursion limit (1000):
any recursion along them would end in RecursionError, which the CLI reports as 'internal error'.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import jsonschema
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from precaudit.cli import main
from tests.helpers import SCHEMA

DEPTH = 10_000


def _audit(models: list, *args: str, tmp_path: Path, capsys) -> tuple[int, dict]:
    """Exit code and JSON report of `precaudit MODELS ARGS`, after checking stderr holds no internal error."""
    out = tmp_path / "report.json"
    code = main([*map(str, models), *args, "--format", "json", "-o", str(out)])
    err = capsys.readouterr().err
    assert "internal error" not in err, err
    assert "RecursionError" not in err, err
    report = json.loads(out.read_text())
    jsonschema.Draft7Validator(SCHEMA).validate(report)
    return code, report


def _found(report: dict) -> list[tuple[str, str]]:
    return sorted((r["rule_id"], r["node_name"]) for r in report["results"])


def _save(nodes, inits, path: Path, dtype: int = T.FLOAT, shape=(2, 8)) -> Path:
    graph = h.make_graph(nodes, "deep", [h.make_tensor_value_info("x", dtype, list(shape))],
                         [h.make_tensor_value_info("y", dtype, list(shape))], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _const(name: str, value: float, np_dtype=np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=np_dtype), name)


def test_the_chains_are_deeper_than_the_recursion_limit():
    assert 5 * sys.getrecursionlimit() < DEPTH


def _link(op: str, inputs: list, name: str, **attrs):
    """A node of the IR itself, with its output (for graphs no ONNX file can hold: cycles)."""
    from precaudit.ir import Node, Value

    node = Node(name=name, op_type=op, inputs=list(inputs), attrs=attrs)
    node.outputs = [Value(name=name, dtype="fp32", producer=node)]
    for v in inputs:
        v.consumers.append(node)
    return node.outputs[0]


def test_signs_of_loop_carried_values():
    """A value read again while its own sign is being worked out counts as 'unknown' for that read."""
    from precaudit.analysis.signs import SignAnalysis
    from precaudit.ir import Value

    x = Value(name="x", dtype="fp32", is_graph_input=True)
    relu = _link("Relu", [x], "relu")
    acc = _link("Add", [relu], "acc")
    acc.producer.inputs.append(acc)  # acc = relu + acc
    assert SignAnalysis().of(acc) == "unknown"
    # through an Exp: add = exp(add) + relu. From add, the Exp is positive whatever it reads, so add is too;
    # from the Exp's output, add reads the Exp back as 'unknown' while the Exp is on the path
    add = _link("Add", [relu], "add")
    exp = _link("Exp", [add], "exp")
    add.producer.inputs.insert(0, exp)
    signs = SignAnalysis()
    assert (signs.of(add), signs.of(exp)) == ("positive", "positive")
    signs = SignAnalysis()
    assert (signs.of(exp), signs.of(add)) == ("positive", "unknown")


def test_signs_along_a_chain_deeper_than_the_stack():
    from precaudit.analysis.signs import SignAnalysis
    from precaudit.ir import Value

    x = Value(name="x", dtype="fp32", is_graph_input=True)
    value = relu = _link("Relu", [x], "relu")
    for i in range(DEPTH):
        value = _link("Add" if i % 3 else "Identity", [value, relu] if i % 3 else [value], f"n{i}")
    assert SignAnalysis().of(_link("Neg", [value], "neg")) == "signed"
    assert SignAnalysis().of(value) == "nonneg"


# ---- a chain of Adds into a Log ---------------------------------------------------------------------------

# how the Log is guarded -> whether PA301 fires at it
_GUARDS = {
    # relu + relu + ... is >= 0 and 0 for an all-negative row: the Log is unguarded
    "none": True,
    # relu + 1e-4 is > 0, and so is every sum of it with relu: the eps guards the Log 10,000 Adds later
    "eps_first": False,
    # clamped at the end with a min that is a normal float16: guarded
    "clip_last": False,
    # clamped at the end with 1e-12, which is 0.0 in float16: the clamp guards nothing
    "clip_last_underflows": True,
}


def _add_chain_into_log(guard: str, path: Path) -> Path:
    nodes = [h.make_node("Relu", ["x"], ["r"], name="relu")]
    inits = [_const("eps", 1e-4), _const("lo", 1e-12 if guard == "clip_last_underflows" else 1e-4)]
    prev = "r"
    for i in range(DEPTH):
        other = "eps" if guard == "eps_first" and i == 0 else "r"
        nodes.append(h.make_node("Add", [prev, other], [f"a{i}"], name=f"add{i}"))
        prev = f"a{i}"
    if guard.startswith("clip_last"):
        nodes.append(h.make_node("Clip", [prev, "lo"], ["clipped"], name="clip"))
        prev = "clipped"
    nodes.append(h.make_node("Log", [prev], ["y"], name="log"))
    return _save(nodes, inits, path)


@pytest.mark.parametrize("guard", list(_GUARDS))
def test_chain_of_adds_into_log(guard, tmp_path, capsys):
    model = _add_chain_into_log(guard, tmp_path / "chain.onnx")
    code, report = _audit([model], "--dtype", "fp16", tmp_path=tmp_path, capsys=capsys)
    assert report["errors"] == []
    assert code == 0  # PA301 is a warning
    if _GUARDS[guard]:
        assert _found(report) == [("PA301", "log")]
        assert report["results"][0]["values"]["input_class"] == "nonneg"
    else:
        assert _found(report) == []


def test_chain_of_identities_and_casts_into_log(tmp_path, capsys):
    """Casts and Identities pass the sign through, and 'what feeds the Log' looks through all of them."""
    nodes = [h.make_node("Relu", ["x"], ["c0"], name="relu")]
    for i in range(DEPTH):
        op = h.make_node("Cast", [f"c{i}"], [f"c{i + 1}"], name=f"cast{i}", to=T.FLOAT) if i % 2 else \
            h.make_node("Identity", [f"c{i}"], [f"c{i + 1}"], name=f"id{i}")
        nodes.append(op)
    nodes.append(h.make_node("Log", [f"c{DEPTH}"], ["y"], name="log"))
    code, report = _audit([_save(nodes, [], tmp_path / "casts.onnx")], "--dtype", "fp16", tmp_path=tmp_path,
                          capsys=capsys)
    assert report["errors"] == [] and code == 0
    assert _found(report) == [("PA301", "log")]
    assert report["results"][0]["values"]["input_op"] == "Relu"
    assert report["results"][0]["values"]["input_class"] == "nonneg"


# ---- a chain into a decomposed LayerNorm ------------------------------------------------------------------


def _chain_into_layernorm(path: Path, eps: float, adds_before: int, casts_after_sqrt: int) -> Path:
    """x → adds_before Adds → ReduceMean → Sub → Pow(2) → ReduceMean → Add(eps) → Sqrt → casts_after_sqrt
    Identities/Casts → Div (the TorchScript exporter's LayerNorm), stored in float32 and audited for float16."""
    nodes, prev = [], "x"
    for i in range(adds_before):
        nodes.append(h.make_node("Add", [prev, "x"], [f"a{i}"], name=f"add{i}"))
        prev = f"a{i}"
    nodes += [
        h.make_node("ReduceMean", [prev], ["mean"], name="mean", axes=[-1]),
        h.make_node("Sub", [prev, "mean"], ["d"], name="sub"),
        h.make_node("Pow", ["d", "two"], ["d2"], name="pow"),
        h.make_node("ReduceMean", ["d2"], ["var"], name="var", axes=[-1]),
        h.make_node("Add", ["var", "eps"], ["ve"], name="add_eps"),
        h.make_node("Sqrt", ["ve"], ["s0"], name="sqrt"),
    ]
    for i in range(casts_after_sqrt):
        nodes.append(h.make_node("Cast", [f"s{i}"], [f"s{i + 1}"], name=f"cast{i}", to=T.FLOAT) if i % 2 else
                     h.make_node("Identity", [f"s{i}"], [f"s{i + 1}"], name=f"id{i}"))
    nodes += [h.make_node("Div", ["d", f"s{casts_after_sqrt}"], ["n"], name="div"),
              h.make_node("Identity", ["n"], ["y"], name="out")]
    inits = [_const("two", 2.0), _const("eps", eps)]
    return _save(nodes, inits, path)


@pytest.mark.parametrize("adds_before,casts_after_sqrt", [(DEPTH, 0), (0, DEPTH)],
                         ids=["adds_before_the_norm", "casts_between_sqrt_and_div"])
def test_chain_into_decomposed_layernorm(adds_before, casts_after_sqrt, tmp_path, capsys):
    """BERT's eps 1e-12 is 0.0 in float16 (PA101 at the Add that holds it), with 10,000 nodes before the norm or
    between its root and its division: the chain is still recognized, so the Div is the norm's, not a bare one
    (no PA303). PA208: the explicit square of the statistic overflows float16 for |x - mean| > 256."""
    model = _chain_into_layernorm(tmp_path / "ln.onnx", 1e-12, adds_before, casts_after_sqrt)
    code, report = _audit([model], "--dtype", "fp16", tmp_path=tmp_path, capsys=capsys)
    assert report["errors"] == []
    assert code == 1  # PA101 is an error
    assert _found(report) == [("PA101", "add_eps"), ("PA208", "add_eps")]
    values = next(r["values"] for r in report["results"] if r["rule_id"] == "PA101")
    assert values["norm"] == "LayerNorm" and values["eps_placement"] == "inside_sqrt" and values["eps_rounded"] == 0


def test_chain_into_decomposed_layernorm_with_a_normal_eps(tmp_path, capsys):
    """The twin with eps 1e-3, a normal float16 number: only the square's overflow is left."""
    model = _chain_into_layernorm(tmp_path / "ln.onnx", 1e-3, DEPTH, DEPTH)
    code, report = _audit([model], "--dtype", "fp16", tmp_path=tmp_path, capsys=capsys)
    assert report["errors"] == [] and code == 0
    assert _found(report) == [("PA208", "add_eps")]


# ---- traced mode along the chain --------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["numpy", "onnxruntime"])
def test_traced_chain_of_adds_into_log(engine, tmp_path, capsys):
    """Both engines run all 10,002 nodes (shapes (2, 8)) and find the Log's zeros."""
    if engine == "onnxruntime":
        pytest.importorskip("onnxruntime")
    model = _add_chain_into_log("none", tmp_path / "chain.onnx")
    code, report = _audit([model], "--dtype", "fp16", "--trace", "--trace-engine", engine, tmp_path=tmp_path,
                          capsys=capsys)
    assert report["errors"] == []
    assert report["trace"][0]["nodes"][engine] == DEPTH + 2
    # relu sums are 0 wherever x < 0: log(0) = -inf there (PA904), the first non-finite value (PA906)
    assert _found(report) == [("PA301", "log"), ("PA904", "log"), ("PA906", "log")]
    # the inputs were synthesized: the traced findings are warnings that say so, and nothing fails the run
    traced = [r for r in report["results"] if r["rule_id"] in ("PA904", "PA906")]
    assert [r["severity"] for r in traced] == ["warning", "warning"]
    assert all(r["message"].endswith("[on synthesized inputs only: a warning until your own --inputs show it]")
               for r in traced)
    assert code == 0


# ---- nested control flow ----------------------------------------------------------------------------------

NESTING = 30  # If inside If: protobuf refuses to parse a model nested much deeper (about 31 bodies)


def _nested_ifs(path: Path) -> Path:
    """NESTING Ifs, each in the then-branch of the one outside it; the innermost body takes log(relu(x)) of the
    top-level x, read by name across every level."""
    def out(name):
        return [h.make_tensor_value_info(name, T.FLOAT, [2, 8])]
    body = h.make_graph([h.make_node("Relu", ["x"], ["r"], name="relu"), h.make_node("Log", ["r"], ["o0"], name="log")],
                        "b0", [], out("o0"))
    for d in range(1, NESTING + 1):
        other = h.make_graph([h.make_node("Abs", ["x"], [f"e{d}"], name=f"abs{d}")], f"e{d}", [], out(f"e{d}"))
        node = h.make_node("If", ["cond"], [f"o{d}"], name=f"if{d}", then_branch=body, else_branch=other)
        body = h.make_graph([node], f"b{d}", [], out(f"o{d}"))
    nodes = [*body.node, h.make_node("Identity", [f"o{NESTING}"], ["y"], name="out")]
    graph = h.make_graph(nodes, "nested", [h.make_tensor_value_info("x", T.FLOAT, [2, 8]),
                                           h.make_tensor_value_info("cond", T.BOOL, [])], out("y"))
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.mark.requires("onnxruntime")
def test_nested_if_bodies(tmp_path, capsys):
    from precaudit.frontends.onnx import load_onnx
    from precaudit.ir import body_nodes, implicit_inputs

    model = _nested_ifs(tmp_path / "nested.onnx")
    graph = load_onnx(str(model))
    top = next(n for n in graph.nodes if n.name == f"if{NESTING}")
    inner = body_nodes(top)
    # each node followed by its own bodies' nodes, the bodies in the file's attribute order (else_branch first)
    expected = []
    for d in range(NESTING, 0, -1):
        expected += [f"abs{d}", f"if{d - 1}"] if d > 1 else ["abs1", "relu", "log"]
    assert [n.name.rpartition("/")[2] for n in inner] == expected
    assert [v.name for v in implicit_inputs(top)] == ["x", "cond"]  # the nested Ifs read cond by name too
    log = "/".join(f"if{d}/then_branch" for d in range(NESTING, 0, -1)) + "/log"
    code, report = _audit([model], tmp_path=tmp_path, capsys=capsys)
    assert report["errors"] == [] and code == 0
    assert _found(report) == [("PA301", log)]
    code, report = _audit([model], "--trace", "--trace-engine", "onnxruntime", tmp_path=tmp_path, capsys=capsys)
    assert report["errors"] == [] and code == 0  # found on synthesized inputs: a warning, not a failed run
    assert report["trace"][0]["nodes"] == {"onnxruntime": 2, "numpy": 0}  # the whole nest runs in one session
    assert _found(report) == [("PA301", log), ("PA906", f"if{NESTING}")]
    assert next(r["severity"] for r in report["results"] if r["rule_id"] == "PA906") == "warning"


# ---- a ResNet-152-deep CNN ----------------------------------------------------------------------------------

_RESNET = textwrap.dedent('''
    import torch
    from torch import nn


    class Bottleneck(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(c, c, 1), nn.BatchNorm2d(c)
            self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
            self.conv3, self.bn3 = nn.Conv2d(c, c, 1), nn.BatchNorm2d(c)

        def forward(self, x):
            h = torch.relu(self.bn1(self.conv1(x)))
            h = torch.relu(self.bn2(self.conv2(h)))
            return torch.relu(self.bn3(self.conv3(h)) + x)


    class DeepNet(nn.Module):
        """ResNet-152's depth: 50 bottleneck blocks with residual Adds, then a pooled linear softmax head."""

        def __init__(self, blocks=50, c=8, classes=10):
            super().__init__()
            self.stem = nn.Conv2d(3, c, 3, padding=1)
            self.blocks = nn.Sequential(*[Bottleneck(c) for _ in range(blocks)])
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.head = nn.Linear(c, classes)

        def forward(self, x):
            h = self.pool(self.blocks(torch.relu(self.stem(x)))).flatten(1)
            return torch.log(torch.softmax(self.head(h), -1))


    def factory():
        torch.manual_seed(0)
        return DeepNet().eval(), (torch.randn(1, 3, 8, 8),)
''')


@pytest.fixture
def resnet_py(tmp_path) -> Path:
    pytest.importorskip("torch")  # a fixture takes no marks: it skips as it is set up
    path = tmp_path / "model.py"
    path.write_text(_RESNET)
    return path


def _resnet_module(path: Path):
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace["factory"]()


@pytest.mark.requires("torch")
def test_resnet_depth_cnn_onnx_export(resnet_py, tmp_path, capsys):
    import contextlib
    import io
    import warnings

    import torch

    module, args = _resnet_module(resnet_py)
    path = tmp_path / "resnet.onnx"
    quiet = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), dynamo=False, opset_version=17)
    graph = onnx.load(str(path)).graph
    assert len(graph.node) >= 350 and sum(n.op_type == "Add" for n in graph.node) == 50
    code, report = _audit([path], "--dtype", "fp16", tmp_path=tmp_path, capsys=capsys)
    assert report["errors"] == []
    assert code == 0  # one warning
    assert [(r["rule_id"], r["op_type"]) for r in report["results"]] == [("PA201", "Log")]


@pytest.mark.slow  # a PyTorch capture or training step: seconds
def test_resnet_depth_cnn_factory(resnet_py, tmp_path, capsys):
    code, report = _audit([f"{resnet_py}:factory"], "--dtype", "fp16", tmp_path=tmp_path, capsys=capsys)
    assert report["errors"] == []
    assert code == 0
    assert [(r["rule_id"], r["op_type"]) for r in report["results"]] == [("PA201", "Log")]
