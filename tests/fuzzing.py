"""Hostile-input fuzzing: hypothesis strategies that mutate valid models and rule files, and the one check.

Shared by the fast subset in tests/test_fuzz.py and the long run in benchmarks/fuzz_hostile.py. A case is the
bytes of a model (plus side files such as external data) or of a rule file, and the command line to run on it.
The check is what a CI user relies on: an exit code of 0, 1 or 2; on 2 exactly one stderr line, otherwise none;
never a traceback. 'internal error' lines are counted apart: they obey the contract but name a bug.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from fixtures.onnx_builders import chain_model, decomposed_layernorm, fused_norm, in_if_branch, log_of

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_MODEL = ROOT / "examples" / "tiny_block_fp16.onnx"


@dataclass
class Case:
    """Files to write into a fresh folder, and the arguments (file names relative to it) to run precaudit with."""

    files: dict[str, bytes]
    args: list[str]
    kind: str  # "model", "bytes", "rules", and fuzzing_surfaces.py's kinds
    notes: list[str] = field(default_factory=list)
    links: dict[str, str] = field(default_factory=dict)  # symlink name -> what it points at (relative)
    fifos: list[str] = field(default_factory=list)  # named pipes to make in the folder
    folders: list[str] = field(default_factory=list)  # sub-folders to make (a .git marks a project root)
    codes: tuple[int, ...] = (0, 1, 2)  # the exit codes the command may end with (keep-list and fix also say 3)
    parse: str | None = None  # a check of the output the case names (fuzzing_surfaces.check_output)
    models: int = 1  # models in the run: exit 2 says one line per model that failed


@dataclass
class Outcome:
    code: int | None
    stderr: str
    codes: tuple[int, ...] = (0, 1, 2)
    extra: str | None = None  # what a surface's own check found wrong (an input changed, an output unparsable)
    models: int = 1

    def problem(self) -> str | None:
        """Why this run breaks the contract, or None."""
        lines = self.stderr.splitlines()
        if self.extra:
            return self.extra
        if self.code not in self.codes:
            return f"exit code {self.code}"
        if "Traceback" in self.stderr:
            return "traceback"
        if self.code == 2 and not 1 <= len(lines) <= self.models:
            return f"exit 2 with {len(lines)} stderr lines"
        if self.code != 2 and lines and not all(_NOTE.match(line) for line in lines):
            return f"exit {self.code} with stderr"
        return None

    @property
    def internal(self) -> bool:
        return "internal error" in self.stderr


# what a run may say on stderr besides an error: the baseline it wrote
_NOTE = re.compile(r"precaudit: wrote \d+ findings? to the baseline ")


def run_case(case: Case, folder: Path) -> Outcome:
    """Write the case's files (and links, pipes, folders) into folder and run the CLI in this process, from that
    folder, capturing both streams; then check that every file the case gave is unchanged, and the case's output."""
    from precaudit.cli import main

    for name in case.folders:
        (folder / name).mkdir(parents=True, exist_ok=True)
    for name, data in case.files.items():
        (folder / name).write_bytes(data)
    for name, target in case.links.items():
        os.symlink(target, folder / name)
    for name in case.fifos:
        os.mkfifo(folder / name)
    args = [str(folder / a) if a in case.files else a for a in case.args]
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(args)
            except SystemExit as exc:  # main(argv) returns; an exit escaping it is itself a finding
                code = exc.code if isinstance(exc.code, int) else -1
    finally:
        os.chdir(here)
    changed = [name for name, data in case.files.items()
               if not (folder / name).is_file() or (folder / name).read_bytes() != data]
    extra = f"an input changed: {', '.join(changed)}" if changed else None
    if extra is None and case.parse is not None and code in (0, 1, 3):
        from tests.fuzzing_surfaces import check_output

        extra = check_output(case, folder, out.getvalue())
    return Outcome(code, err.getvalue(), case.codes, extra, case.models)


# ---- seeds: small valid models of the shapes the analyzer knows -------------------------------------------------


def _seeds() -> dict[str, onnx.ModelProto]:
    ln_const, _ = decomposed_layernorm(1e-12, dtype="fp16", eps_at="constant_cast")
    ln_fp32, _ = decomposed_layernorm(1e-5, dtype="fp32", eps_at="initializer", opset=18)
    softmax = chain_model([("Exp", ["x"], "e"), ("ReduceSum", ["e", "axes"], "s", {"keepdims": 1}),
                           ("Div", ["e", "s"], "p"), ("Log", ["p"], "l")], opset=18)
    softmax.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), "axes"))
    return {
        "ln_constant_cast": ln_const,
        "ln_fp32_opset18": ln_fp32,
        "fused_layernorm": fused_norm("LayerNormalization", epsilon=1e-12, stash_type=0),
        "log_softmax": log_of("Softmax"),
        "in_if": in_if_branch(log_of("Softmax", via_cast=True)),
        "naive_softmax": softmax,
    }


SEEDS = _seeds()
_SEED_BYTES = {name: m.SerializeToString() for name, m in SEEDS.items()}

# ---- hostile values -----------------------------------------------------------------------------------------------

HOSTILE_TEXT = st.one_of(
    st.sampled_from(["eps\nSECOND LINE", "\x1b[2J\n  error   PA000 FAKE", "\x01", "a\u202eb", "%0A::error::x",
                     "", "../../etc/passwd", "/dev/zero", "x" * 5000, "\ud800", "{eps:2000000000}", "%s%s%n"]),
    st.text(max_size=40),
)
BIG_INTS = st.sampled_from([0, 1, 2, 8, -1, -4, 2 ** 31, 2 ** 32, 2 ** 62, 2 ** 63 - 1, -2 ** 63])
OFFSETS = st.one_of(st.sampled_from(["-4", "abc", str(2 ** 62), "0", "4", "1e3", " 8", "", "٣"]),
                    st.integers(-10, 2 ** 40).map(str))
FLOATS = st.one_of(st.sampled_from([0.0, -0.0, 1e-12, 1e-45, 65504.0, 1e38, 3.5e38]),
                   st.floats(allow_nan=True, allow_infinity=True))


def _tensors(m: onnx.ModelProto) -> list[onnx.TensorProto]:
    found = list(m.graph.initializer)
    for node in _all_nodes(m.graph):
        found += [a.t for a in node.attribute if a.type == onnx.AttributeProto.TENSOR]
    return found


def _all_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    nodes, stack = [], [graph]
    while stack:
        g = stack.pop()
        for node in g.node:
            nodes.append(node)
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    stack.append(a.g)
                stack.extend(a.graphs)
    return nodes


# Each mutation edits the model in place (and may add side files); `draw` picks its choices.


def _pick(draw, items):
    """One of items, or None when a previous mutation left none."""
    items = list(items)
    return draw(st.sampled_from(items)) if items else None


def _mutate_dims(draw, m, files):
    t = _pick(draw, _tensors(m))
    if t is None:
        return
    del t.dims[:]
    t.dims.extend(draw(st.lists(BIG_INTS, max_size=4)))


def _mutate_data_type(draw, m, files):
    t = _pick(draw, _tensors(m))
    if t is None:
        return
    t.data_type = draw(st.one_of(st.integers(0, 30), st.sampled_from([99, 2 ** 31 - 1])))


def _mutate_raw(draw, m, files):
    t = _pick(draw, _tensors(m))
    if t is None:
        return
    try:
        raw = t.raw_data or numpy_helper.to_array(t).tobytes()
    except Exception:
        raw = b""
    t.raw_data = draw(st.one_of(st.just(raw[: len(raw) // 2]), st.just(raw * 3), st.binary(max_size=64)))
    t.ClearField("float_data")
    t.ClearField("int64_data")


def _mutate_external(draw, m, files):
    t = _pick(draw, m.graph.initializer)
    if t is None:
        return
    raw = t.raw_data
    t.ClearField("raw_data")
    t.data_location = T.EXTERNAL
    del t.external_data[:]
    location = draw(st.one_of(st.just("weights.bin"), HOSTILE_TEXT))
    entries = {"location": location}
    if draw(st.booleans()):
        entries["offset"] = draw(OFFSETS)
    if draw(st.booleans()):
        entries["length"] = draw(OFFSETS)
    for key, value in entries.items():
        e = t.external_data.add()
        e.key, e.value = key, value
    files["weights.bin"] = draw(st.one_of(st.just(raw * 2), st.binary(max_size=32)))


def _mutate_name(draw, m, files):
    node = _pick(draw, _all_nodes(m.graph))
    if node is None:
        return
    hostile = draw(HOSTILE_TEXT)
    if draw(st.booleans()):
        node.name = hostile
    elif node.output:  # rename one output: its readers now read an undefined name, unless renamed too
        old = node.output[0]
        node.output[0] = hostile
        if draw(st.booleans()):
            for other in _all_nodes(m.graph):
                other.input[:] = [hostile if i == old else i for i in other.input]


def _mutate_init_name(draw, m, files):
    init = _pick(draw, m.graph.initializer)
    if init is None:
        return
    hostile = draw(HOSTILE_TEXT)
    old, init.name = init.name, hostile
    for node in _all_nodes(m.graph):
        node.input[:] = [hostile if i == old else i for i in node.input]


def _mutate_attribute(draw, m, files):
    nodes = [n for n in _all_nodes(m.graph) if n.attribute]
    if not nodes:
        return
    node = draw(st.sampled_from(nodes))
    attr = draw(st.sampled_from(list(node.attribute)))
    value = draw(st.one_of(FLOATS, BIG_INTS, HOSTILE_TEXT, st.lists(BIG_INTS, max_size=3)))
    try:
        new = h.make_attribute(attr.name, value)
    except (ValueError, TypeError):
        return
    attr.CopyFrom(new)


def _mutate_op(draw, m, files):
    node = _pick(draw, _all_nodes(m.graph))
    if node is None:
        return
    node.op_type = draw(st.sampled_from(["Add", "Sqrt", "Log", "Softmax", "LayerNormalization", "Cast", "If", "Loop",
                                         "ReduceMean", "Clip", "Max", "Div", "Pow", "MyOp", "", "\x00"]))
    if draw(st.booleans()):
        node.domain = draw(st.sampled_from(["", "com.microsoft", "ai.onnx", "local", "\n"]))


def _mutate_inputs(draw, m, files):
    node = _pick(draw, _all_nodes(m.graph))
    if node is None:
        return
    choice = draw(st.sampled_from(["drop", "add", "empty", "self"]))
    if choice == "drop" and node.input:
        del node.input[-1]
    elif choice == "add":
        node.input.append(draw(st.sampled_from(["x", "y", "nowhere", ""])))
    elif choice == "empty" and node.input:
        node.input[0] = ""
    elif choice == "self" and node.output and node.input:
        node.input[0] = node.output[0]  # a node that reads its own output: a cycle


def _mutate_opset(draw, m, files):
    m.opset_import[0].version = draw(st.sampled_from([1, 6, 13, 17, 18, 23, 24, 99, -1, 2 ** 40]))


def _mutate_type(draw, m, files):
    vis = [*m.graph.input, *m.graph.output, *m.graph.value_info]
    vi = _pick(draw, vis)
    if vi is None:
        return
    if vi.type.HasField("tensor_type"):
        vi.type.tensor_type.elem_type = draw(st.integers(0, 30))
        if draw(st.booleans()):
            dims = vi.type.tensor_type.shape.dim
            del dims[:]
            for d in draw(st.lists(st.one_of(BIG_INTS, HOSTILE_TEXT), max_size=3)):
                new = dims.add()
                if isinstance(d, int):
                    new.dim_value = d
                else:
                    new.dim_param = d


MUTATIONS = [_mutate_dims, _mutate_data_type, _mutate_raw, _mutate_external, _mutate_name, _mutate_init_name,
             _mutate_attribute, _mutate_op, _mutate_inputs, _mutate_opset, _mutate_type]


@st.composite
def model_cases(draw, trace: bool | None = None) -> Case:
    """A seed model with one to four field mutations, audited statically or (small) traced."""
    name = draw(st.sampled_from(sorted(SEEDS)))
    m = onnx.ModelProto.FromString(_SEED_BYTES[name])
    files: dict[str, bytes] = {}
    notes = [name]
    for _ in range(draw(st.integers(1, 4))):
        mutation = draw(st.sampled_from(MUTATIONS))
        notes.append(mutation.__name__)
        try:
            mutation(draw, m, files)
        except (ValueError, TypeError, UnicodeError):  # protobuf refuses the value (a lone surrogate, an int64 overflow)
            notes.append("(refused by protobuf)")
    try:
        data = m.SerializeToString()
    except Exception:  # protobuf refuses some values (a lone surrogate in a string): not a file anyone can write
        data = _SEED_BYTES[name]
    files["model.onnx"] = data
    traced = draw(st.booleans()) if trace is None else trace
    args = ["model.onnx", "--format", draw(st.sampled_from(["text", "json", "sarif", "github", "junit"]))]
    if traced:
        args += ["--trace", "--trace-engine", draw(st.sampled_from(["numpy", "onnxruntime"])), "--dim", "batch=1"]
    return Case(files, args, "model", notes)


@st.composite
def byte_cases(draw) -> Case:
    """A seed model's bytes flipped, cut or spliced: the protobuf parser and everything after it."""
    data = bytearray(_SEED_BYTES[draw(st.sampled_from(sorted(SEEDS)))])
    for _ in range(draw(st.integers(1, 8))):
        at = draw(st.integers(0, max(0, len(data) - 1)))
        op = draw(st.sampled_from(["flip", "cut", "insert"]))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            del data[at: at + draw(st.integers(1, 16))]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
    return Case({"model.onnx": bytes(data)}, ["model.onnx"], "bytes")


# ---- rule files ---------------------------------------------------------------------------------------------------

_BASE_RULE = {
    "id": "XP901", "name": "fuzz-rule", "severity": "warning", "summary": "fuzzed",
    "sites": ["norm"], "condition": "eps_rounded == 0", "message": "eps {eps} in {dtype}", "fix": "raise it",
}
_ATOMS = st.sampled_from(["eps", "eps_rounded", "dtype", "smallest_normal", "1", "0", "1e308", "-1", "'x'", "[0]",
                          "2000000000", "10**10", "True", "None", "abs", "min", "()", "x.__class__", "'%d'"])
_BINOPS = st.sampled_from(["+", "-", "*", "/", "//", "%", "**", "<<", ">>", "and", "or", "<", "==", "!=", "in", "if"])


@st.composite
def _expressions(draw, depth: int = 0) -> str:
    if depth > 3 or draw(st.integers(0, 3)) == 0:
        return draw(_ATOMS)
    kind = draw(st.sampled_from(["bin", "unary", "call", "index", "deep"]))
    if kind == "bin":
        op = draw(_BINOPS)
        left, right = draw(_expressions(depth + 1)), draw(_expressions(depth + 1))
        return f"({left} if {right} else 0)" if op == "if" else f"({left} {op} {right})"
    if kind == "unary":
        return f"{draw(st.sampled_from(['not ', '-', '~', '+']))}{draw(_expressions(depth + 1))}"
    if kind == "call":
        return f"{draw(st.sampled_from(['abs', 'min', 'max', 'len', 'round', 'open', '__import__']))}" \
               f"({draw(_expressions(depth + 1))})"
    if kind == "index":
        return f"{draw(_expressions(depth + 1))}[{draw(_expressions(depth + 1))}]"
    n = draw(st.sampled_from([100, 1000, 10000]))
    return draw(st.sampled_from(["not " * n + "1", "-" * n + "1", " + ".join(["1"] * n), "(" * n + "1" + ")" * n]))


def _yaml_scalar(text: str) -> str:
    return "'" + text.replace("'", "''").replace("\n", " ") + "'"


@st.composite
def rule_cases(draw) -> Case:
    """A valid rule file with its condition, message, keys or bytes made hostile."""
    rule = dict(_BASE_RULE)
    extra = ""
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["condition", "message", "key", "alias", "nesting", "pattern", "bytes"]))
        if what == "condition":
            rule["condition"] = draw(_expressions())
        elif what == "message":
            rule["message"] = draw(st.sampled_from(["{eps:2000000000}", "{eps.__class__}", "{eps[0]}", "{}", "{",
                                                    "{eps:{eps}}", "{nope}", "%s", "{eps!r:>99999}"]))
        elif what == "key":
            key = draw(st.sampled_from(["sites", "ops", "params", "severity", "id", "name", "preview", "references"]))
            rule[key] = draw(st.sampled_from([5, {"a": 1}, ["nope"], None, "", [[]], True, "x" * 100]))
        elif what == "alias":
            extra += "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
                f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
                for p, c in zip("abcdefgh", "bcdefghi")) + "example: *i\n"
        elif what == "nesting":
            n = draw(st.sampled_from([50, 1000, 10000]))
            extra += "params: " + "[" * n + "]" * n + "\n"
        elif what == "pattern":
            n = draw(st.sampled_from([3, 400]))
            pattern = "Log"
            for _ in range(n):
                pattern = {"op": "Log", "inputs": [pattern]}
            rule.pop("sites", None)
            rule["pattern"] = pattern
        else:
            rule["summary"] = draw(st.sampled_from(["\xff\xfe", "\x00", "\ud800"]))
    text = "".join(f"{k}: {_yaml_value(v)}\n" for k, v in rule.items()) + extra
    data = text.encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 9)) == 0:
        data = data[: draw(st.integers(0, len(data)))] + draw(st.binary(max_size=8))
    args = draw(st.sampled_from([["rules", "--rules", "rule.yaml"],
                                 [str(EXAMPLE_MODEL), "--rules", "rule.yaml", "--select", "ALL"]]))
    return Case({"rule.yaml": data}, args, "rules")


def _yaml_value(value) -> str:
    import json
    if isinstance(value, str):
        return _yaml_scalar(value)
    return json.dumps(value, ensure_ascii=False)


def any_case() -> st.SearchStrategy[Case]:
    from tests.fuzzing_surfaces import surface_cases

    return st.one_of(model_cases(), byte_cases(), rule_cases(), surface_cases())


__all__ = ["SEEDS", "Case", "Outcome", "any_case", "byte_cases", "model_cases", "rule_cases", "run_case"]
