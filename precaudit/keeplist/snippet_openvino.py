"""keep-list --for openvino's snippet checked as printed: a child Python with the installed openvino reads the IR the
snippet wrote and compiles it for the CPU, and the IR must keep in float32 the layers of exactly the listed nodes
(DisablePrecisionConversion on them) and their float weights; the other weights are counted: float16, or float32
where OpenVINO keeps them itself. No GPU here: what the IR computes in float16 is emulated, never run."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .child import run_child

if TYPE_CHECKING:
    from .snippet_run import SnippetCheck

__all__ = ["check_ir"]


# argv: the IR's .xml. Prints the IR's layers as JSON; exit 3 when OpenVINO cannot read it, 4 when the CPU plugin
# cannot compile it (the message on stderr).
_READER = """
import json, sys
import openvino as ov

def all_ops(model, parent=None):
    for op in model.get_ordered_ops():
        yield op, parent
        kind = op.get_type_name()
        bodies = [op.get_then_body(), op.get_else_body()] if kind == "If" else \
            [op.get_function()] if kind in ("Loop", "TensorIterator") else []
        for body in bodies:
            yield from all_ops(body, op.get_name())

core = ov.Core()
try:
    model = core.read_model(sys.argv[1])
except Exception as exc:
    sys.stderr.write(" ".join(str(exc).split()) or type(exc).__name__)
    sys.exit(3)
layers = []
for op, parent in all_ops(model):
    outs = op.outputs()
    layers.append({"id": op.get_name(), "type": op.get_type_name(), "parent": parent,
                   "names": sorted({n for o in outs for n in o.get_names()}),
                   "types": [o.get_element_type().get_type_name() for o in outs],
                   "kept": "DisablePrecisionConversion_0" in op.get_rt_info(),
                   "inputs": [i.get_source_output().get_node().get_name() for i in op.inputs()],
                   "readers": sorted({i.get_node().get_name() for o in outs for i in o.get_target_inputs()})})
try:
    core.compile_model(model, "CPU")
except Exception as exc:
    sys.stderr.write(" ".join(str(exc).split()) or type(exc).__name__)
    sys.exit(4)
print(json.dumps({"version": ov.get_version().split("-")[0], "layers": layers}))
"""
_FLOATS = {"f32", "f16", "bf16", "f64"}


def check_ir(path: str, keep: dict[str, list[str]], check: SnippetCheck) -> None:
    """Read the IR at path (in a child) and fill check: loads, problem, how."""
    proc = run_child(["-c", _READER, path], check, "OpenVINO did not finish reading the IR")
    if proc is None:
        return
    if proc.returncode != 0:
        # loads stays None: the lists keep-list tries where onnxruntime refuses a model (without control flow) are
        # about onnxruntime's converters, not an IR
        what = "read" if proc.returncode == 3 else "compile for the CPU"
        check.problem = f"OpenVINO cannot {what} the IR the snippet writes: " + \
            (" ".join(proc.stderr.split())[:400] or f"exit code {proc.returncode}")
        return
    check.loads = True
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    check.how = f"ran with the installed openvino {data['version']}; {_judge(data['layers'], keep, check)}"


def _judge(layers: list[dict], keep: dict[str, list[str]], check: SnippetCheck) -> str:
    """The kept layers against the list: each listed node's, no other, and their float weights float32 (a problem
    where not); returns what the IR keeps, in words."""
    by_id = {layer["id"]: layer for layer in layers}
    owner = {tensor: node for node, tensors in keep.items() for tensor in tensors}
    marked: set[str] = set()
    strays, weights, compressed = [], set(), []
    for layer in layers:
        if not layer["kept"] or layer["type"] in ("Constant", "Parameter", "Result"):  # (layers that compute)
            continue
        nodes = _nodes_of(layer, by_id, owner)
        if not nodes:
            strays.append(layer["id"])
        marked |= nodes
        for source in (by_id[i] for i in layer["inputs"]):
            if source["type"] == "Constant" and source["types"][0] in _FLOATS:
                weights.add(source["id"])
            elif source["type"] == "Convert" and by_id[source["inputs"][0]]["type"] == "Constant":
                compressed.append(layer["id"])  # a float16 Const and the Convert that decompresses it
    missing = [n for n in keep if n not in marked]
    floats = [layer for layer in layers if layer["type"] == "Constant" and layer["types"][0] in _FLOATS
              and layer["id"] not in weights]
    others = sum(layer["types"][0] == "f32" for layer in floats)
    problems = []
    if missing:
        problems.append(f"the IR keeps no layer of {_shown(missing)} in float32")
    if strays:
        problems.append(f"the IR keeps layers the list does not name in float32 ({_shown(strays)})")
    if compressed:
        problems.append(f"the weights of {_shown(compressed)} were compressed to float16")
    check.problem = "; ".join(problems) or None
    return (f"the IR keeps the layers of the {len(marked)} listed node{'s' * (len(marked) != 1)} and their "
                 f"{len(weights)} float weight{'s' * (len(weights) != 1)} in float32, {len(floats) - others} other "
                 f"weight{'s' * (len(floats) - others != 1)} float16"
                 + (f" and {others} float32 as OpenVINO keeps them itself (its own marks, a scalar float16 cannot "
                    "hold, a constant mostly beyond float16)" if others else "")
                 + "; no GPU here: what it computes in float16 is emulated only")


def _nodes_of(layer: dict, by_id: dict[str, dict], owner: dict[str, str]) -> set[str]:
    """The listed nodes a layer is made of: by its tensors, else (a layer in an If or Loop body) the control-flow
    layer's."""
    while True:
        nodes = {owner[n] for n in _named_below(layer, by_id) if n in owner}
        if nodes or layer["parent"] is None:
            return nodes
        layer = by_id[layer["parent"]]


def _named_below(layer: dict, by_id: dict[str, dict]) -> list[str]:
    """The tensor names of a layer, or of the first named layers below it: a node OpenVINO made several layers of
    names only the last one's outputs."""
    todo, seen = [layer], set()
    while todo:
        current = todo.pop()
        if current["names"]:
            return current["names"]
        seen.add(current["id"])
        todo += [by_id[r] for r in current["readers"] if r not in seen and by_id[r]["type"] != "Result"]
    return []


def _shown(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")
