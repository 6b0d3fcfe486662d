"""keep-list --for coreml: coremltools' FP16ComputePrecision with an op_selector that leaves the listed ops in
float32, and its check: the printed snippet converts the model with the installed coremltools (it converts on
Linux), and in the program it makes every op the list names computes in float32. Core ML itself predicts on macOS
only, so the converted model is never run here: the check says so and keep-list exits 3.

What the names rest on (coremltools 9.0, converters/mil/frontend/torch/ops.py, read and measured here): the
torch.export frontend names the result of each graph node after the node (``res.name = node.name``,
``context.add(res, torch_name=node.name)``), so the op that writes a node's value has an output named like the
node; the op's own name may differ (a linear is op 'linear_0' writing 'linear'), and the ops FP16ComputePrecision
casts are renamed ('pow_1' becomes 'pow_1_cast_fp16'), so the selector tests the outputs' names, which it sees
before any renaming. precaudit names a PyTorch model's nodes after the same torch.export graph. Its passes may
merge a node into another (common-subexpression elimination), fold it (a .to(float32) of a float32 tensor) or fuse
it: then no op writes its name and the check lists it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from typing import TYPE_CHECKING

from ..converters import KeepArgs
from .child import run_child

if TYPE_CHECKING:
    from ..options import TorchOptions
    from . import KeepList
    from .snippet_run import SnippetCheck

__all__ = ["check_coreml", "kept_names", "paste_coreml"]

UNVERIFIED = "Core ML predicts on macOS only"


def kept_names(args: KeepArgs) -> list[str]:
    """The torch.export node names of the listed nodes (an op precaudit lowered a node into is named after it)."""
    from ..converters.pytorch import fx_name

    return list(dict.fromkeys(fx_name(n) for n in args.fx_nodes))


def _output_path(args: KeepArgs) -> str:
    if args.out_path is not None:
        return args.out_path
    stem = args.model.replace("\\", "/").rsplit("/", 1)[-1].rpartition(":")[2] or "model"
    return (stem[:-4] if stem.endswith(".pt2") else stem) + ".mlpackage"


def paste_coreml(args: KeepArgs) -> str:
    names = kept_names(args)
    keep = "{" + ", ".join(map(repr, names)) + "}" if names else "set()"
    return "\n".join([
        f"OUTPUT_PATH = {_output_path(args)!r}  # where the Core ML package is written: set it to your own path",
        "import coremltools as ct",
        "import torch",
        "",
        "# torch.export node names: coremltools' torch.export frontend names the value each node makes after it",
        f"KEEP = {keep}",
        "",
        "",
        "def in_float16(op):",
        "    \"\"\"FP16ComputePrecision's op_selector: True casts the op to float16; an op writing a kept value stays float32.\"\"\"",
        "    return not any(out.name in KEEP for out in op.outputs)",
        "",
        "",
        "# model: your torch.nn.Module in float32, in eval mode; inputs: a tuple of its example inputs",
        "exported = torch.export.export(model, inputs).run_decompositions({})",
        "mlmodel = ct.convert(exported, convert_to='mlprogram',",
        "                     compute_precision=ct.transform.FP16ComputePrecision(op_selector=in_float16))",
        "mlmodel.save(OUTPUT_PATH)"])


# Run before the printed snippet in keep-list's check: the model and inputs, from the program precaudit exported.
_PREAMBLE = """import torch
_program = torch.export.load({program!r})
model = _program.module()
inputs = _program.example_inputs[0]
"""
# Run after it: every op of the converted program, with the dtypes of its float inputs and outputs, as JSON.
_POSTAMBLE = """
import json as _json
from coremltools.converters.mil.mil import types as _types


def _blocks(block):
    for op in block.operations:
        yield op
        for inner in op.blocks:
            yield from _blocks(inner)


def _dtype(var):
    return _types.builtin_to_string(var.dtype) if hasattr(var, "dtype") else None


_ops = []
for _op in _blocks(mlmodel._mil_program.functions["main"]):
    _ins = [v for x in _op.inputs.values() for v in (x if isinstance(x, (list, tuple)) else [x])]
    _ops.append({"outputs": [[v.name, _dtype(v)] for v in _op.outputs], "inputs": [_dtype(v) for v in _ins]})
print(_json.dumps({"version": ct.__version__, "ops": _ops}))
"""
_FLOATS = {"fp16", "fp32", "fp64", "bf16"}


def check_coreml(keep: KeepList, torch_options: TorchOptions, render) -> SnippetCheck:
    """Run the printed snippet (render(args)) with the installed coremltools on the model exported in float32, and
    judge the program it converts to."""
    from .args import keep_args
    from .snippet_run import SnippetCheck

    try:
        found = importlib.util.find_spec("coremltools") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return SnippetCheck(False, "not run: coremltools is not installed, so the snippet was checked against "
                                   f"precaudit's model of Core ML only; {UNVERIFIED}")
    from ..frontends.torch_graph import exported_fp32

    program = exported_fp32(keep.model, torch_options)
    import dataclasses

    import torch

    args = keep_args(keep)
    with tempfile.TemporaryDirectory(prefix="precaudit-snippet-") as folder:
        saved = os.path.join(folder, "exported.pt2")
        torch.export.save(program, saved)
        script = os.path.join(folder, "snippet.py")
        out = os.path.join(folder, "converted.mlpackage")
        with open(script, "w", encoding="utf-8") as fh:
            fh.write(_PREAMBLE.format(program=saved) + render(dataclasses.replace(args, out_path=out)) + "\n"
                     + _POSTAMBLE)
        check = SnippetCheck(True, "ran with the installed coremltools", loader="coremltools")
        proc = run_child([script], check, "the snippet did not finish")
        if proc is None:
            return check
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        last = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        check.loads = False
        check.problem = "the snippet failed: " + (last[-1][:300] if last else f"exit code {proc.returncode}")
        return check
    _judge(json.loads(lines[-1]), kept_names(args), check)
    return check


def _judge(data: dict, names: list[str], check: SnippetCheck) -> None:
    """Every op writing a kept name computes in float32 (its float inputs and outputs); names no op writes are
    said, and a list none of whose names reaches an op is a problem."""
    check.loads = True
    writers: dict[str, list[dict]] = {}
    for op in data["ops"]:
        for name, _ in op["outputs"]:
            writers.setdefault(name, []).append(op)
    reached = [n for n in names if n in writers]
    narrow = [n for n in reached for op in writers[n]
              if any(t in _FLOATS and t != "fp32" for t in [*op["inputs"], *(d for _, d in op["outputs"])])]
    unreached = [n for n in names if n not in writers]
    if narrow:
        check.problem = f"coremltools computes {_shown(narrow)} in float16"
    elif names and not reached:
        check.problem = f"no op of the converted program writes {_shown(names)}: the selector keeps nothing"
    check.how = (f"converted with the installed coremltools {data['version']}: the {len(reached)} op"
                 f"{'s' * (len(reached) != 1)} writing a listed value compute in float32"
                 + (f"; no op writes {_shown(unreached)} (coremltools merged, folded or fused "
                    f"{'them' if len(unreached) > 1 else 'it'} into another op)" if unreached else ""))
    check.unverified = UNVERIFIED


def _shown(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
