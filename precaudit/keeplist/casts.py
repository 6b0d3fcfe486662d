"""keep-list --for tensorrt, dml and webgpu on a model already stored in float16 (or bfloat16): the casts written
into the ONNX graph, which is what these runtimes honour.

TensorRT 11 is strongly typed: a node computes in exactly the dtype its inputs are cast to (NvInfer.h v11.0,
runtime/tensorrt.py). DirectML ignores a LayerNormalization's stash_type and computes in its input's dtype
(DmlOperatorLayerNormalization.cpp, runtime/ort_dml.py); WebGPU runs an unfused LayerNorm op by op in the dtype each
op reads (issue #31626, runtime/ort_webgpu.py). On all three a node reads float32 only where the graph casts its
inputs to float32. The snippet (onnx's Python API) puts a Cast(to=FLOAT) before each float16 input of a kept node
and a Cast back after each of its float16 outputs, under the output's own name, so the nodes that are not kept, the
graph outputs and the value_info read what they read before; kept nodes pass float32 to each other directly.

Checked as printed: run, then onnx.checker and onnxruntime CPU load what it writes (a child each), and precaudit
reads it: every float input of each kept node must be float32 there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..converters import KeepArgs
from ..ir import duplicate_renames
from .child import run_child

if TYPE_CHECKING:
    from . import KeepList
    from .snippet_run import SnippetCheck

__all__ = ["CastPlan", "cast_plan", "check_written", "paste_casts"]

_NARROW = {"fp16": "FLOAT16", "bf16": "BFLOAT16"}
# ops whose output type an attribute sets, or that compute nothing on float data: no cast around them
_TYPED = {"Cast", "Constant", "ConstantOfShape", "RandomNormal", "RandomUniform", "RandomNormalLike",
          "RandomUniformLike", "EyeLike", "Bernoulli", "Multinomial", "Shape", "Size"}


@dataclass
class CastPlan:
    """One kept node: its name as the snippet finds it, the inputs cast to float32, the outputs cast back (to the
    ONNX type name the graph holds them in)."""

    name: str
    inputs: list[int]
    outputs: dict[int, str]


def cast_plan(keep: KeepList) -> list[CastPlan]:
    """Every node the list keeps (and the user's --keep-fp32 entries, and the nodes of a kept If's or Loop's bodies)
    that reads or makes a float16/bfloat16 value, in graph order. A control-flow node itself is not cast around:
    its bodies' nodes are, and its outputs keep their type."""
    from .args import raw_name

    resolver = keep.deployment.resolver(keep.graph, keep_nodes=keep.nodes)
    renames = duplicate_renames(keep.graph)
    plan = []
    for node in keep.graph.nodes:
        if node.bodies or node.op_type in _TYPED or resolver.kept_by(node) is None:
            continue
        inputs = [i for i, v in enumerate(node.inputs) if v is not None and v.dtype in _NARROW]
        outputs = {i: _NARROW[v.dtype] for i, v in enumerate(node.outputs) if v is not None and v.dtype in _NARROW}
        if inputs or outputs:
            plan.append(CastPlan(renames.get(id(node), raw_name(node)), inputs, outputs))
    return plan


def paste_casts(args: KeepArgs, plan: list[CastPlan], runtime: str) -> str:
    """Python (onnx only) that writes the casts into the model. Names are Python literals (repr)."""
    entries = [f"    {p.name!r}: ({p.inputs!r}, {{{', '.join(f'{i}: {t}' for i, t in p.outputs.items())}}}),"
               for p in plan]
    load = args.load() if args.in_memory else f"model = onnx.load({args.model!r})"
    lines = [f"OUTPUT_PATH = {args.out!r}  # where the model with the casts is written: set it to your own path",
             *(["import os"] if args.large else []),
             "import onnx",
             "from onnx import TensorProto, helper",
             "",
             load,
             *args.naming(),
             f"# {runtime} computes a node in the dtype its inputs are cast to: each kept node reads float32 (a Cast",
             "# before each float16 input) and its float16 outputs are cast back under their own names, for the nodes",
             "# that are not kept; kept nodes pass float32 to each other directly",
             "FLOAT16, BFLOAT16 = TensorProto.FLOAT16, TensorProto.BFLOAT16",
             "# node name: (the inputs cast to float32, {output: the type it is cast back to})",
             "KEEP = {", *entries, "}",
             *_APPLY,
             args.save()]
    return "\n".join(lines)


_APPLY = [
    "",
    "",
    "def every_graph(graph):",
    "    todo = [graph]",
    "    while todo:",
    "        g = todo.pop()",
    "        yield g",
    "        todo += [b for n in g.node for a in n.attribute for b in ([a.g] if a.HasField('g') else a.graphs)]",
    "",
    "",
    "taken = {name for g in every_graph(model.graph) for name in [*(v.name for v in g.input), *(t.name for t in",
    "         g.initializer), *(n.name for n in g.node), *(o for n in g.node for o in n.output)]}",
    "",
    "",
    "def fresh(base):  # a name no node or value of the model has",
    "    name, k = base, 0",
    "    while name in taken:",
    "        k += 1",
    "        name = f'{base}~{k}'",
    "    taken.add(name)",
    "    return name",
    "",
    "",
    "found = set()",
    "for g in every_graph(model.graph):",
    "    nodes, wide = [], {}  # wide: a value the graph holds narrow -> its float32 copy",
    "    for node in g.node:",
    "        if node.name not in KEEP:",
    "            nodes.append(node)",
    "            continue",
    "        found.add(node.name)",
    "        cast_in, cast_back = KEEP[node.name]",
    "        for i in cast_in:",
    "            value = node.input[i]",
    "            if value not in wide:",
    "                wide[value] = fresh(value + '_fp32')",
    "                nodes.append(helper.make_node('Cast', [value], [wide[value]], name=fresh(node.name + '_to_fp32'),",
    "                                              to=TensorProto.FLOAT))",
    "            node.input[i] = wide[value]",
    "        nodes.append(node)",
    "        for i, to in cast_back.items():",
    "            value = node.output[i]",
    "            wide[value] = node.output[i] = fresh(value + '_fp32')",
    "            nodes.append(helper.make_node('Cast', [wide[value]], [value], name=fresh(node.name + '_cast_back'),",
    "                                          to=to))",
    "    kept = [onnx.NodeProto() for _ in nodes]",
    "    for copy, node in zip(kept, nodes):",
    "        copy.CopyFrom(node)",
    "    del g.node[:]",
    "    g.node.extend(kept)",
    "missing = sorted(set(KEEP) - found)",
    "if missing:",
    "    raise SystemExit(f'no node named {missing} in the model: the list cannot be applied to it')",
]

# argv: the written model. onnx.checker's verdict: exit 3 with its message on stderr when it refuses the model.
_CHECKER = """
import sys
import onnx
try:
    onnx.checker.check_model(sys.argv[1])
except Exception as exc:
    sys.stderr.write(" ".join(str(exc).split()) or type(exc).__name__)
    sys.exit(3)
"""


def check_written(path: str, names: list[str], check: SnippetCheck, runtime: str) -> None:
    """onnx.checker accepts the written model (in a child), and each listed node reads only float32 there: fills
    check.problem where not, and says what was checked in check.how."""
    proc = run_child(["-c", _CHECKER, path], check, "onnx.checker did not finish with the written model")
    if proc is None:
        return
    if proc.returncode != 0:
        check.problem = "onnx.checker refuses the model the snippet writes: " + \
            (" ".join(proc.stderr.split())[:400] or f"exit code {proc.returncode}")
        return
    narrow = _narrow_reads(path, names, check)
    if check.problem is not None:
        return
    if narrow:
        shown = ", ".join(repr(n) for n in narrow[:3]) + (f" and {len(narrow) - 3} more" if len(narrow) > 3 else "")
        check.problem = f"in the written model {shown} still read{'s' * (len(narrow) == 1)} float16 or bfloat16"
        return
    listed = (f"each of the {len(names)} listed nodes reads" if len(names) > 1 else
              "the listed node reads" if names else "no node is listed")
    check.how += (f"; onnx.checker accepts its model, and {listed} float32 there; no {runtime} here, so what it "
                  "computes is emulated only")


def _narrow_reads(path: str, names: list[str], check: SnippetCheck) -> list[str]:
    """The listed nodes that read a float16 or bfloat16 input in the written model (a name it lacks is a problem)."""
    from ..audit_models import load_graph
    from ..errors import InputError
    from .args import raw_name

    try:
        graph = load_graph(path, None, "fp16")
    except InputError as exc:
        check.problem = "precaudit cannot read the written model: " + exc.problem.replace(path, "it")
        return []
    by_name: dict[str, list] = {}
    for node in graph.nodes:
        by_name.setdefault(raw_name(node), []).append(node)
    absent = [n for n in names if n not in by_name]
    if absent:
        check.problem = f"the written model has no node named {', '.join(repr(n) for n in absent[:3])}"
        return []
    return [n for n in names if any(v is not None and v.dtype in _NARROW for node in by_name[n] for v in node.inputs)]
