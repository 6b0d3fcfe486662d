"""A keep-list as people read it (text, with the arguments ready to paste) and as scripts read it (JSON)."""

from __future__ import annotations

import json
import re
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from ..converters import KeepArgs, modelopt, onnxconverter_common, onnxruntime, openvino, pytorch
from ..escape import exact_regex, printable
from ..ir import Node, duplicate_renames

if TYPE_CHECKING:
    from . import KeepList

__all__ = ["is_unnamed", "keep_args", "raw_name", "render_json", "render_text"]

SCHEMA_VERSION = 1


def raw_name(node: Node) -> str:
    """The node's name as the file spells it (a body node's IR name carries its If/Loop path first)."""
    path = node.subgraph_path
    return node.name[len(path):] if path and node.name.startswith(path) else node.name


def is_unnamed(node: Node) -> bool:
    """Whether the file gives the node no name: precaudit then names it (ir.generated_name), and so do the lists,
    after the naming loop they come with."""
    return node.unnamed


def _top(node: Node) -> Node:
    while node.parent is not None:
        node = node.parent
    return node


def keep_args(keep: KeepList, top_level: bool = False) -> KeepArgs:
    """The nodes and op types a converter's arguments name: the list, plus the user's own --keep-fp32 entries.
    top_level: a body's node named by its If/Loop (AutoCast classifies top-level nodes only)."""
    graph_ops = {n.op_type for n in keep.graph.nodes}
    op_types = [e for e in keep.keep_fp32 if e in graph_ops]
    patterns = [e for e in keep.keep_fp32 if e not in graph_ops]
    ids = {id(n) for n in keep.nodes}
    nodes = [n for n in keep.graph.nodes
             if id(n) in ids or any(fnmatchcase(n.name, p) or (n.scope and fnmatchcase(n.scope, p)) for p in patterns)]
    if keep.target_for == "modelopt" or top_level:  # AutoCast classifies top-level nodes only: a body goes with its If/Loop
        nodes = list({id(t): t for t in map(_top, nodes)}.values())
    renames = duplicate_renames(keep.graph)
    return KeepArgs(model=keep.model, in_memory=keep.in_memory, dtype=keep.target.name,
                    nodes=[renames.get(id(n), raw_name(n)) for n in nodes],
                    outputs=[[v.name for v in n.outputs if v is not None and v.name] for n in nodes],
                    op_types=op_types, unnamed=any(is_unnamed(n) for n in nodes), duplicates=bool(renames),
                    large=keep.large,
                    modules=sorted({n.scope or "" for n in nodes}),
                    fx_nodes=[keep.graph.fx_names.get(n.name, n.name) for n in nodes],
                    keep_io=keep.keep_io)


def quant_patterns(keep: KeepList) -> list[str]:
    """ModelOpt quant_cfg keys that leave each kept node unquantized: its module path where the graph knows it (an
    export's scope, what ModelOpt's quantizer names start with), else its node name; wildcards in it escaped."""
    names = [_WILDCARD.sub(r"[\1]", n.scope or raw_name(n)) for n in keep.nodes]
    return list(dict.fromkeys(f"*{name}*" for name in names))


_WILDCARD = re.compile(r"([*?[])")


def snippet(keep: KeepList, args: KeepArgs) -> str:
    from .runtime_targets import RUNTIME_OF, paste

    target = keep.target_for
    if target in RUNTIME_OF:
        return paste(keep, args)
    if target == "onnxconverter-common":
        return onnxconverter_common.paste(args)
    if target == "onnxruntime":
        return onnxruntime.paste(args)
    if target == "olive":
        return onnxruntime.paste_olive(args)
    if target == "modelopt":
        return modelopt.paste(args)
    if target == "torch-tensorrt":
        return pytorch.paste_torch_tensorrt(args)
    if target == "openvino":
        return openvino.paste(args)
    if target == "modelopt-quant":
        return modelopt.paste_quant(args.dtype, quant_patterns(keep))
    return pytorch.paste_hf(args) + "\n\n" + pytorch.paste_autocast(args)


def arguments(keep: KeepList, args: KeepArgs) -> dict[str, Any]:
    """The converter's arguments as data."""
    from . import runtime_targets

    target = keep.target_for
    if target in runtime_targets.RUNTIME_OF:
        return runtime_targets.arguments(keep, args)
    if target == "onnxconverter-common":
        return {"op_block_list": [*onnxconverter_common.DEFAULT_OP_BLOCK_LIST, *args.op_types],
                "node_block_list": args.nodes}
    if target in ("onnxruntime", "olive"):
        ops = [*onnxruntime.DEFAULT_OP_BLOCK_LIST, *args.op_types] if args.op_types else None
        return {"op_block_list": ops, "node_block_list": args.nodes}
    if target == "modelopt":
        return {"nodes_to_exclude": [exact_regex(n) for n in args.nodes],
                "op_types_to_exclude": args.op_types, "data_max": "inf"}
    if target == "torch-tensorrt":
        return {"nodes_to_exclude": sorted({exact_regex(pytorch.fx_name(n)) for n in args.fx_nodes})}
    if target == "openvino":  # the layers are found by the tensors each node makes
        return {"keep": dict(zip(args.nodes, args.outputs)), "compress_to_fp16": True}
    if target == "modelopt-quant":
        return {"quant_cfg": {p: {"enable": False} for p in quant_patterns(keep)}}
    return {"modules": args.modules,
            "_keep_in_fp32_modules": [f"^{re.escape(m)}\\." if m else ".*" for m in args.modules]}


def _verification(keep: KeepList) -> dict[str, Any] | None:
    check = keep.verification
    if check is None or check.final is None:
        return None
    final = check.final
    return {"verified": keep.verified, "outputs_finite": final.finite, "output_error": final.error,
            "tolerance": keep.tolerance, "emulation_runs": check.runs, "inputs": keep.inputs,
            "synthesized": keep.source is None or keep.source.synthesized,
            "stopped": check.stopped or None, "keep_io_types": check.keep_io}


def render_json(keep: KeepList) -> str:
    args = keep_args(keep)
    nodes = keep.nodes
    listed = duplicate_renames(keep.graph)  # a repeated name is listed as the snippet renames it
    data = {
        "schema_version": SCHEMA_VERSION,
        "model": keep.shown or keep.model,
        "dtype": keep.target.name,
        "for": keep.target_for,
        "converter": keep.converter.title,
        "runtime": keep.runtime.spelled if keep.runtime is not None else None,
        "converter_source": keep.converter.source,
        "nodes": [{"name": listed.get(id(n), raw_name(n)), "name_in_file": raw_name(n), "op": n.op_type, "unnamed": is_unnamed(n), "scope": n.scope,
                   "inside": n.subgraph_path.rstrip("/") or None} for n in nodes],
        "count": len(nodes),
        "count_blocking_op_types": sum(keep.op_type_counts().values()),
        "op_type_counts": keep.op_type_counts(),
        "entries": [{"source": e.source, "reasons": e.reasons, "nodes": [listed.get(id(n), raw_name(n)) for n in e.nodes],
                     "dropped": e.dropped} for e in keep.entries],
        "not_fixed": [{"rule_id": f.rule_id, "rule_name": f.rule_name, "node": f.node_name, "message": f.message}
                      for f in keep.not_fixed],
        "verification": _verification(keep),
        "arguments": arguments(keep, args),
        "unnamed_nodes": args.unnamed,
        "renamed_repeats": args.duplicates,
        "control_flow_problem": keep.converter.control_flow if _control_flow(keep) else None,
        "snippet_check": keep.snippet_check.record() if keep.snippet_check is not None else None,
        "alternative": keep.alternative or None,
        "policy": None if keep.policy is None else {
            "applied": keep.policy.applied, "why": keep.policy.why, "other": keep.policy.other,
            "other_adds": [listed.get(id(n), raw_name(n)) for n in keep.policy.adds],
            "other_drops": [listed.get(id(n), raw_name(n)) for n in keep.policy.drops],
            "other_reasons": keep.policy.reasons},
        "keep_io_types": keep.keep_io,
        "inputs": keep.source.record() if keep.source is not None else None,
        "external_data_over_2gb": args.large,
        "snippet": None if _refused(keep) else snippet(keep, args),
    }
    from ..report.json import strict_json  # as the report: no lone surrogate, no NaN, in the JSON

    return json.dumps(strict_json(data), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def render_text(keep: KeepList) -> str:
    args = keep_args(keep)
    nodes = keep.nodes
    listed = duplicate_renames(keep.graph)
    what = _what(keep)
    lines = [f"{printable(keep.shown or keep.model)}  (--dtype {keep.target.name}, --for {keep.target_for}: {what})"]
    counts = keep.op_type_counts()
    blocking = sum(counts.values())
    shown = ", ".join(f"{op} {n}" for op, n in counts.items())
    kept_in = f"out of {keep.target.long_name}" if keep.target.blocked else "in float32"
    lines.append(f"  keeps {len(nodes)} node{'s' * (len(nodes) != 1)} {kept_in}"
                 + (f"; blocking their op types instead keeps {blocking} ({shown})" if nodes else ""))
    verdict = _verification(keep)
    if verdict is not None:
        state = "verified" if verdict["verified"] else "NOT verified"
        finite = "outputs finite" if verdict["outputs_finite"] else "an output is inf/NaN"
        lines.append(f"  {state} on {printable(verdict['inputs'])}: emulated {finite}, output error "
                     f"{verdict['output_error']:.3g} (--tolerance {verdict['tolerance']:g}), "
                     f"{verdict['emulation_runs']} emulation runs")
        if verdict["stopped"]:
            lines.append(f"  {printable(verdict['stopped'])}")
        lines += _policy_lines(keep, listed)
        if verdict["verified"] and verdict["synthesized"]:
            lines.append("  NOT CHECKED ON YOUR DATA: synthesized inputs have no silence, no padding and no large "
                         "values; give yours with --inputs FILE.npz (exit 3 until then)")
    else:
        lines.append("  static: the nodes behind error and warning findings (--trace verifies the list by emulation)")
    lines += _snippet_lines(keep)
    for entry in keep.entries:
        mark = "dropped " if entry.dropped else ""
        names = _names(entry.nodes, listed)
        lines.append(f"  {mark}{entry.source:<7} {printable('; '.join(entry.reasons))}: {names}")
    for finding in keep.not_fixed:
        lines.append(f"  not fixed by float32: {finding.rule_id} {finding.rule_name} at "
                     f"'{printable(finding.node_name)}' (precaudit explain {finding.rule_id})")
    if _control_flow(keep):
        lines.append(f"  warning: {keep.converter.control_flow}; modelopt AutoCast keeps a blocked If/Loop whole")
    lines += _naming_lines(keep, args)
    if args.large and keep.target_for != "openvino":  # (an IR's .bin has no such limit)
        lines.append("  the model is over 2 GB with its weights: the code below keeps them in external data")
    # names reach the code as Python/JSON literals or regexes, which escape what cannot print; a name in a shell
    # line could still hold a control character: printed escaped, line by line
    if _refused(keep):
        return "\n".join(lines) + "\n"
    lines += ["", *map(printable, snippet(keep, args).split("\n"))]
    return "\n".join(lines) + "\n"


def _what(keep: KeepList) -> str:
    """What the list is for, as the report's first line says: the converter, and the runtime it is judged at."""
    from .runtime_targets import RUNTIME_OF, writes_casts

    if keep.target.blocked:
        return "ModelOpt's quantization config"
    if keep.runtime is None:
        return keep.converter.title
    if keep.target_for not in RUNTIME_OF:
        return f"{keep.converter.title}, judged on {keep.runtime.label}"
    how = ("the casts written into the graph" if writes_casts(keep) else
           keep.converter.title if not keep.converter.plain else "")
    return keep.runtime.label + (f": {how}" if how else "")


def _naming_lines(keep: KeepList, args: KeepArgs) -> list[str]:
    """What the list does about nodes the file gives no name, or one name twice."""
    lines = []
    if args.unnamed and keep.target_for == "olive":
        lines.append("  some listed nodes have no name in the file: they are listed as op type _ first output; "
                     "name them so first (keep-list --for onnxruntime prints the loop), or Olive's node lists "
                     "cannot reach them")
    elif args.unnamed:
        lines.append("  some listed nodes have no name in the file: they are listed as op type _ first output, "
                     + ("and the code below finds them by the tensors they make" if keep.target_for == "openvino"
                        else "and the code below names them so first"))
    if args.duplicates and keep.target_for != "openvino":  # (OpenVINO's snippet finds nodes by their tensors)
        lines.append("  the model gives two nodes of one graph the same name, which onnxruntime refuses to load: the "
                     "code below renames each repeat name~1, name~2 ... first, and the list names them so"
                     + ("; Olive's node lists cannot (keep-list --for onnxruntime prints the loop)"
                        if keep.target_for == "olive" else ""))
    return lines


def _policy_lines(keep: KeepList, listed: dict[int, str]) -> list[str]:
    """Which list the snippet applies, why, and what the other policy's list would add and drop."""
    policy = keep.policy
    if policy is None:
        return []
    lines = [f"  policy {policy.applied}: {printable(policy.why)}; the snippet applies this list"]
    if not policy.adds and not policy.drops:
        lines.append(f"  --policy {policy.other} gives the same list")
        return lines
    change = []
    if policy.adds:
        change.append(f"add {_names(policy.adds, listed)}")
    if policy.drops:
        change.append(f"drop {_names(policy.drops, listed)}")
    lines.append(f"  --policy {policy.other} would {' and '.join(change)}")
    if policy.reasons:
        lines.append(f"          for the static findings {printable('; '.join(policy.reasons))}")
    return lines


def _refused(keep: KeepList) -> bool:
    """The snippet ran and the converter's model does not load: it is not printed as the answer."""
    check = keep.snippet_check
    return check is not None and check.ran and check.loads is False


def _snippet_lines(keep: KeepList) -> list[str]:
    check = keep.snippet_check
    if check is None:
        return []
    lines = []
    if keep.alternative:
        lines.append(f"  {printable(keep.alternative)}")
    if not check.ran:
        lines.append(f"  snippet: {printable(check.how)}")
        return lines
    if check.loads is False or check.problem:
        lines.append(f"  NOT verified: {printable(check.problem or '')} (the snippet run as printed, "
                     f"{printable(check.how)})")
        return lines
    measured = ""
    if check.error is not None:
        measured = (f"; on {printable(check.inputs)} its outputs are "
                    + ("finite" if check.finite else "inf/NaN where float32's are not")
                    + (f", error {check.error:.3g} against float32" if check.finite else ""))
    loads = "converts the model" if check.loader == "coremltools" else "loads its model"
    lines.append(f"  snippet checked as printed ({printable(check.how)}): {check.loader} {loads}{measured}"
                 + (f"; not verified: {printable(check.unverified)}" if check.unverified else ""))
    for finding in check.errors:
        lines.append(f"  the converted model still has an error finding: {printable(finding)}")
    return lines


def _control_flow(keep: KeepList) -> bool:
    """Whether the list holds a control-flow node or a node of its bodies that the converter cannot block."""
    return bool(keep.converter.control_flow) and any(n.bodies or n.subgraph_path for n in keep.nodes)


def _names(nodes: list[Node], listed: dict[int, str], limit: int = 6) -> str:
    names = [f"'{printable(listed.get(id(n), raw_name(n)))}'" for n in nodes]
    if len(names) > limit:
        names = [*names[:3], f"… ({len(names) - 5} more)", *names[-2:]]
    return f"{len(nodes)} node{'s' * (len(nodes) != 1)} " + ", ".join(names)
