"""A site, and the names of the facts each kind of site carries: the vocabulary of rule conditions and messages.

Every kind is named here, the ones traced mode (precaudit/trace) and precaudit train make too: the rule loader
checks a rule file against this vocabulary, and it sits below both (a rule about a training step loads without
torch or the train package).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...dtypes import FORMATS
from ...ir import Node

__all__ = ["FACT_NAMES", "OP_SITES", "PATTERN_FACTS", "Site"]

# Single ops audited for what they do with their input; the site kind is the lower-case op name.
OP_SITES = {"Softmax", "LogSoftmax", "Log", "Sqrt", "Reciprocal", "Div", "Exp", "Pow"}

_DTYPE_FACTS = {"compute_dtype", "compute_reason", "target_dtype", "target_ulp_at_1", "runtime", "compute_fact",
                "compute_source", *FORMATS["fp32"].numbers()}
_EPS_FACTS = {"has_eps", "eps", "eps_converted", "eps_rounded", "eps_class", "eps_source", "eps_role",
              "eps_placement", "keep_hint", "eps_dtype", "eps_floor"}
_OP_FACTS = {"op", "input_op", "input_class", "in_norm_chain", "selected_by_where", *_DTYPE_FACTS}
FACT_NAMES: dict[str, set[str]] = {
    "norm": {"norm", "op", "missing_note", "stat_dtype", "stat_square_overflow", "stat_floor", *_EPS_FACTS,
             *_DTYPE_FACTS},
    **{op.lower(): set(_OP_FACTS) for op in OP_SITES},
}
FACT_NAMES["div"] |= {"divisor_op", "divisor_class", "divisor_mask"}
FACT_NAMES["reciprocal"] |= {"divisor_op", "divisor_class", "divisor_mask"}
# Sums: how many elements each output adds up (unknown where a shape or the axes are), in which dtype.
FACT_NAMES["reduction"] = {"op", "input_op", "in_norm_chain", "reduction_length", "reduction_axes", "swamp_length",
                           "overflow_term", "exp_input", "exp_shifted", "exp_node", "exp_path", "sum_use",
                           "exp_sum_overflow", "exp_terms", "exp_dtype", "exp_overflow", *_DTYPE_FACTS}
# float32 weights (initializers, Constant tensors), measured against the dtype a conversion gives them (clamped
# where the converter clamps them): every one with --check-weights or --trace, the modes that read weights; the
# fused normalizations' parameters (per-channel vectors: role says which) in the static audit too.
FACT_NAMES["weight"] = {"op", "name", "source", "consumer", "role", "read_as", "elements", "nonzero", "absmax",
                        "overflow_count", "underflow_count", "underflow_fraction", "lost_count", "lost_fraction",
                        "negligible_below", "raised_count", "subnormal_fraction", "converted_by", "overflow_limit",
                        "limit_name", "overflow_effect", "block_note", *_DTYPE_FACTS}
FACT_NAMES["pow"].add("exponent")
# Sin and Cos of an angle made from integers (position x frequency, or arithmetic on positions by constants:
# angle_made says which); and a float that carries integers (a Range, a CumSum of ones, a Cast of integer
# positions): how large the graph lets them get, against the format's spacing.
FACT_NAMES["angle"] = {"op", "angle_from", "angle_made", "position_bound", "max_frequency", "angle_bound",
                       "angle_bound_text", "angle_spacing", "coarse_from", *_DTYPE_FACTS}
# compared_by: the comparison that reads counted positions (a Range, a CumSum of ones) to build a mask
FACT_NAMES["integer_float"] = {"op", "integer_from", "int_bound", "int_bound_text", "bound_from", "compared_by",
                               "mask_note", "exact_limit", *_DTYPE_FACTS}
# An eps added to, or a floor (Max, Clip) on, what a division, a negative power, a Log or a Sqrt reads, outside any
# norm: the site is the guard node, judged as a norm's eps is; guarded_class is the sign class of what it guards.
FACT_NAMES["guard"] = {"op", "guard_op", "reader", "reader_op", "guarded_class", "reader_input_class",
                       "in_norm_chain", *_EPS_FACTS, *_DTYPE_FACTS}
# A node whose float input a float16 conversion makes float16 where the op's schema allows no float16 (sites/
# type_support.py): the converted model is invalid
FACT_NAMES["type_support"] = {"op", "input_index", "input_name", "allowed_types", *_DTYPE_FACTS}
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
FACT_NAMES["traced_op"] = {"op", "input_op", "in_norm_chain", "selected_by_where", "samples", "input_max",
                           "input_min", "input_min_abs", "zero_fraction", "negative_fraction", "ref_zero_fraction",
                           "ref_negative_fraction", "output_nonfinite_fraction", "input_rel_error",
                           "input_from_sensitive_op", *_DTYPE_FACTS}
# An angle site and an integer_float site with what the run measured there (the static facts kept).
FACT_NAMES["traced_angle"] = FACT_NAMES["angle"] | {"samples", "angle_max", "angle_error", "output_error"}
FACT_NAMES["traced_integer"] = FACT_NAMES["integer_float"] | {"samples", "int_max", "int_error"}
FACT_NAMES["traced_first_nonfinite"] = {"op", "value", "samples", "nonfinite_fraction", "ref_nonfinite_fraction",
                                        "input_absmax", "chain", "chain_length", "reaches_output", "output",
                                        *_DTYPE_FACTS}
# a graph output the run leaves finite, how far it strays, and the first value upstream that overflowed on the way
FACT_NAMES["traced_output"] = {"value", "op", "samples", "rel_error", "max_error", "absmax", "cause_node", "cause_op",
                               "cause_value", "cause_overflow_fraction", "cause_nonfinite_fraction", *_DTYPE_FACTS}
# value_converted: the constant as a --converter leaves it (clamped), before rounding; converted_by: its words
FACT_NAMES["constant"] = {"op", "value", "value_converted", "converted_by", "value_rounded", "value_class", "source",
                          "consumer", "mask_fill", *_DTYPE_FACTS}

# Quantize and dequantize nodes' constant scales (quant_scale), scales computed as amax / k (dynamic_scale), and what
# a block-scaled format does to a tensor block by block: weights (block_weight, --check-weights), activations in a
# traced run (traced_blocks).
FACT_NAMES["quant_scale"] = {"op", "consumer", "scale_source", "scale_dtype", "expected_dtype", "dtype_mismatch",
                             "scale_count", "zero_count", "nan_count", "inf_count", "subnormal_count", "bad_count",
                             "first_reader", "problem", "first_bad", "input_op", "quantizes", "quantized_to", "scale",
                             "zeroed_below", *_DTYPE_FACTS}
FACT_NAMES["dynamic_scale"] = {"op", "scale_name", "amax_node", "amax_op", "divisor", "reader", "reader_op", "inverse",
                               *_DTYPE_FACTS}
_BLOCK_FACTS = {"name", "source", "format", "block", "scale_format", "axis", "elements", "nonzero", "blocks", "zeroed_count", "zeroed_fraction",
                "saturated_count", "owned_blocks", "owned_fraction", "worst_blocks", "scale_underflow_blocks",
                "scale_saturated_blocks", "scale_nan_blocks", "worst_scale", "nan_count", "rel_error", *_DTYPE_FACTS}
FACT_NAMES["block_weight"] = {"op", "consumer", *_BLOCK_FACTS}
FACT_NAMES["traced_blocks"] = {"op", "value", "consumer", "samples", "output_rel_error", *_BLOCK_FACTS}

# precaudit train's sites (precaudit/train makes them, from a training step)
_REGIME = {"regime", "regime_summary", "low_dtype"}
_FMT = set(FORMATS["fp32"].numbers())
# where the regime's gradient disagrees with float32's: float32's own against float64's (None: not measured);
# ref_noise, float32's gradient is rounding noise itself (an exact gradient of 0) and nothing compares with it
_NOISE = {"ref_noise", "ref_cosine_f64"}
FACT_NAMES.update({
    # the optimizer's eps in the dtype its states are held in
    "train_optimizer": {"optimizer", "eps", "eps_rounded", "eps_class", "states_dtype", "lr", *_REGIME, *_FMT},
    # updates of size lr (Adam's first steps: |m/sqrt(v)| ~ 1) against half an ulp of each weight
    "train_update_bound": {"optimizer", "lr", "weights_dtype", "elements", "absorbed_elements", "absorbed_fraction",
                           "worst_param", "worst_fraction", "worst_absmedian", "half_ulp_at_worst", *_REGIME, *_FMT},
    # a norm's (or a guard's) eps as the backward meets it: the largest gradient gain it allows, in the dtype the
    # op's backward runs in (the dtype its forward computes in)
    "train_norm_backward": {"op", "norm", "eps", "eps_rounded", "eps_placement", "eps_source", "backward_dtype",
                            "backward_bound", "bound_formula", *_REGIME, *_FMT},
    "train_guard_backward": {"op", "reader_op", "eps", "eps_rounded", "eps_source", "backward_dtype",
                             "backward_bound", "bound_formula", *_REGIME, *_FMT},
    # traced: per parameter, its gradient and update against the float32 reference's
    "train_grad": {"param", "elements", "ref_nonzero", "underflow_unscaled", "underflow_scaled", "subnormal_scaled",
                   "loss_scale", "cosine", "rel_error", "grad_dtype", "inputs_from", *_NOISE, *_REGIME, *_FMT,
                   # float16: the scale the run starts at, and the largest that keeps the backward finite (where
                   # the step ran at it) with the gradient there and the run's against it; phrases of the message
                   "loss_scale_start", "best_scale", "cosine_best", "rel_error_best", "underflow_best",
                   "underflow_cosine", "backed_off", "direction_note", "at_best"},
    "train_update": {"param", "elements", "ref_changed", "absorbed", "absorbed_fraction", "lr", "weights_dtype",
                     "absmedian", "steps", "inputs_from", *_NOISE, *_REGIME, *_FMT},
    # traced: the loss-scale window (fp16 regimes), against GradScaler's start
    "train_loss_scale": {"scale_init", "scale_min", "scale_max", "window_empty", "skipped_steps", "growth_steps",
                         "backward_max", "keep_fraction", "scaler", "inputs_from", *_REGIME, *_FMT,
                         # measured: the share of gradient elements lost to 0 at the start and at the top, and
                         # the parameters that lose elements or their direction there
                         "top_measured", "lost_start", "lost_top", "params_start", "params_top"},
    # traced: the first inf/NaN of the regime's step, where float32's step was finite
    "train_first_nonfinite": {"op", "phase", "autograd_node", "forward_op", "dtype", "nonfinite_fraction",
                              "input_absmax", "ref_finite", "loss_scale", "inputs_from", *_REGIME, *_FMT},
    # traced: the backward through a constant (collapsed) row fed to each norm module
    "train_collapsed_row": {"op", "phase", "autograd_node", "forward_op", "dtype", "nonfinite_fraction",
                            "ref_finite", "ref_outcome", "norm_modules", "inputs_from", *_REGIME, *_FMT},
})
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
