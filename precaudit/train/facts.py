"""The facts each training site kind carries (plain data, no torch: the rule loader reads it)."""

from __future__ import annotations

from ..dtypes import FORMATS

__all__ = ["TRAIN_FACTS"]

_REGIME = {"regime", "regime_summary", "low_dtype"}
_FMT = set(FORMATS["fp32"].numbers())
# where the regime's gradient disagrees with float32's: float32's own against float64's (None: not measured);
# ref_noise, float32's gradient is rounding noise itself (an exact gradient of 0) and nothing compares with it
_NOISE = {"ref_noise", "ref_cosine_f64"}
TRAIN_FACTS: dict[str, set[str]] = {
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
                   "loss_scale", "cosine", "rel_error", "grad_dtype", "inputs_from", *_NOISE, *_REGIME, *_FMT},
    "train_update": {"param", "elements", "ref_changed", "absorbed", "absorbed_fraction", "lr", "weights_dtype",
                     "absmedian", "steps", "inputs_from", *_NOISE, *_REGIME, *_FMT},
    # traced: the loss-scale window (fp16 regimes), against GradScaler's start
    "train_loss_scale": {"scale_init", "scale_min", "scale_max", "window_empty", "skipped_steps", "growth_steps",
                         "backward_max", "keep_fraction", "scaler", "inputs_from", *_REGIME, *_FMT},
    # traced: the first inf/NaN of the regime's step, where float32's step was finite
    "train_first_nonfinite": {"op", "phase", "autograd_node", "forward_op", "dtype", "nonfinite_fraction",
                              "input_absmax", "ref_finite", "loss_scale", "inputs_from", *_REGIME, *_FMT},
    # traced: the backward through a constant (collapsed) row fed to each norm module
    "train_collapsed_row": {"op", "phase", "autograd_node", "forward_op", "dtype", "nonfinite_fraction",
                            "ref_finite", "ref_outcome", "norm_modules", "inputs_from", *_REGIME, *_FMT},
}
