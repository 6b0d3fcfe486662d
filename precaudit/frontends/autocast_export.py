"""Traced mode's view of an autocast audit: the captured program with autocast's casts written in, and the
reason for every float dtype of its ONNX export."""

from __future__ import annotations

import operator

import torch

from ..dtypes import FORMATS
from .autocast import TORCH_DTYPES, AutocastPlan, OpDtype, region

__all__ = ["cast_explicitly", "note_export"]


def cast_explicitly(program, plan: AutocastPlan) -> None:
    """Rewrite the captured float32 program, in place, so that it computes in autocast's dtypes without autocast.

    Traced mode runs the model from its ONNX export, where no autocast exists: each cast autocast (or type
    promotion) inserts before an op is written in as prims.convert_element_type (the model's own casts are
    aten._to_copy, so the two stay apart in the export's metadata); autocast regions are inlined (their nodes
    keep their source lines); dtype assertions, which name the float32 capture's dtypes, are dropped.
    """
    module = program.graph_module
    _inline_regions(module, plan)
    graph = module.graph
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if str(node.target).startswith("aten._assert_tensor_metadata"):
            graph.erase_node(node)
            continue
        entry = plan.ops.get(id(node))
        if entry is None or not entry.casts:
            continue
        for source in list(node.all_input_nodes):
            to = entry.casts.get(id(source))
            if to is None:
                continue
            with graph.inserting_before(node):
                cast = graph.call_function(torch.ops.prims.convert_element_type.default, (source, TORCH_DTYPES[to]))
            cast.meta = {k: v for k, v in node.meta.items() if k in ("stack_trace", "nn_module_stack", "torch_fn")}
            node.replace_input_with(source, cast)
    graph.lint()
    module.recompile()


def _inline_regions(module, plan: AutocastPlan) -> None:
    """Replace every wrap_with_autocast node by its body's nodes (copied with their metadata and plan entries)."""
    graph = module.graph
    for node in list(graph.nodes):
        parts = region(node)
        if parts is None:
            continue
        body = getattr(module, parts[0].target)
        _inline_regions(body, plan)
        env: dict = {}
        for ph, arg in zip([n for n in body.graph.nodes if n.op == "placeholder"], parts[1]):
            env[ph] = arg
        by_id = {id(n): n for n in body.graph.nodes}

        def outer(key: int) -> int:  # a cast names a body node by id: name its copy (or the outer argument)
            mapped = env.get(by_id[key]) if key in by_id else None
            return id(mapped) if isinstance(mapped, torch.fx.Node) else key

        results: list = []
        with graph.inserting_before(node):
            for inner in body.graph.nodes:
                if inner.op in ("placeholder", "get_attr"):
                    continue
                if inner.op == "output":
                    results = [env[a] if isinstance(a, torch.fx.Node) else a for a in inner.args[0]]
                    continue
                copy = graph.node_copy(inner, lambda a: env[a])
                env[inner] = copy
                if id(inner) in plan.ops:
                    entry = plan.ops[id(inner)]
                    plan.ops[id(copy)] = OpDtype(entry.dtypes, entry.note,
                                                 {outer(k): v for k, v in entry.casts.items()}, entry.cast_note)
        for user in list(node.users):
            if user.target is operator.getitem:
                user.replace_all_uses_with(results[user.args[1]])
                graph.erase_node(user)
        graph.erase_node(node)
    for node in list(graph.nodes):
        if node.op == "get_attr" and not node.users:
            graph.erase_node(node)
    module.delete_all_unused_submodules()
    module.recompile()


def note_export(graph, targets: dict[str, str], plan: AutocastPlan) -> None:
    """Say why every float value of the ONNX export (made by cast_explicitly's program) has its dtype.

    targets: ONNX node name -> the ATen op it came from ('linear', 'pow.Tensor_Scalar', 'convert_element_type'
    for autocast's casts, '_to_copy' for the model's own), from the exporter's metadata. The dtypes are the
    export's own; the reasons are the policies the replay read from torch for those ops.
    """
    label = plan.label
    for value in graph.inputs:
        if value.dtype in FORMATS and value.dtype_note is None:
            value.dtype_note = f"{label} leaves input '{value.name}' in {FORMATS[value.dtype].long_name} " \
                               "(it casts per op)"
    consumers: dict[int, list] = {}
    for node in graph.nodes:
        for v in node.inputs:
            if v is not None:
                consumers.setdefault(id(v), []).append(node)
    for node in graph.nodes:
        op = targets.get(node.name, "")
        for v in node.inputs:
            if v is not None and v.is_const and v.dtype in FORMATS and v.dtype_note is None:
                v.dtype_note = f"{label} leaves {v.const_origin or 'the constant'} in {FORMATS[v.dtype].long_name}" \
                    if v.dtype == "fp32" else f"{label}: {FORMATS[v.dtype].long_name}"
        for out in node.outputs:
            if out.dtype not in FORMATS:
                continue
            if op == "convert_element_type":  # autocast's cast: it belongs to the op that reads it
                reader = next((targets.get(c.name) for c in consumers.get(id(out), []) if targets.get(c.name)), "")
                out.dtype_note = _policy_note(plan, reader, out.dtype) if reader else \
                    f"{label} casts to {FORMATS[out.dtype].long_name}"
            elif op in ("_to_copy", "to.dtype", "to.dtype_layout", "type_as"):
                out.dtype_note = f"the model's own cast to {FORMATS[out.dtype].long_name} at '{node.name}' " \
                                 f"({label} keeps it)"
            elif op:
                out.dtype_note = _policy_note(plan, op, out.dtype)
            else:
                like = next((v for v in node.inputs if v is not None and v.dtype == out.dtype and v.dtype_note), None)
                out.dtype_note = like.dtype_note if like is not None else f"{label}: {FORMATS[out.dtype].long_name}"


def _policy_note(plan: AutocastPlan, op: str, dtype: str) -> str:
    """The reason an op's output has this dtype under autocast, from the policy read for the op."""
    label, short, long = plan.label, op.split(".", maxsplit=1)[0], FORMATS[dtype].long_name
    policy = plan.policies.get(op)
    if policy == "lower_precision_fp" and dtype == plan.dtype:
        return f"{label} runs {short} in {long}"
    if policy == "fp32" and dtype == "fp32":
        return f"{label} lifts {short} to float32"
    if policy in ("fp32_set_opt_dtype", "fp32_append_dtype") and dtype == "fp32":
        return f"{label} runs {short} with a float32 output"
    if policy == "promote":
        return f"{label} runs {short} in its widest input type, {long}"
    if policy is not None:
        return f"{label} is off here (autocast(enabled=False)): {short} runs in its input's {long}"
    return f"{short} has no {label} rule: it runs in its input's {long}"
