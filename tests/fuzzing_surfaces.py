"""Hostile-input fuzzing of the newer surfaces: output paths, names in every renderer, baselines, the pyproject,
several models in one run, and traced inputs that size a tensor.

Each strategy makes a tests.fuzzing.Case; run_case checks the common contract (exit code, one stderr line on 2, no
traceback), that every file the case gave is byte for byte unchanged (no output landed on an input), and, where the
case names one, a parse-back check of the output (check_output): the report parses in its format and the names in a
keep-list's regexes match exactly the nodes they name.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from tests.fuzzing import _SEED_BYTES, BIG_INTS, HOSTILE_TEXT, SEEDS, Case, _all_nodes

__all__ = [
    "baseline_cases",
    "check_output",
    "config_cases",
    "many_model_cases",
    "name_cases",
    "npz_cases",
    "output_cases",
    "surface_cases",
]

_MODEL = "fused_layernorm"  # a seed with an error finding (eps 1e-12 in a LayerNorm): every command has work

# ---- output paths -------------------------------------------------------------------------------------------------

# where -o may point: an input by another spelling, a link to it, a pipe, a device, a folder, or a plain new file
_TARGETS = ["model.onnx", "x/../model.onnx", "./model.onnx", "link.onnx", "dangling.onnx", "pipe", "/dev/null",
            ".", "sub", "rule.yaml", "sub/../rule.yaml", "new.out", "sub/new.out", "missing/new.out"]
_RULE = (b"id: XP902\nname: fuzz-out\nseverity: warning\nsummary: s\nsites: [norm]\ncondition: has_eps\n"
         b"message: m\nfix: f\n")


@st.composite
def output_cases(draw) -> Case:
    target = draw(st.sampled_from(_TARGETS))
    command = draw(st.sampled_from(["check", "fix", "keep-list", "baseline"]))
    base = ["--rules", "rule.yaml"]
    if command == "check":
        args = ["model.onnx", *base, "-o", target, "--format", draw(st.sampled_from(["text", "json", "sarif"]))]
    elif command == "fix":
        args = ["fix", "model.onnx", *base, "-o", target]
    elif command == "keep-list":
        args = ["keep-list", "model.onnx", *base, "--for", "modelopt", "-o", target]
    else:
        args = ["model.onnx", *base, "--write-baseline", target]
    return Case({"model.onnx": _SEED_BYTES[_MODEL], "rule.yaml": _RULE}, args, "outputs", [command, target],
                links={"link.onnx": "model.onnx", "dangling.onnx": "nowhere/model.onnx"}, fifos=["pipe"],
                folders=["sub"], codes=(0, 1, 2, 3))


# ---- names in every renderer ----------------------------------------------------------------------------------------

_NAMES = st.one_of(HOSTILE_TEXT, st.sampled_from([
    "a$", "^a", "a.b", "[0]+*", "(?P<x>)", "a|b", "\\", "\\x00", "a\n", "\n", "a\r\nb", "x\u2028y", "'", '"', "'''",
    "a\\Zb", "::error::", "</testcase>", "]]>", "<script>", "&amp;", "${{ secrets.X }}", "__import__('os')"]))
_FORMATS = ["text", "json", "sarif", "github", "junit", "html"]


@st.composite
def name_cases(draw) -> Case:
    """A seed model whose nodes (and values) are renamed with hostile text, duplicated names and names that look
    like the generated name of an unnamed node; a report in one format, or a keep-list for one converter."""
    name = draw(st.sampled_from(sorted(SEEDS)))
    m = onnx.ModelProto.FromString(_SEED_BYTES[name])
    nodes = _all_nodes(m.graph)
    notes = [name]
    for node in nodes:
        how = draw(st.sampled_from(["keep", "hostile", "empty", "duplicate", "generated"]))
        if how == "hostile":
            try:
                node.name = draw(_NAMES)
            except (ValueError, UnicodeError):  # a lone surrogate: protobuf refuses it
                how = "refused"
        elif how == "empty":
            node.name = ""
        elif how == "duplicate":
            node.name = nodes[0].name
        elif how == "generated":
            node.name = f"{node.op_type}_{node.output[0] if node.output else ''}"
        notes.append(how)
    try:
        data = m.SerializeToString()
    except Exception:  # a lone surrogate: no file can hold it
        data = _SEED_BYTES[name]
    if draw(st.booleans()):
        fmt = draw(st.sampled_from(_FORMATS))
        args = ["model.onnx", "--format", fmt, "-o", "report.out"]
        return Case({"model.onnx": data}, args, "names", notes, parse=f"report:{fmt}")
    target = draw(st.sampled_from(["modelopt", "onnxconverter-common", "onnxruntime", "olive"]))
    args = ["keep-list", "model.onnx", "--for", target, "--format", "json", "-o", "keep.json"]
    if draw(st.integers(0, 3)) == 0:
        args.append("--trace")
    return Case({"model.onnx": data}, args, "names", notes, codes=(0, 1, 2, 3), parse="keep-list")


_COMMAND = re.compile(r"^::(error|warning|notice) (?:[a-z]+=[^,:]*)(?:,[a-z]+=[^,:]*)*::[^\r\n]*$")


def _all_graphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    graphs, stack = [], [graph]
    while stack:
        g = stack.pop()
        graphs.append(g)
        stack += [a.g for n in g.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH]
        stack += [b for n in g.node for a in n.attribute for b in a.graphs]
    return graphs


def _node_names(model_path: Path) -> list[str]:
    """Every node's name after a snippet's naming loop: the file's own, and precaudit's for the unnamed ones."""
    from precaudit.ir import generated_name

    m = onnx.load(str(model_path), load_external_data=False)
    taken = {n.name for n in _all_nodes(m.graph) if n.name}
    names = []
    for graph in _all_graphs(m.graph):  # a name its graph already has: name~1, name~2 ... past the file's names
        seen: set[str] = set()
        last: dict[str, int] = {}
        for n in graph.node:
            if not n.name:
                names.append(generated_name(n.op_type, n.output[0] if n.output else "", taken))
            elif n.name in seen:
                k = last.get(n.name, 0) + 1
                while f"{n.name}~{k}" in taken:
                    k += 1
                last[n.name] = k
                names.append(f"{n.name}~{k}")
            else:
                seen.add(n.name)
                names.append(n.name)
    return names


def check_output(case: Case, folder: Path, stdout: str) -> str | None:
    """What is wrong with the output the case names, or None: it must parse in its format, and a keep-list's
    regexes each match exactly one distinct node name (re.match, as the converters use them)."""
    kind, _, fmt = (case.parse or "").partition(":")
    try:
        if kind == "report":
            text = (folder / "report.out").read_bytes().decode("utf-8")
            if fmt in ("json", "sarif"):
                json.loads(text)
            elif fmt == "junit":
                from xml.etree import ElementTree as ET

                ET.fromstring(text)
            elif fmt == "github":  # a line that starts a workflow command is one precaudit means, well formed
                bad = [line for line in text.splitlines() if line.startswith("::") and not _COMMAND.match(line)]
                if bad:
                    return f"github annotations: a malformed workflow command: {bad[0][:80]!r}"
            return None  # text and html: they decode (the HTML page's escaping has its own tests)
        if kind == "keep-list":
            doc = json.loads((folder / "keep.json").read_bytes().decode("utf-8"))
            names = _node_names(folder / "model.onnx")
            for regex in doc.get("arguments", {}).get("nodes_to_exclude", []):
                matched = {n for n in names if re.match(regex, n)}
                if len(matched) != 1:
                    return f"keep-list regex {regex!r} matches {sorted(matched)[:3]!r}"
            for entry in doc.get("nodes", []):
                if entry["name"] not in names:
                    return f"keep-list names {entry['name']!r}, which no node is called (named as the snippet names)"
            return None
        if kind == "many":
            doc = json.loads(stdout)
            wrong = [e["file"] for e in doc["errors"] if not str(e["file"]).endswith("bad.onnx")]
            return f"an error on a model that is fine: {wrong}" if wrong else None
    except (ValueError, UnicodeDecodeError, OSError, KeyError, TypeError) as exc:
        return f"{case.parse} output does not parse back: {type(exc).__name__}: {str(exc)[:120]}"
    return None


# ---- baselines and the pyproject --------------------------------------------------------------------------------------

_JSON_ATOMS = st.one_of(st.sampled_from(["", "PA101", "x" * 300, "\u0000", "\ud800"]), HOSTILE_TEXT, BIG_INTS,
                        st.floats(allow_nan=True), st.booleans(), st.none())


@st.composite
def baseline_cases(draw) -> Case:
    """A baseline file: valid, or with wrong types, huge integers, deep nesting, bracket floods and cut bytes."""
    entry = {"fingerprint": "0" * 16, "rule_id": "PA101", "model": "model.onnx", "node_name": "norm", "message": "m"}
    how = draw(st.sampled_from(["valid", "types", "bigint", "deep", "brackets", "cut", "format", "many"]))
    doc: object = {"format": "precaudit-baseline/1", "tool_version": "0", "findings": [entry]}
    text = None
    if how == "types":
        key = draw(st.sampled_from(sorted(entry)))
        doc = {"format": "precaudit-baseline/1", "findings": [{**entry, key: draw(_JSON_ATOMS)}]}
    elif how == "bigint":
        text = '{"format": "precaudit-baseline/1", "findings": [{"n": ' + "9" * draw(st.sampled_from([20, 5000, 100000])) + "}]}"
    elif how == "deep":
        n = draw(st.sampled_from([100, 10000, 100000]))
        text = '{"format": "precaudit-baseline/1", "findings": ' + "[" * n + "]" * n + "}"
    elif how == "brackets":
        text = '{"format": "precaudit-baseline/1", "findings": [' + ",".join([draw(st.sampled_from(["[]", "{}"]))] * 50000) + "]}"
    elif how == "format":
        doc = {"format": draw(_JSON_ATOMS), "findings": draw(st.sampled_from([[], {}, "x", None]))}
    elif how == "many":
        doc = {"format": "precaudit-baseline/1", "findings": [entry] * draw(st.sampled_from([1000, 50000]))}
    if text is None:
        text = json.dumps(doc, ensure_ascii=False)
    data = text.encode("utf-8", "surrogatepass")
    if how == "cut":
        data = data[: draw(st.integers(0, len(data)))]
    args = ["model.onnx", "--baseline", "baseline.json", "--format", draw(st.sampled_from(["text", "json"]))]
    return Case({"model.onnx": _SEED_BYTES[_MODEL], "baseline.json": data}, args, "baseline", [how])


_TOML_KEYS = ["dtype", "fail-on", "select", "ignore", "keep-fp32", "rules", "baseline", "converter", "format",
              "per-model-ignores", "per-node-ignores", "preview", "check-weights", "autocast", "samples", "nope"]
_TOML_VALUES = st.sampled_from([
    '"fp16"', '"\\u001b[2J"', '"a\\nb"', '"\\u202e"', "1" * 5000, "-1", "1e999", "true", "[]", '["PA101", 1]',
    '{"a" = ["PA101"]}', '{"*" = "PA101"}', '"' + "x" * 5000 + '"', "[" * 200 + "]" * 200, '"../../etc/passwd"',
    '"/dev/zero"', "inf", "nan", '{"a\\u0000" = ["PA1\\n01"]}', '"ALL"', "[[1, 2], [3]]"])


@st.composite
def config_cases(draw) -> Case:
    """A pyproject.toml in a project folder (.git) with hostile values, read by a check or by --show-settings."""
    lines = ["[project]", "name = 'x'", "", "[tool.precaudit]"]
    for _ in range(draw(st.integers(1, 4))):
        lines.append(f"{draw(st.sampled_from(_TOML_KEYS))} = {draw(_TOML_VALUES)}")
    data = "\n".join(lines).encode()
    if draw(st.integers(0, 5)) == 0:
        data = data[: draw(st.integers(0, len(data)))] + draw(st.binary(max_size=4))
    args = draw(st.sampled_from([["--show-settings"], ["model.onnx"], ["model.onnx", "--format", "json"]]))
    return Case({"model.onnx": _SEED_BYTES[_MODEL], "pyproject.toml": data}, args, "config", [], folders=[".git"])


# ---- several models in one run --------------------------------------------------------------------------------------


@st.composite
def many_model_cases(draw) -> Case:
    """A good model beside a broken one (cut or flipped bytes, or a model whose graph a traced run cannot run):
    the good one's findings are reported and only the broken one has an error."""
    bad = bytearray(_SEED_BYTES[draw(st.sampled_from(sorted(SEEDS)))])
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, max(0, len(bad) - 1)))
        if bad:
            bad[at] ^= 1 << draw(st.integers(0, 7))
    order = draw(st.sampled_from([["good.onnx", "bad.onnx"], ["bad.onnx", "good.onnx"]]))
    args = [*order, "-j", draw(st.sampled_from(["1", "2"])), "--format", "json"]
    if draw(st.booleans()):
        args += ["--trace", "--dim", "batch=1"]
    return Case({"good.onnx": _SEED_BYTES[_MODEL], "bad.onnx": bytes(bad)}, args, "many", [], parse="many", models=2)


# ---- traced inputs that size a tensor ----------------------------------------------------------------------------------


def _sized_model() -> bytes:
    """y = x + sum(ConstantOfShape(n)) + sum(Range(0, m, 1)): an int64 input's values size two tensors."""
    nodes = [h.make_node("ConstantOfShape", ["n"], ["z"], name="zeros",
                         value=numpy_helper.from_array(np.array([1.0], np.float32))),
             h.make_node("ReduceSum", ["z"], ["s"], name="sum", keepdims=0),
             h.make_node("Cast", ["m"], ["mf"], name="limit", to=T.FLOAT),
             h.make_node("Range", ["zero", "mf", "one"], ["r"], name="range"),
             h.make_node("ReduceSum", ["r"], ["rs"], name="rsum", keepdims=0),
             h.make_node("Add", ["x", "s"], ["xs"], name="add"), h.make_node("Add", ["xs", "rs"], ["y"], name="add2")]
    graph = h.make_graph(nodes, "sized", [h.make_tensor_value_info("x", T.FLOAT, [1]),
                                          h.make_tensor_value_info("n", T.INT64, [2]),
                                          h.make_tensor_value_info("m", T.INT64, [])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1])],
                         [numpy_helper.from_array(np.array(0, np.float32), "zero"),
                          numpy_helper.from_array(np.array(1, np.float32), "one")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


_SIZED = _sized_model()
_SIZES = st.sampled_from([0, 1, 3, -1, 1000, 2 ** 20, 2 ** 31, 2 ** 40, 2 ** 62])


@st.composite
def npz_cases(draw) -> Case:
    buf = io.BytesIO()
    arrays = {"x": np.ones(1, np.float32), "n": np.array([draw(_SIZES), draw(_SIZES)], np.int64),
              "m": np.array(draw(_SIZES), np.int64)}
    np.savez(buf, **arrays)
    args = ["model.onnx", "--trace", "--inputs", "in.npz", "--trace-engine", draw(st.sampled_from(["numpy", "onnxruntime"]))]
    return Case({"model.onnx": _SIZED, "in.npz": buf.getvalue()}, args, "npz", [str(arrays["n"]), str(arrays["m"])])


def surface_cases() -> st.SearchStrategy[Case]:
    return st.one_of(output_cases(), name_cases(), baseline_cases(), config_cases(), many_model_cases(), npz_cases())
