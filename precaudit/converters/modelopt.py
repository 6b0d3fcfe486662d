"""NVIDIA ModelOpt 0.47.0 AutoCast (`python -m modelopt.onnx.autocast`, `convert_to_mixed_precision`).

Read from `modelopt/onnx/autocast/` of the nvidia-modelopt 0.47.0 wheel (= NVIDIA/Model-Optimizer @a2fbac7ba):

- No op list of its own beyond ``OP_TYPES_NOT_SUPPORTED_IN_LOW_PRECISION = ["Upsample", "NonMaxSuppression",
  "Celu"]`` plus every op whose ONNX schema, at max(model opset, 13 for fp16 / 22 for bf16), allows no float16
  (bfloat16) in any type constraint (``utils.get_op_types_not_supported_in_low_precision``; read here from the
  installed onnx's schemas). ``InitializerRangeRule`` (``--init_max``, default 65504) keeps a node that reads a
  float32 initializer with a larger value (modelled for initializers up to 64 elements: a static audit reads no
  weights). ``IORangeRule`` (``--data_max 512`` on a calibration run) is data-driven and not modelled.
- ``GraphSanitizer.replace_layernorm_pattern`` fuses ReduceMean(axes attribute) → Sub → Pow(2) → ReduceMean →
  Add(eps) → Sqrt → Div → Mul(scale) [→ Add(bias)], with the exponent, eps, scale and bias initializers, into
  one ``LayerNormalization`` (opset raised to 17): its statistics run in float32 (stash_type default) and its
  eps becomes an attribute, never converted.
- ``_remove_preexisting_casts`` removes every float16/float32 Cast whose input is no initializer.
- ``_convert_initializer_data``: an initializer converted to float16 is clipped to ±65504 and its nonzero values
  below the smallest subnormal become +5.96e-8 (the sign is lost). A ``Constant`` node's value is cast at run
  time instead, unclamped (1e-12 → 0). bfloat16 initializers are cast without clamping. An initializer read by
  nodes of both precisions is duplicated, a copy per precision (``_convert_initializers``).
- Node names: ``--nodes_to_exclude`` regexes are tried with ``re.match`` (anchored at the start only);
  ``name_onnx_nodes`` names unnamed nodes ``{op_type}_{n}`` itself, main graph only.
"""

from __future__ import annotations

from functools import lru_cache

from ..escape import exact_regex
from ..ir import Graph, Node, Value
from .base import Clamp, Converter, KeepArgs

__all__ = ["CONVERTER", "fused_layernorms", "paste", "paste_quant"]

_UNSUPPORTED = ("Upsample", "NonMaxSuppression", "Celu")
_MIN_OPSET = {"fp16": 13, "bf16": 22}
VERSION = "0.47.0"  # the one release modelled here
_TITLE = f"modelopt AutoCast {VERSION}"
_SOURCE = f"modelopt/onnx/autocast, nvidia-modelopt {VERSION}"


def _blocked(graph: Graph, target: str) -> dict[int, str]:
    found: dict[int, str] = {}
    opset = max((n.opset for n in graph.nodes if n.domain == "" and n.opset), default=0)
    unsupported = set(_UNSUPPORTED) | _no_low_precision({n.op_type for n in graph.nodes if n.domain == ""},
                                                          max(opset, _MIN_OPSET[target]), target)
    for node in graph.nodes:
        if node.op_type in unsupported and node.domain == "" and not node.subgraph_path:
            found[id(node)] = (f"kept in float32 by {_TITLE}: {node.op_type} is in "
                               f"OP_TYPES_NOT_SUPPORTED_IN_LOW_PRECISION (Upsample, NonMaxSuppression, Celu, and ops "
                               f"whose schema has no {'float16' if target == 'fp16' else 'bfloat16'})")
    for node in graph.nodes:
        big = None if node.subgraph_path or id(node) in found else _large_initializer(node)
        if big is not None:
            found[id(node)] = (f"kept in float32 by {_TITLE}'s InitializerRangeRule: it reads "
                               f"{big}, beyond init_max 65504")
    for chain in fused_layernorms(graph):
        why = (f"{_TITLE} fuses the decomposed LayerNorm '{chain[0].name}' … '{chain[-1].name}' into "
               f"one LayerNormalization (GraphSanitizer.replace_layernorm_pattern), whose statistics run in float32")
        for node in chain:
            found.setdefault(id(node), why)
    return found


_SMALL = 64  # elements: constants read statically; weights are read only where the audit reads weights


def _large_initializer(node: Node) -> str | None:
    """A small float32 initializer the node reads with some |v| > 65504 (InitializerRangeRule, init_max default):
    'initializer 'fill' (|v| = 1e+09)'. Larger initializers (weights) are not read by a static audit."""
    import numpy as np

    for value in node.inputs:
        if value is None or value.dtype != "fp32" or not _initializer(value) or (value.const_size or 0) > _SMALL:
            continue
        data = value.const()
        if data is not None and data.size:
            top = float(np.max(np.abs(data)))
            if top > 65504.0:
                return f"initializer '{value.name}' (|v| = {top:.3g})"
    return None


def _no_low_precision(ops: set[str], opset: int, target: str) -> set[str]:
    return {op for op in ops if op in _unsupported_at(opset, target)}


@lru_cache(maxsize=8)
def _unsupported_at(opset: int, target: str) -> frozenset[str]:
    """Ops whose earliest schema allowing the low-precision type is newer than opset, or that have none."""
    import onnx

    wanted = "tensor(float16)" if target == "fp16" else "tensor(bfloat16)"
    since: dict[str, list[int]] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        ok = any(wanted in c.allowed_type_strs for c in schema.type_constraints)
        since.setdefault(schema.name, [])
        if ok:
            since[schema.name].append(schema.since_version)
    return frozenset(op for op, versions in since.items() if not versions or min(versions) > opset)


def fused_layernorms(graph: Graph) -> list[list[Node]]:
    """Every chain replace_layernorm_pattern fuses, its nodes in pattern order (main graph only)."""
    chains = []
    for node in graph.nodes:
        if node.op_type == "ReduceMean" and not node.subgraph_path:
            chain = _match(node)
            if chain is not None:
                chains.append(chain)
    return chains


def _only_consumer(value: Value, op: str) -> Node | None:
    users = value.consumers
    return users[0] if len(users) == 1 and users[0].op_type == op else None


def _initializer(value: Value | None) -> bool:
    return value is not None and value.is_const and value.producer is None and \
        (value.const_origin or "").startswith("initializer")


def _match(mean: Node) -> list[Node] | None:
    """GraphSanitizer._match_layernorm_pattern, step by step."""
    if not mean.attrs or next(iter(mean.attrs)) != "axes":  # mean_node.attribute[0].ints[0]
        return None
    sub = _only_consumer(mean.outputs[0], "Sub")
    if sub is None:
        return None
    pows = [n for n in sub.outputs[0].consumers if n.op_type == "Pow"]
    if len(pows) != 1 or not _initializer(pows[0].input(1)) or _scalar(pows[0].input(1)) != 2:
        return None
    var = _only_consumer(pows[0].outputs[0], "ReduceMean")
    add = _only_consumer(var.outputs[0], "Add") if var is not None else None
    sqrt = _only_consumer(add.outputs[0], "Sqrt") if add is not None else None
    if sqrt is None:
        return None
    assert var is not None and add is not None  # sqrt was found under them
    if not _initializer(add.input(1)):
        return None
    divs = [n for n in sqrt.outputs[0].consumers if n.op_type == "Div" and n in sub.outputs[0].consumers]
    if len(divs) != 1 or divs[0].input(0) is not sub.outputs[0] or divs[0].input(1) is not sqrt.outputs[0]:
        return None
    div = divs[0]
    after = div.outputs[0].consumers
    if len(after) != 1 or after[0].op_type != "Mul" or not _initializer(after[0].input(1)):
        return None  # without a scale initializer the pattern has no scale_dimension and is skipped
    chain = [mean, sub, pows[0], var, add, sqrt, div, after[0]]
    bias = after[0].outputs[0].consumers
    if len(bias) == 1 and bias[0].op_type == "Add" and _initializer(bias[0].input(1)):
        chain.append(bias[0])
    return chain


def _scalar(value: Value | None) -> float | None:
    data = value.const() if value is not None and (value.const_size or 0) <= 1 else None
    return float(data.reshape(-1)[0]) if data is not None and data.size == 1 else None


CONVERTER = Converter(
    name="modelopt", title=_TITLE, targets=("fp16", "bf16"),
    block_list_name="OP_TYPES_NOT_SUPPORTED_IN_LOW_PRECISION", op_block_list=(),
    clamps={"fp16": Clamp(5.96e-08, 65504.0, "modelopt AutoCast clips the initializers it converts to ±65504 and "
                                            "sets nonzero values below 5.96e-8 to +5.96e-8", forms=("initializer",),
                          sign_kept=False, by=f"{_TITLE} (initializers clipped to the float16 range)")},
    upcast="removes it (_remove_preexisting_casts)", extra_blocked=_blocked, source=_SOURCE, initializers="per-reader")


def paste(args: KeepArgs) -> str:
    """The AutoCast command line and the Python call."""
    import shlex

    regexes = [exact_regex(n) for n in args.nodes]
    pre, path = args.named_copy()
    precision = "fp16" if args.dtype == "fp16" else "bf16"
    cli = ["python", "-m", "modelopt.onnx.autocast", "--onnx_path", path, "--low_precision_type", precision,
           "--nodes_to_exclude", *regexes]
    if args.op_types:
        cli += ["--op_types_to_exclude", *args.op_types]
    cli += ["--data_max", "inf", "--output_path", args.out]
    if args.keep_io:
        cli.append("--keep_io_types")
    lines = ["# --data_max inf keeps only these nodes (as verified); without it AutoCast also keeps every node whose",
             "# inputs or outputs pass 512 on its calibration data (random inputs when none is given)"]
    lines = [*pre, *lines]
    lines += [" ".join(shlex.quote(part) for part in cli), "",
              "# or in Python:",
              args.output_line(),
              *(["import os"] if args.large else []),
              *(["import onnx"] if not pre else []),
              "from modelopt.onnx.autocast import convert_to_mixed_precision",
              "model = convert_to_mixed_precision(",
              f"    onnx_path={path!r},",
              f"    low_precision_type={precision!r},",
              f"    nodes_to_exclude={regexes!r},",
              f"    op_types_to_exclude={list(args.op_types)!r},",
              "    data_max=float('inf'),",
              *(["    keep_io_types=True,"] if args.keep_io else []),
              ")",
              args.save()]
    return "\n".join(lines)


# ModelOpt's quantization configs for the block-scaled formats (modelopt/torch/quantization/config.py)
_QUANT_CONFIGS = {"mxfp8": "MXFP8_DEFAULT_CFG", "mxfp4": "MXFP4_DEFAULT_CFG", "nvfp4": "NVFP4_DEFAULT_CFG"}


def paste_quant(dtype: str, patterns: list[str]) -> str:
    """ModelOpt's quantization config with the kept modules' quantizers disabled ({"*name*": {"enable": False}})."""
    lines = ["# ModelOpt quantization (modelopt.torch.quantization): the listed modules stay unquantized",
             "import copy", "", "import modelopt.torch.quantization as mtq", "",
             f"config = copy.deepcopy(mtq.{_QUANT_CONFIGS.get(dtype, 'NVFP4_DEFAULT_CFG')})",
             'config["quant_cfg"].update({']
    lines += [f"    {p!r}: {{'enable': False}}," for p in patterns]
    lines += ["})", "model = mtq.quantize(model, config, forward_loop)  # your model and calibration loop"]
    return "\n".join(lines)
