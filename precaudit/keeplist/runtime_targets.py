"""keep-list --for tensorrt, dml, webgpu, qnn, coreml: the nodes to keep in float32 judged as that runtime computes
(--runtime defaults to it), printed in what the runtime honours.

- tensorrt, dml, webgpu: casts in the ONNX graph (casts.py) on a model stored in float16 or bfloat16; on a float32
  model, onnxruntime's float16 converter with the list as its node_block_list, which writes those casts itself.
  TensorRT also gets ModelOpt AutoCast's nodes_to_exclude, NVIDIA's own route (TensorRT 11.0.0 release notes).
- qnn: the float-fallback list with what it can and cannot do (runtime-facts §5 and §11: no per-node float32 on the
  HTP; see _QNN_WHY).
- coreml: a coremltools op_selector naming the ops after the torch.export nodes (coreml_snippet.py).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ..converters import PLAIN, Converter, KeepArgs, py_list
from ..errors import InputError
from ..escape import exact_regex

if TYPE_CHECKING:
    from ..deployment import Deployment
    from ..dtypes import Format
    from ..ir import Graph
    from . import KeepList
    from .snippet_run import Written

__all__ = [
    "CAST_TARGETS",
    "RUNTIME_OF",
    "arguments",
    "converter_after_load",
    "deployment_for",
    "paste",
    "written_check",
]

# --for → the runtime it keeps nodes for (as --runtime spells it)
RUNTIME_OF = {"tensorrt": "tensorrt", "coreml": "coreml", "qnn": "ort-qnn", "dml": "ort-dml", "webgpu": "ort-webgpu"}
CAST_TARGETS = ("tensorrt", "dml", "webgpu")  # casts written into the ONNX graph


def deployment_for(deployment: Deployment, target_for: str) -> Deployment:
    """The deployment a --for runtime target judges the model at: that runtime, at the version --runtime names (the
    newest modelled one without it). Another runtime in --runtime is a contradiction, said in one line."""
    from ..deployment import Deployment

    name = RUNTIME_OF.get(target_for)
    if name is None:
        return deployment
    given = deployment.runtime
    if given is not None:
        if given.name != name:
            raise InputError(None, f"--for {target_for} keeps nodes for {name}, not for --runtime {given.spelled}: "
                                   f"leave --runtime out, or name a version of {name} (--runtime {name}@VERSION)")
        return deployment
    return Deployment.named(deployment.fmt, deployment.converter, deployment.keep_fp32, name)


def converter_after_load(target_for: str, graph: Graph, target: Format, chosen: Converter) -> Converter:
    """The converter a cast target is verified with, once the model is read: none on a model already stored narrow
    (the snippet writes the casts), onnxruntime's float16 converter on a float32 one."""
    if target_for not in CAST_TARGETS:
        return chosen
    from ..analysis.stored import stored_in_target
    from ..converters.onnxruntime import CONVERTER
    from ..dtypes import FORMATS

    if any(stored_in_target(graph, FORMATS[n]) for n in ("fp16", "bf16")):
        return PLAIN
    if target.name != "fp16":
        raise InputError(graph.path, f"--for {target_for} on a float32 model converts it with onnxruntime's float16 "
                                     f"converter, which converts to float16 only, not {target.long_name}")
    return CONVERTER


def writes_casts(keep: KeepList) -> bool:
    """The snippet writes the casts itself (a model stored narrow), not onnxruntime's converter."""
    return keep.target_for in CAST_TARGETS and keep.converter.plain


def written_check(keep: KeepList) -> Written | None:
    """What keep-list's run of a cast target's snippet asks of the model it writes: audited at the runtime, the
    module the snippet imports, and every kept node reading float32 there. None for any other target."""
    from .casts import cast_plan
    from .render import keep_args
    from .snippet_run import RUNNABLE, Written

    if keep.target_for not in CAST_TARGETS:
        return None
    if writes_casts(keep):
        return Written(keep.runtime, "onnx", [p.name for p in cast_plan(keep)])
    return Written(keep.runtime, RUNNABLE["onnxruntime"], keep_args(keep).nodes)  # onnxruntime's converter


def paste(keep: KeepList, args: KeepArgs) -> str:
    from ..converters import onnxruntime
    from .casts import cast_plan, paste_casts

    target = keep.target_for
    if target == "qnn":
        return paste_qnn(args)
    if target == "coreml":
        from .coreml_snippet import paste_coreml

        return paste_coreml(args)
    title = keep.runtime.title if keep.runtime is not None else target
    code = paste_casts(args, cast_plan(keep), title) if writes_casts(keep) else onnxruntime.paste(args)
    if target == "tensorrt":
        code += "\n\n" + _autocast(keep, args)
    return code


def _autocast(keep: KeepList, args: KeepArgs) -> str:
    """ModelOpt AutoCast's nodes_to_exclude, commented out (the snippet above is what keep-list runs): on a float32
    model its whole call, on one already converted the list for the float32 model it was converted from."""
    from ..converters import modelopt

    top = _top_level(keep, args)
    if writes_casts(keep):
        lines = ["or, converting the float32 model this one was made from, ModelOpt AutoCast (NVIDIA's route to mixed",
                 "precision for TensorRT 11) with these nodes excluded, named as in this model:",
                 f"nodes_to_exclude={[exact_regex(n) for n in top]!r}"]
    else:
        lines = ["or ModelOpt AutoCast (NVIDIA's route to mixed precision for TensorRT 11), which writes the same casts:",
                 *modelopt.paste(dataclasses.replace(args, nodes=top)).split("\n")]
    return "\n".join("# " + line if line else "#" for line in lines)


def _top_level(keep: KeepList, args: KeepArgs) -> list[str]:
    """The listed names AutoCast can exclude: top-level nodes only (a body goes with its If/Loop)."""
    from .render import keep_args

    return keep_args(keep, top_level=True).nodes


# What the QNN list rests on (/work/notes/runtime-facts.md §5 rows 37-39 and §11): with QAIRT 2.35 and later the HTP
# computes float ops in float16 on SoCs with float support whatever enable_htp_fp16_precision says (onnxruntime-qnn
# PR #782, docs; #603: the option is a no-op), so a Cast to float32 before a node does not make it compute in float32
# there; the one provider option that would place single nodes elsewhere (op_affinity, onnxruntime-qnn PR #599) was
# closed unmerged. What remains is the CPU execution provider, by splitting the model.
_QNN_WHY = [
    "# onnxruntime QNN on the HTP keeps no single node in float32: with QAIRT 2.35 and later the HTP computes every",
    "# float op in float16, whatever enable_htp_fp16_precision says (onnxruntime-qnn PR #782 and #603), and a Cast to",
    "# float32 before a node does not change that; no provider option places single nodes on another device (the",
    "# op_affinity option of onnxruntime-qnn PR #599 was closed unmerged). These nodes compute in float32 only on the",
    "# CPU execution provider: split the model at them (onnx.utils.extract_model) and run the part that holds them in",
    "# an InferenceSession with providers=['CPUExecutionProvider'].",
]


def paste_qnn(args: KeepArgs) -> str:
    ops = [f"FLOAT_FALLBACK_OP_TYPES = {py_list(args.op_types)}  # every node of these types"] if args.op_types else []
    return "\n".join([*_QNN_WHY, f"FLOAT_FALLBACK = {py_list(args.nodes)}", *ops])


def arguments(keep: KeepList, args: KeepArgs) -> dict[str, Any]:
    """The target's arguments as data."""
    from .casts import cast_plan

    target = keep.target_for
    if target == "qnn":
        return {"float_fallback": args.nodes, "placement": "CPUExecutionProvider"}
    if target == "coreml":
        from .coreml_snippet import kept_names

        return {"op_selector_keeps": kept_names(args)}
    if writes_casts(keep):
        data: dict[str, Any] = {"casts": {p.name: {"inputs": p.inputs, "outputs": {str(i): t for i, t in
                                                                                  p.outputs.items()}}
                                          for p in cast_plan(keep)}}
    else:
        data = {"node_block_list": args.nodes}
    if target == "tensorrt":
        data["nodes_to_exclude"] = [exact_regex(n) for n in _top_level(keep, args)]
    return data
