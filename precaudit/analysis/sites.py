"""Turn IR nodes into sites: the places a rule looks at, each with the facts its conditions read."""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..dtypes import FORMATS, Format, classify, format_of_onnx_type, round_to_format
from ..ir import Graph, Node, Value
from .compute_dtype import ComputeDtype, DtypeResolver
from .constants import ScalarConst, is_constant, resolve_fill, resolve_scalar, skip_casts
from .fused_norms import FUSED_NORMS, NormSpec
from .pattern import OpP, match_node
from ..train.facts import TRAIN_FACTS as _TRAIN_FACTS
from .signs import SignAnalysis

__all__ = ["Site", "FACT_NAMES", "PATTERN_FACTS", "find_sites", "find_norm_sites", "find_constant_sites", "find_pattern_sites",
           "find_weight_sites", "weight_stats", "reduction_length", "eps_facts", "dtype_facts", "scalar_of", "feeding_op",
           "selected_by_where_only", "feeds_softmax", "angle_site", "integer_site"]

# Single ops audited for what they do with their input; the site kind is the lower-case op name.
_OP_SITES = {"Softmax", "LogSoftmax", "Log", "Sqrt", "Reciprocal", "Div", "Exp", "Pow"}

# The facts each site kind carries: the names a rule condition or message may use.
_DTYPE_FACTS = {"compute_dtype", "compute_reason", "target_dtype", "target_ulp_at_1", *FORMATS["fp32"].numbers()}
_EPS_FACTS = {"has_eps", "eps", "eps_converted", "eps_rounded", "eps_class", "eps_source", "eps_role",
              "eps_placement", "keep_hint"}
_OP_FACTS = {"op", "input_op", "input_class", "in_norm_chain", "selected_by_where", *_DTYPE_FACTS}
FACT_NAMES: dict[str, set[str]] = {
    "norm": {"norm", "op", "missing_note", "stat_dtype", "stat_square_overflow", "stat_floor", *_EPS_FACTS,
             *_DTYPE_FACTS},
    **{op.lower(): set(_OP_FACTS) for op in _OP_SITES},
}
FACT_NAMES["div"] |= {"divisor_op", "divisor_class", "divisor_mask"}
FACT_NAMES["reciprocal"] |= {"divisor_op", "divisor_class", "divisor_mask"}
# Sums: how many elements each output adds up (unknown where a shape or the axes are), in which dtype.
FACT_NAMES["reduction"] = {"op", "input_op", "in_norm_chain", "reduction_length", "reduction_axes", "swamp_length",
                           "overflow_term", "exp_input", "exp_shifted", "exp_node", "sum_use", "exp_sum_overflow", "exp_terms",
                           "exp_dtype", "exp_overflow",
                           *_DTYPE_FACTS}
# float32 weights (initializers, Constant tensors), measured against the dtype a conversion gives them: only with
# --check-weights or --trace, the modes that read weights.
FACT_NAMES["weight"] = {"op", "name", "source", "consumer", "elements", "nonzero", "absmax", "overflow_count",
                        "underflow_count", "underflow_fraction", "subnormal_fraction", *_DTYPE_FACTS}
FACT_NAMES["pow"].add("exponent")
# An eps added to, or a floor (Max, Clip) on, what a division, a negative power, a Log or a Sqrt reads, outside any
# norm: the site is the guard node, judged as a norm's eps is; guarded_class is the sign class of what it guards.
# Sin and Cos of an angle made from integers (position x frequency); and a float that carries integers (a Range,
# a CumSum of ones, a Cast of integer positions): how large the graph lets them get, against the format's spacing.
FACT_NAMES["angle"] = {"op", "angle_from", "position_bound", "max_frequency", "angle_bound", "angle_bound_text",
                       "angle_spacing", "coarse_from", *_DTYPE_FACTS}
FACT_NAMES["integer_float"] = {"op", "integer_from", "int_bound", "bound_from", "exact_limit", *_DTYPE_FACTS}
FACT_NAMES["guard"] = {"op", "guard_op", "reader", "reader_op", "guarded_class", "reader_input_class",
                       "in_norm_chain", *_EPS_FACTS, *_DTYPE_FACTS}
FACT_NAMES["softmax"].add("axis")
FACT_NAMES["logsoftmax"].add("axis")
# Traced mode (precaudit/trace): what a run observed, per value, norm statistic, sensitive op input, and the
# first node whose emulated output went inf/NaN.
FACT_NAMES["traced_value"] = {"op", "value", "elements", "samples", "absmax", "min_nonzero", "overflow_fraction",
                              "underflow_fraction", "subnormal_fraction", "nonfinite_fraction",
                              "ref_nonfinite_fraction", "rel_error", "input_overflow_fraction",
                              "input_underflow_fraction", "constant_input_overflows", *_DTYPE_FACTS}
FACT_NAMES["traced_norm"] = FACT_NAMES["norm"] | {"rows", "min_variance", "median_variance", "zero_variance_rows",
                                                  "rows_below_eps", "rows_below_eps_fraction", "samples"}
FACT_NAMES["traced_op"] = {"op", "input_op", "in_norm_chain", "selected_by_where", "samples", "input_max", "input_min",
                           "input_min_abs", "zero_fraction", "negative_fraction", "ref_zero_fraction", "ref_negative_fraction",
                           "output_nonfinite_fraction", "input_rel_error", "input_from_sensitive_op", *_DTYPE_FACTS}
# An angle site and an integer_float site with what the run measured there (the static facts kept).
FACT_NAMES["traced_angle"] = FACT_NAMES["angle"] | {"samples", "angle_max", "angle_error", "output_error"}
FACT_NAMES["traced_integer"] = FACT_NAMES["integer_float"] | {"samples", "int_max", "int_error"}
FACT_NAMES["traced_first_nonfinite"] = {"op", "value", "samples", "nonfinite_fraction", "ref_nonfinite_fraction",
                                        "input_absmax", "chain", "chain_length", "reaches_output", "output",
                                        *_DTYPE_FACTS}
# value_converted: the constant as a --converter leaves it (clamped), before rounding; converted_by: its words
FACT_NAMES["constant"] = {"op", "value", "value_converted", "converted_by", "value_rounded", "value_class", "source",
                          "consumer", "mask_fill", *_DTYPE_FACTS}
# precaudit train's sites (the training step's facts: no torch needed to read them)
FACT_NAMES.update(_TRAIN_FACTS)
# Facts of a site made by a rule's op pattern, besides the names the pattern binds.
PATTERN_FACTS = {"op", "input_op", *_DTYPE_FACTS}


@dataclass(eq=False)
class Site:
    """A node (or chain of nodes) a rule can judge, and the facts it is judged on."""

    kind: str  # "norm", "pattern", or the lower-cased op name for single-op sites
    node: Node  # the node a finding points at
    facts: dict[str, Any] = field(default_factory=dict)
    rule_id: str | None = None  # a pattern site belongs to the one rule whose pattern made it
    span: list[Node] = field(default_factory=list)  # the nodes the hazard spans, where more than the node (keep-list)


def find_sites(graph: Graph, resolver: DtypeResolver, signs: SignAnalysis) -> list[Site]:
    """Every fused-norm, single-op and reduction site of the graph, in graph order."""
    sites = {id(site.node): site for site in find_norm_sites(graph, resolver)}
    reductions = []
    guards: dict[int, Site] = {}
    for node in graph.nodes:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in _OP_SITES:
            site = _op_site(node, resolver, signs)
            if site is not None:
                sites[id(node)] = site
            guard = _guard_site(node, resolver, signs)
            if guard is not None and id(guard.node) not in guards:
                guards[id(guard.node)] = guard
        elif node.op_type in ("Sin", "Cos"):
            site = angle_site(node, resolver)
            if site is not None:
                reductions.append(site)
        elif node.op_type in _REDUCTIONS:
            site = _reduction_site(node, resolver)
            if site is not None:
                reductions.append(site)
        if node.op_type in ("Range", "CumSum", "Cast"):
            site = integer_site(node, resolver)
            if site is not None:
                reductions.append(site)
    order = {id(node): i for i, node in enumerate(graph.nodes)}
    return sorted([*sites.values(), *reductions, *guards.values()], key=lambda s: order[id(s.node)])


def _spacing(bound: float, fmt: Format) -> float:
    """The distance between neighbouring values of the format at |x| = bound (normal range)."""
    return 2.0 ** math.floor(math.log2(bound)) * fmt.ulp_at_1 if bound > 0 else 0.0


def angle_site(node: Node, resolver: DtypeResolver) -> Site | None:
    """A Sin or Cos of an angle made from integers (position x frequency), with the bound the graph fixes."""
    from .canonical import producer
    from .integers import angle_source

    angle = angle_source(node.input(0), resolver.graph.dim_sizes)
    if angle is None:
        return None
    maker = producer(node.input(0)) or node
    dtype = resolver.of_node(maker)
    if dtype is None:
        return None
    fmt = dtype.fmt
    facts = {"op": node.op_type, "angle_from": angle.positions.kind, "position_bound": angle.positions.bound,
             "max_frequency": angle.frequency, "angle_bound": angle.bound,
             "angle_bound_text": f"at most {angle.bound:.6g} rad{_sized_by(angle.positions.sized_by)}" if angle.bound else
             "with no bound the shapes fix (the positions follow a symbolic dim)",
             "angle_spacing": _spacing(angle.bound, fmt) if angle.bound else None,
             # from this |angle| on, neighbouring values are 1/8 rad apart or more
             "coarse_from": 0.125 / fmt.ulp_at_1, **dtype_facts(dtype, resolver)}
    return Site("angle", node, facts, span=[angle.positions.node, maker, node])


def _sized_by(dims: tuple[str, ...]) -> str:
    """' (with --dim seq=4096)' where a bound rests on the user's sizes, else nothing."""
    return f" (with --dim {', '.join(dims)})" if dims else ""


def integer_site(node: Node, resolver: DtypeResolver) -> Site | None:
    """The node that makes a float carry integers (a float Range, a CumSum of ones, a Cast of integers)."""
    from .integers import integer_source

    if not node.outputs or node.outputs[0].dtype not in FORMATS:
        return None
    source = integer_source(node.outputs[0], resolver.graph.dim_sizes)
    if source is None or source.node is not node:
        return None
    dtype = resolver.of_value(node.outputs[0])
    if dtype is None:
        return None
    made_in = resolver.of_node(node)
    if made_in is not None and made_in.fmt.ulp_at_1 < dtype.fmt.ulp_at_1:
        # a converter's block list keeps a Range or CumSum in float32 and casts its output back for its readers: the
        # integers are exact where made and rounded where read
        dtype = ComputeDtype(dtype.fmt, f"'{node.name}' computes in {made_in.fmt.long_name} ({made_in.reason}), "
                                        f"and its output is cast to {dtype.fmt.long_name} for its readers")
    facts = {"op": node.op_type, "integer_from": source.kind, "int_bound": source.bound,
             "bound_from": _sized_by(source.sized_by),
             # every integer up to 2**(mantissa bits + 1) is exact: float16 2048, bfloat16 256
             "exact_limit": 2 / dtype.fmt.ulp_at_1, **dtype_facts(dtype, resolver)}
    return Site("integer_float", node, facts)


def _stored_narrow(value: Value | None) -> bool:
    """A constant stored in a narrow float (float16, bfloat16, fp8), through Casts and shape ops."""
    from .canonical import producer

    for _ in range(4):
        if value is None or value.is_const:
            break
        node = producer(value)
        value = node.input(0) if node is not None and node.op_type in ("Cast", "Identity", "Reshape", "Unsqueeze",
                                                                       "Expand", "Constant") else None
    if value is not None and not value.is_const:
        return False
    return value is not None and value.dtype in FORMATS and value.dtype not in ("fp32", "fp64")


def guarded_input(node: Node) -> Value | None:
    """What a guard would sit on: a Div's divisor, a Reciprocal's, Log's or Sqrt's input, a negative power's base."""
    if node.op_type == "Div":
        return node.input(1)
    if node.op_type == "Pow":
        exponent = scalar_of(node.input(1))
        return node.input(0) if exponent is not None and exponent < 0 else None
    return node.input(0) if node.op_type in ("Reciprocal", "Log", "Sqrt") else None


def _guard_site(reader: Node, resolver: DtypeResolver, signs: SignAnalysis) -> Site | None:
    """y + eps, max(y, eps) or clip(y, min=eps) under the reader, eps a positive constant: the guard's site."""
    from .canonical import producer

    read = guarded_input(reader)
    guard = producer(read)
    if guard is None or guard.op_type not in ("Add", "Max", "Clip"):
        return None
    const, guarded, stored_zero = None, None, False
    if guard.op_type == "Clip":
        const = resolve_scalar(guard.input(1)) if guard.input(1) is not None else None
        if const is None and "min" in guard.attrs:
            const = ScalarConst(float(guard.attrs["min"]), "attribute min")
        guarded = guard.input(0)
    elif len(guard.inputs) == 2:
        for i in (0, 1):
            found, other = resolve_scalar(guard.input(i)), guard.input(1 - i)
            if found is not None and not (other is not None and other.is_const):
                const, guarded = found, other
                stored_zero = found.value == 0 and guard.op_type == "Add" and _stored_narrow(guard.input(i))
                break
    # an eps, not a bias or a shift; or y + 0.0 stored in float16: nobody writes that, an fp16 export leaves it of
    # an eps that rounded away (max(y, 0) is a ReLU, not a guard)
    if const is None or not (0 < const.value < 1 or stored_zero):
        return None
    from .decomposed import narrower

    # a guard kept in float32 whose reader is not is cast back to the reader's dtype (a converter's block list
    # does that): the eps must survive there too
    dtype = narrower(resolver.of_node(guard), resolver.of_node(reader), reader)
    if dtype is None:
        return None
    facts = {"op": guard.op_type, "guard_op": guard.op_type, "reader": reader.name, "reader_op": reader.op_type,
             "guarded_class": signs.of(guarded), "reader_input_class": signs.of(read),
             "in_norm_chain": False, "eps_source": const.source,
             "eps_role": "guard", "eps_placement": "guard", "keep_hint": guard.op_type,
             **eps_facts(const, dtype), **dtype_facts(dtype, resolver)}
    return Site("guard", guard, facts, span=[guard, reader])


_UNASKED = object()


def find_constant_sites(graph: Graph, resolver: DtypeResolver) -> list[Site]:
    """Small float constants (up to 64 values: scalars, masks' fill values) as the first op that uses them
    holds them: a finfo(float32).min becomes -inf in fp16, a 1e-30 becomes 0."""
    sites, seen = [], set()
    for node in graph.nodes:
        if node.op_type in ("Cast", "CastLike", "Identity", "Shape", "Constant"):
            continue
        dtype: Any = _UNASKED  # the node's dtype, asked at its first float constant (most nodes have none)
        to_softmax: bool | None = None  # whether the node feeds a Softmax, asked where it matters
        for value in node.inputs:
            if value is None or value.dtype not in FORMATS:
                continue  # an int64 Slice end of 2**63 - 1 is no float constant
            const = resolve_scalar(value)
            if const is None and is_constant(value) and id(value) not in seen:
                # a mask tensor of 0 and one fill (a causal mask the dynamo exporter folded) is that fill, used
                # where a mask is: as TorchScript's Where(mask, scores, fill) gives it
                if to_softmax is None:
                    to_softmax = feeds_softmax(node)
                const = resolve_fill(value) if to_softmax else None
            if const is None or id(value) in seen or const.value == 0:
                continue
            if dtype is _UNASKED:
                dtype = resolver.of_node(node)
            if dtype is None:
                break
            seen.add(id(value))
            converted = dtype.constant(const.value, const.source)
            facts = {"op": node.op_type, "value": const.value, "value_converted": converted,
                     "converted_by": dtype.clamp.by if converted != const.value else "",
                     "value_rounded": round_to_format(converted, dtype.fmt),
                     "value_class": classify(converted, dtype.fmt), "source": const.source, "consumer": node.name,
                     "mask_fill": feeds_softmax(node) if to_softmax is None else to_softmax,
                     **dtype_facts(dtype, resolver)}
            sites.append(Site("constant", node, facts))
    return sites


def find_norm_sites(graph: Graph, resolver: DtypeResolver) -> list[Site]:
    """A site for every fused normalization op (ONNX and onnxruntime), with its eps and statistics dtype."""
    sites = []
    for node in graph.nodes:
        spec = FUSED_NORMS.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))
        if spec is not None:
            site = _norm_site(node, spec, resolver)
            if site is not None:
                sites.append(site)
    return sites


def eps_facts(eps: float | ScalarConst | None, dtype: ComputeDtype) -> dict[str, Any]:
    """The eps as written, as a --converter leaves a constant one (clamped), and as rounded into its dtype."""
    value = eps.value if isinstance(eps, ScalarConst) else eps
    facts: dict[str, Any] = {"has_eps": value is not None, "eps": value, "eps_converted": None, "eps_rounded": None,
                             "eps_class": None}
    if value is not None:
        if isinstance(eps, ScalarConst):  # an attribute eps is never converted
            converted = dtype.constant(value, eps.source)
            if converted != value:
                assert dtype.clamp is not None  # only a converter's clamp changes a constant
                facts["eps_converted"] = converted
                facts["eps_source"] = f"{eps.source}; {dtype.clamp.words}: {value:.3g} → {converted:.3g}"
                value = converted
        facts["eps_rounded"] = round_to_format(value, dtype.fmt)
        # a NaN or a negative eps is wrong in every dtype: it gets its own class, not "overflow" or "zero"
        facts["eps_class"] = "invalid" if math.isnan(value) or value < 0 else classify(value, dtype.fmt)
    return facts


# Ops a mask fill passes through on its way into a softmax: Where(mask, x, fill), x + (1 - mask) * fill, ...
_TO_SOFTMAX = {"Where", "Add", "Sub", "Mul", "Cast", "Expand", "Reshape", "Unsqueeze", "Squeeze", "Transpose",
               "Identity", "Slice", "Concat"}


def feeds_softmax(node: Node, depth: int = 6) -> bool:
    """Whether the node's output reaches a Softmax through ops that only move or add a mask (a mask fill's use)."""
    return node.op_type in _TO_SOFTMAX and softmax_after(node, depth) is not None


def softmax_after(node: Node, depth: int = 6) -> Node | None:
    """The first Softmax (or LogSoftmax) the node's output reaches within depth hops through ops that only move
    or add a mask, breadth first; the node itself may be any op (the reader of a fill)."""
    frontier, seen = [node], {id(node)}
    for _ in range(depth):
        step = []
        for current in frontier:
            if current is not node and current.op_type not in _TO_SOFTMAX:
                continue
            for user in (u for out in current.outputs for u in out.consumers):
                if user.op_type in ("Softmax", "LogSoftmax"):
                    return user
                if id(user) not in seen:
                    seen.add(id(user))
                    step.append(user)
        frontier = step
    return None


def dtype_facts(dtype: ComputeDtype, resolver: DtypeResolver) -> dict[str, Any]:
    return {"compute_dtype": dtype.fmt.long_name, "compute_reason": dtype.reason,
            "target_dtype": resolver.target.long_name, "target_ulp_at_1": resolver.target.ulp_at_1,
            **dtype.fmt.numbers()}


def _norm_site(node: Node, spec: NormSpec, resolver: DtypeResolver) -> Site | None:
    dtype = _norm_dtype(node, spec, resolver)
    if dtype is None:
        return None
    if spec.fixed_eps is not None:
        eps, source = spec.fixed_eps, "fixed by the ONNX spec"
    elif spec.eps_attr is None:
        eps, source = None, "the op has no eps"
    elif spec.eps_attr in node.attrs:
        eps, source = float(node.attrs[spec.eps_attr]), f"attribute {spec.eps_attr}"
    else:
        eps, source = spec.eps_default, f"attribute {spec.eps_attr} absent: default {spec.eps_default:g}"
    facts = {"norm": _family(node, spec), "op": node.op_type, "eps_source": source, "eps_role": spec.eps_role,
             "keep_hint": node.op_type, "eps_placement": spec.placement, "missing_note": "",
             "stat_dtype": None, "stat_square_overflow": None,  # fused kernels choose their own accumulation
             "stat_floor": _running_var_floor(node), **eps_facts(eps, dtype), **dtype_facts(dtype, resolver)}
    return Site("norm", node, facts)


_MAX_CHANNELS = 65536  # running statistics are one number per channel: small enough to read


def _running_var_floor(node: Node) -> float | None:
    """BatchNormalization in inference divides by sqrt(running_var + eps): the smallest running variance
    decides whether the eps matters at all (it does only for channels whose variance is about 0)."""
    var = node.input(4) if node.op_type == "BatchNormalization" else None
    if var is None or not var.is_const or (var.const_size or 0) > _MAX_CHANNELS:
        return None
    data = var.const()
    return float(np.min(data)) if data is not None and data.size else None


def _family(node: Node, spec: NormSpec) -> str:
    """torch exports GroupNorm as Reshape → InstanceNormalization → Reshape: name it as the user wrote it."""
    x = node.input(0)
    if node.op_type == "InstanceNormalization" and x is not None:
        before = x.producer
        after = [c.op_type for c in node.outputs[0].consumers]
        if before is not None and before.op_type == "Reshape" and after == ["Reshape"]:
            return "GroupNorm"
    return spec.norm


def _norm_dtype(node: Node, spec: NormSpec, resolver: DtypeResolver) -> ComputeDtype | None:
    # a stash_type on an op whose spec has none comes from the torch frontend (PyTorch's float32 statistics)
    torch_stash = spec.stash_since is None and "stash_type" in node.attrs
    if torch_stash or spec.stash_since is not None and (node.opset is None or node.opset >= spec.stash_since):
        stash = node.attrs.get("stash_type")
        return resolver.of_stash(node, None if stash is None else int(stash), "")
    if spec.fp32_accumulate is not None and resolver.kept_by(node) is None:
        inner = resolver.of_node(node)
        if inner is not None and inner.fmt.name != "fp64":
            return ComputeDtype(FORMATS["fp32"], f"{node.op_type}: {spec.fp32_accumulate}")
    return resolver.of_node(node)


def _op_site(node: Node, resolver: DtypeResolver, signs: SignAnalysis) -> Site | None:
    dtype = resolver.of_node(node)
    if dtype is None:
        return None
    facts: dict[str, Any] = {"op": node.op_type, "input_op": feeding_op(node.input(0)),
                             "input_class": signs.of(node.input(0)), "in_norm_chain": False,
                             "selected_by_where": selected_by_where_only(node),
                             **dtype_facts(dtype, resolver)}
    if node.op_type in ("Div", "Reciprocal"):
        divisor = node.input(1 if node.op_type == "Div" else 0)
        facts["divisor_op"] = feeding_op(divisor)
        facts["divisor_class"] = signs.of(divisor)
        facts["divisor_mask"] = signs.mask_origin(divisor)
    if node.op_type == "Pow":
        facts["exponent"] = scalar_of(node.input(1))
    if node.op_type in ("Softmax", "LogSoftmax"):
        facts["axis"] = node.attr("axis", -1 if (node.opset or 13) >= 13 else 1)
    return Site(node.op_type.lower(), node, facts)


# Ops that add up elements along axes; the site says how many each output sums.
_REDUCTIONS = {"ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum",
               "ReduceLogSumExp", "CumSum"}


def _reduction_site(node: Node, resolver: DtypeResolver) -> Site | None:
    dtype = resolver.of_node(node)
    if dtype is None:
        return None
    length, axes = reduction_length(node)
    fmt = dtype.fmt
    facts = {"op": node.op_type, "input_op": feeding_op(node.input(0)), "in_norm_chain": False,
             "reduction_length": length, "reduction_axes": axes,
             # with p significant bits (ulp at 1 = 2**(1-p)) a running sum that reaches 2**p times a term no longer
             # changes when that term is added: it is half an ulp, and the tie goes to the even sum
             "swamp_length": round(2 / fmt.ulp_at_1),
             "overflow_term": fmt.max / length if length else None, **_exp_sum_facts(node, length, fmt, resolver),
             **dtype_facts(dtype, resolver)}
    exp = producer_of_exp(node) if facts["exp_input"] else None
    return Site("reduction", node, facts, span=[exp, node] if exp is not None else [])


def producer_of_exp(node: Node) -> Node | None:
    """The Exp a reduction sums, through shape ops and Casts."""
    from .canonical import producer

    exp = producer(node.input(0))
    return exp if exp is not None and exp.op_type == "Exp" else None


def _exp_sum_facts(node: Node, length: int | None, fmt: Format, resolver: DtypeResolver) -> dict[str, Any]:
    """A sum (or mean) of exponentials: whether its Exp reads x - max(x), and what reads the sum. A softmax
    (a Div of the same Exp by the sum, or by sum + eps) and a log-sum-exp (a Log of the sum) have rules of their
    own; any other sum of n exponentials overflows once one term passes exp_overflow - ln n. The Exp may run in
    a narrower dtype than the sum (the dynamo exporter's float16 exp, cast to float32 for the sum): a term then
    overflows at the Exp's own threshold, whatever the sum holds."""
    from .canonical import producer

    exp = producer(node.input(0)) if node.op_type in ("ReduceSum", "ReduceMean") else None
    if exp is None or exp.op_type != "Exp":
        return {"exp_input": False, "exp_shifted": None, "exp_node": None, "sum_use": None, "exp_sum_overflow": None,
                "exp_terms": None, "exp_dtype": None, "exp_overflow": None}
    exp_dtype = resolver.of_node(exp)
    exp_overflow = exp_dtype.fmt.exp_overflow if exp_dtype is not None else fmt.exp_overflow
    summed = fmt.exp_overflow - math.log(length) if length else fmt.exp_overflow
    return {"exp_input": True, "exp_shifted": _max_shifted(exp), "exp_node": exp.name, "sum_use": _sum_use(node, exp),
            "exp_sum_overflow": min(summed, exp_overflow), "exp_overflow": exp_overflow,
            "exp_dtype": exp_dtype.fmt.long_name if exp_dtype is not None else None,
            "exp_terms": f"{length} terms" if length else "terms whose number the shapes do not fix"}


def _max_shifted(exp: Node) -> bool:
    """exp(x - max(x)): a Sub whose subtrahend comes from a ReduceMax (or Max), through shape ops and Casts."""
    from .canonical import producer

    sub = producer(exp.input(0))
    if sub is None or sub.op_type != "Sub" or sub.input(1) is None:
        return False
    top = producer(sub.input(1))
    return top is not None and top.op_type in ("ReduceMax", "Max", "ArgMax")


def _sum_use(total: Node, exp: Node) -> str:
    """softmax: a Div reads the sum (directly, through Casts, or plus an eps) as its divisor; logsumexp: a Log reads
    it; other: anything else (a partition function, an energy, a linear-attention normalizer's sum)."""
    frontier = [total]
    for _ in range(3):  # the sum, an Add of an eps to it, and Casts between
        step = []
        for current in frontier:
            for out in current.outputs:
                for user in out.consumers:
                    if user.op_type == "Log":
                        return "logsumexp"
                    if user.op_type == "Div" and user.input(1) is out:
                        return "softmax"
                    if user.op_type in ("Add", "Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Expand"):
                        step.append(user)
        frontier = step
    return "other"


def reduction_length(node: Node) -> tuple[int | None, str]:
    """How many elements each output of a reduction (or CumSum) adds up, and the axes as written.

    The product of the reduced dims of the input's static shape; None when a dim is symbolic, the shape is
    unknown, or the axes are an input computed at run time.
    """
    x = node.input(0)
    shape = x.shape if x is not None else None
    if node.op_type == "CumSum":
        axis = scalar_of(node.input(1))
        axes = None if axis is None else [int(axis)]
    elif "axes" in node.attrs:  # before opset 13 (ReduceSum) or 18 (the others)
        # None: the ATen lowering's x.mean() with no dim, which reduces every axis as absent axes do
        axes = [int(a) for a in node.attrs["axes"] or ()]
    elif (axes_input := node.input(1)) is not None:
        axes = _small_ints(axes_input)
    else:
        axes = []
    if axes is None:
        return None, "computed at run time"
    if not axes and node.attr("noop_with_empty_axes", 0):
        return 1, "none (noop_with_empty_axes)"
    shown = str(axes) if axes else "all"
    if shape is None:
        return None, shown
    rank = len(shape)
    picked = sorted({a + rank if a < 0 else a for a in axes}) if axes else list(range(rank))
    if any(not 0 <= a < rank for a in picked):
        return None, shown
    dims = [shape[a] for a in picked]
    if not all(isinstance(d, int) for d in dims):
        return None, shown
    return math.prod(dims), shown


def _small_ints(value: Value, max_size: int = 64) -> list[int] | None:
    """A small constant integer vector (Reduce* axes as an input), else None."""
    if not value.is_const or value.const_size is None or value.const_size > max_size:
        return None
    data = value.const()
    if data is None or data.dtype.kind not in "iu":
        return None
    return [int(v) for v in np.asarray(data).reshape(-1)]


def find_pattern_sites(graph: Graph, resolver: DtypeResolver, rule_id: str, pattern: OpP) -> list[Site]:
    """A site for every node the pattern matches, its facts the pattern's bindings."""
    sites = []
    for node in graph.nodes:
        if node.op_type not in pattern.ops:
            continue
        result = match_node(pattern, node)
        dtype = resolver.of_node(node)
        if result.ok and dtype is not None:
            facts = {"op": node.op_type, "input_op": feeding_op(node.input(0)), **dtype_facts(dtype, resolver),
                     **result.bindings}
            sites.append(Site("pattern", node, facts, rule_id=rule_id))
    return sites


_WEIGHT_CHUNK = 1 << 20  # elements measured at a time: the temporaries stay at a few MB, whatever the tensor


def find_weight_sites(graph: Graph, resolver: DtypeResolver) -> list[Site]:
    """A site for every float32 weight (initializer or Constant tensor) that a conversion would change the dtype of.

    Reads the tensors one at a time and keeps only their numbers, so memory stays bounded by the largest one.
    A tensor is converted to the narrowest dtype any of its readers computes in (a Cast reader: the dtype it casts
    to); one read only by --keep-fp32 nodes, or by float32 islands, stays float32 and is skipped. Single-valued
    constants are the constant sites' (PA209).
    """
    sites, seen = [], set()
    for node in graph.nodes:
        for value in node.inputs:
            if value is None or id(value) in seen or not value.is_const or value.dtype != "fp32":
                continue
            seen.add(id(value))
            converted = _converted_by(value, resolver)
            if converted is None or resolve_scalar(value) is not None or _mask_fill(value):
                continue
            dtype, reader = converted
            data = _weight_data(value)
            if data is None or data.dtype.kind != "f":
                continue
            facts = {"op": reader.op_type, "name": value.name, "source": value.const_origin or f"constant '{value.name}'",
                     "consumer": reader.name, **weight_stats(data, dtype.fmt), **dtype_facts(dtype, resolver)}
            del data  # before the next tensor is read
            sites.append(Site("weight", reader, facts))
    return sites


def _mask_fill(value: Value) -> bool:
    """A 0-or-fill mask tensor that reaches a Softmax: the constant sites' (PA209, PA215), as a scalar fill is."""
    return any(feeds_softmax(reader) for reader in value.consumers) and resolve_fill(value) is not None


def _converted_by(value: Value, resolver: DtypeResolver) -> tuple[ComputeDtype, Node] | None:
    """The narrowest dtype a reader of the value computes in, and that reader; None when every reader keeps float32."""
    best = None
    for reader in value.consumers:
        if reader.op_type == "Cast":
            fmt = format_of_onnx_type(reader.attr("to", 0))
            dtype = ComputeDtype(fmt, f"Cast to {fmt.long_name} at node '{reader.name}'") if fmt is not None else None
        else:
            dtype = resolver.of_node(reader)
        if dtype is None or dtype.fmt.name in ("fp32", "fp64"):
            continue
        if best is None or _narrowness(dtype.fmt) < _narrowness(best[0].fmt):
            best = (dtype, reader)
    return best


def _narrowness(fmt: Format) -> tuple[float, float]:
    return fmt.max, -fmt.ulp_at_1


def _weight_data(value: Value) -> np.ndarray | None:
    """The tensor's data: the copy traced mode already loaded, else read afresh and not kept (Value.const() would
    cache every weight of the model)."""
    cached = value._const_cache
    if cached is not None:
        return cached
    assert value.const_loader is not None  # asked only of constants
    return value.const_loader()


def weight_stats(data: np.ndarray, fmt: Format) -> dict[str, Any]:
    """What rounding a float array into fmt does to it, measured a chunk at a time.

    Round to nearest even: |w| up to half the smallest subnormal becomes 0 (the tie goes to the even 0), |w| below
    the smallest normal less half a subnormal step becomes subnormal, a finite |w| from max + half an ulp becomes
    inf (NaN in formats without inf). ±inf and NaN are already what they are (a mask table's -inf row): no
    overflow, and not the largest |w| either, except that a format without inf (float8_e4m3fn) makes inf NaN.
    """
    zero_up_to = fmt.smallest_subnormal / 2
    normal_from = fmt.smallest_normal - fmt.smallest_subnormal / 2
    flat = data.reshape(-1)
    absmax, nonzero, overflow, underflow, subnormal = 0.0, 0, 0, 0, 0
    for start in range(0, flat.size, _WEIGHT_CHUNK):
        a = np.abs(flat[start:start + _WEIGHT_CHUNK], dtype=np.float64)
        if not np.isfinite(a).all():
            if not fmt.has_inf:
                overflow += int(np.count_nonzero(np.isinf(a)))
            a = np.where(np.isfinite(a), a, 0.0)
        nonzero += int(np.count_nonzero(a > 0))
        tiny = a <= zero_up_to
        underflow += int(np.count_nonzero(tiny)) - int(np.count_nonzero(a == 0))
        subnormal += int(np.count_nonzero(a < normal_from)) - int(np.count_nonzero(tiny))
        absmax = max(absmax, float(a.max(initial=0.0)))
        overflow += int(np.count_nonzero(a >= fmt.overflow_threshold))
    return {"elements": int(flat.size), "nonzero": nonzero, "absmax": absmax, "overflow_count": overflow,
            "underflow_count": underflow, "underflow_fraction": underflow / nonzero if nonzero else 0.0,
            "subnormal_fraction": subnormal / nonzero if nonzero else 0.0}


# Elementwise ops a value can pass through on its way into a Where branch without being used otherwise.
_ELEMENTWISE = {"Cast", "Identity", "Add", "Sub", "Mul", "Div", "Min", "Max", "Clip", "Floor", "Ceil", "Round", "Neg",
                "Abs", "Expand", "Unsqueeze", "Squeeze", "Reshape"}


def selected_by_where_only(node: Node, depth: int = 12) -> bool:
    """True when every use of the node's output ends in a branch of a Where (T5's relative-position log).

    Such a value is computed for every element but kept only where the condition selects it, so an inf or
    NaN in the other elements is thrown away.
    """
    frontier, seen = [node], set()
    while frontier and depth > 0:
        depth -= 1
        next_frontier = []
        for current in frontier:
            for out in current.outputs:
                if not out.consumers:
                    return False  # reaches a graph output
                for user in out.consumers:
                    if user.op_type == "Where" and user.input(0) is not out:
                        continue
                    if user.op_type in ("Shape", "Size"):
                        continue  # reads the dims only (full_like in a dynamic-shape export), none of the values
                    if user.op_type not in _ELEMENTWISE:
                        return False
                    if id(user) not in seen:
                        seen.add(id(user))
                        next_frontier.append(user)
        frontier = next_frontier
    return not frontier


def feeding_op(value: Value | None) -> str:
    """The op type that produces a value, looking through Casts; 'input' or 'constant' at the graph's edge."""
    value = skip_casts(value)
    if value is None:
        return ""
    if value.is_const:
        return "constant"
    if value.producer is None:
        return "input"
    return value.producer.op_type


def scalar_of(value: Value | None, max_size: int = 1) -> float | None:
    """A constant's single value (reading it only if it is small), else None."""
    if value is None or not value.is_const:
        return None
    if value.const_size is not None and value.const_size > max_size:
        return None
    data = value.const()
    if data is None or data.size != 1 or data.dtype.kind not in "fiu":
        return None
    return float(np.asarray(data, dtype=np.float64).reshape(()))
