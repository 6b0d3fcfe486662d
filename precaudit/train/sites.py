"""Training's sites: what the rules in rules/PA4xx-*.yaml judge, static (from the forward graph, the optimizer's
configuration and the weights) and traced (from one step run twice, precaudit/train/step.py)."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..analysis.sites.base import Site
from ..dtypes import FORMATS, Format, classify, round_to_format
from ..ir import Node
from .capture import LOW
from .emulate import Event
from .factory import TrainSetup
from .regimes import Regime
from .stats import KEEP_FRACTION
from .step import StepResult

__all__ = ["static_sites", "traced_sites"]


def _regime_facts(regime: Regime, fmt: Format) -> dict[str, Any]:
    return {"regime": regime.name, "regime_summary": regime.summary, "low_dtype": FORMATS[regime.low].long_name,
            **fmt.numbers()}


def _format_of(long_name: str) -> Format:
    """The format a dtype's long name ('float16', 'bfloat16') names (float32 for any other): facts and torch
    dtypes say long names."""
    return next((f for f in FORMATS.values() if f.long_name == long_name), FORMATS["fp32"])


def _node(name: str, op: str, scope: str | None = None) -> Node:
    return Node(name=name, op_type=op, scope=scope)


# ---- static ----------------------------------------------------------------------------------------------


def static_sites(setup: TrainSetup, regime: Regime, forward_sites: list[Site], lr: float | None = None
                 ) -> list[Site]:
    """The optimizer's eps, the updates too small to land, and each norm's and guard's backward bound."""
    sites = []
    states = FORMATS[regime.weights]
    opt = setup.optimizer
    first = opt.groups[0]
    if "eps" in first:
        eps = float(first["eps"])
        sites.append(Site("train_optimizer", _node(f"{opt.kind}.eps", opt.kind), {
            "optimizer": opt.label, "eps": eps, "eps_rounded": round_to_format(eps, states),
            "eps_class": classify(eps, states), "states_dtype": states.long_name,
            "lr": float(first["lr"]) if lr is None else lr,
            **_regime_facts(regime, states)}))
    if opt.kind in ("Adam", "AdamW") and regime.weights != "fp32":
        sites.append(_update_bound(setup, regime, FORMATS[regime.weights], lr))
    for site in forward_sites:
        placement = site.facts.get("eps_placement")
        if site.kind == "norm" and site.facts.get("has_eps") and placement == "inside_sqrt":
            sites.append(_backward(site, regime, "train_norm_backward"))
        elif site.kind == "norm" and site.facts.get("has_eps") and placement == "guard":
            # x / max(||x||, eps) (F.normalize): a floor on the divisor, whose backward is 1/eps at it
            sites.append(_backward(site, regime, "train_guard_backward", reader="Div"))
        elif site.kind == "guard" and not site.facts.get("in_norm_chain") and site.facts.get("reader_op") in ("Div", "Reciprocal", "Sqrt", "Log", "Pow"):
            sites.append(_backward(site, regime, "train_guard_backward"))
    return sites


def _backward(site: Site, regime: Regime, kind: str, reader: str | None = None) -> Site:
    facts = site.facts
    fmt = _format_of(facts["compute_dtype"])
    eps = facts["eps_rounded"]
    reader = reader or facts.get("reader_op", "Sqrt")
    if kind == "train_norm_backward" or reader == "Sqrt":
        bound, formula = (math.inf if eps <= 0 else 1 / (2 * math.sqrt(eps))), "d sqrt(v + eps)/dv at v = 0 = 1/(2 sqrt(eps))"
    else:
        bound, formula = (math.inf if eps <= 0 else 1 / eps), f"d {reader}/dx at the floor = 1/eps"
    out = {"op": facts["op"], "eps": facts["eps"], "eps_rounded": eps, "eps_source": facts.get("eps_source", ""),
           "backward_dtype": fmt.long_name, "backward_bound": bound, "bound_formula": formula,
           **_regime_facts(regime, fmt)}
    if kind == "train_norm_backward":
        out |= {"norm": facts.get("norm", ""), "eps_placement": facts["eps_placement"]}
    else:
        out["reader_op"] = reader
    return Site(kind, site.node, out, span=site.span)


def _half_ulp(w: torch.Tensor, fmt: Format) -> torch.Tensor:
    """Half the spacing of fmt at each |w| (normal numbers): an update below it rounds back to w."""
    mant = {"fp16": 10, "bf16": 7}.get(fmt.name, 23)
    e = torch.frexp(w.float().abs()).exponent  # |w| = m * 2**e, m in [0.5, 1): the ulp is 2**(e - 1 - mant)
    return torch.where(w == 0, torch.tensor(fmt.smallest_subnormal / 2), torch.pow(2.0, (e - 2 - mant).float()))


def _update_bound(setup: TrainSetup, regime: Regime, fmt: Format, lr_given: float | None) -> Site:
    opt = setup.optimizer
    total = absorbed = 0
    worst = ("", 0.0, 0.0, 0.0)
    low = LOW[fmt.name]
    for name, p in setup.model.named_parameters():
        if not p.requires_grad:
            continue
        lr = float(opt.hyper(name).get("lr", 0.0)) if lr_given is None else lr_given
        w = p.detach().to(low)
        wide = w.float()
        # Adam's first steps move each element by about lr (|m / sqrt(v)| ~ 1), either way: lost when w + lr and
        # w - lr both round back to w in the weights' dtype (exactly as the step's add rounds)
        lost = int(((wide + lr).to(low) == w).logical_and((wide - lr).to(low) == w).sum())
        total += w.numel()
        absorbed += lost
        frac = lost / max(w.numel(), 1)
        if frac > worst[1]:
            median = float(w.float().abs().median())
            worst = (name, frac, median, float(_half_ulp(torch.tensor([median]).to(low), fmt)[0]))
    first = opt.groups[0]
    return Site("train_update_bound", _node("optimizer step", opt.kind), {
        "optimizer": opt.label, "lr": float(first["lr"]) if lr_given is None else lr_given,
        "weights_dtype": fmt.long_name, "elements": total,
        "absorbed_elements": absorbed, "absorbed_fraction": absorbed / max(total, 1), "worst_param": worst[0],
        "worst_fraction": worst[1], "worst_absmedian": worst[2], "half_ulp_at_worst": worst[3],
        **_regime_facts(regime, fmt)})


# ---- traced ----------------------------------------------------------------------------------------------


def traced_sites(result: StepResult, collapsed: tuple[Event | None, bool, int, Any] | None,
                 inputs_from: str) -> list[Site]:
    regime = result.regime
    low = FORMATS[regime.low]
    sites = []
    for p in result.params:
        node = _node(p.name, "parameter")
        wfmt = _format_of(p.weights_dtype)
        sites.append(Site("train_grad", node, {
            "param": p.name, "elements": p.elements, "ref_nonzero": p.ref_nonzero,
            "underflow_unscaled": p.underflow_unscaled, "underflow_scaled": p.underflow_scaled,
            "subnormal_scaled": p.subnormal_scaled, "loss_scale": result.scale, "cosine": p.cosine,
            "rel_error": p.rel_error, "grad_dtype": low.long_name, "inputs_from": inputs_from,
            "ref_noise": p.ref_noise, "ref_cosine_f64": p.ref_cosine_f64, "loss_scale_start": result.scale_start,
            "best_scale": result.best_scale, "cosine_best": p.cosine_best, "rel_error_best": p.rel_error_best,
            "underflow_best": p.underflow_best, "underflow_cosine": p.underflow_cosine,
            **_scale_phrases(result, p), **_regime_facts(regime, low)}))
        if result.skipped_steps == result.steps:
            continue  # the scaler skipped every step: nothing was applied to compare (PA452/PA453 say why)
        sites.append(Site("train_update", node, {
            "param": p.name, "elements": p.elements, "ref_changed": p.ref_changed, "absorbed": p.absorbed,
            "absorbed_fraction": p.absorbed / p.ref_changed if p.ref_changed else 0.0, "lr": p.lr,
            "weights_dtype": wfmt.long_name, "absmedian": p.absmedian, "steps": result.steps,
            "ref_noise": p.ref_noise, "ref_cosine_f64": p.ref_cosine_f64,
            "inputs_from": inputs_from, **_regime_facts(regime, wfmt)}))
    if regime.low == "fp16":
        sites.append(_loss_scale_site(result, inputs_from))
    # an inf/NaN the kernels mask later (a norm's backward at a zero vector divides 0/0, then fills 0) is no
    # finding: only a step whose loss, gradients or updated weights are non-finite names where it began
    event = result.first_unscaled or result.first_step
    if event is not None and not result.regime_finite:
        sites.append(_event_site("train_first_nonfinite", event, result, result.module, {
            "ref_finite": result.ref_finite,
            "loss_scale": 1.0 if event is result.first_unscaled else result.scale_start,
            "input_absmax": event.input_absmax, "inputs_from": inputs_from}))
    ev = collapsed[0] if collapsed is not None else None
    if collapsed is not None and ev is not None:  # collapsed_row reports only non-finite gradients
        _, ref_finite, modules, module = collapsed
        sites.append(_event_site("train_collapsed_row", ev, result, module, {
            "ref_finite": ref_finite, "ref_outcome": "finite" if ref_finite else "inf/NaN too",
            "norm_modules": modules,
            "inputs_from": "the factory's batch with row 0 of each norm module's input set to zeros"}))
    return sites


def _scale_phrases(result: StepResult, p) -> dict[str, str]:
    """The loss scales a gradient finding speaks of, as phrases of its message: where GradScaler backed off to,
    and the larger scale the run's gradient was compared with."""
    backed_off = "" if result.scale == result.scale_start else \
        f" (GradScaler's start {result.scale_start:g} overflows the backward; it backs off to {result.scale:g})"
    direction = "" if p.underflow_cosine is None or result.best_scale is None else \
        f"; against its gradient at {result.best_scale:g}, the largest scale whose backward stays finite, its " \
        f"cosine is {p.underflow_cosine:.4f}"
    if result.regime.low != "fp16":
        at_best = ""
    elif result.best_scale is not None:
        at_best = f" at loss scale {result.best_scale:g} (the largest that keeps the backward finite)"
    else:
        at_best = f" at loss scale {result.scale:g}"
    return {"backed_off": backed_off, "direction_note": direction, "at_best": at_best}


def _loss_scale_site(result: StepResult, inputs_from: str) -> Site:
    """The window, against the scale the run starts at: its top measured from the backward, its bottom estimated
    from the float32 gradients' smallest elements, and what underflow costs the run at its start and (where it was
    run) at the top: the share of the gradient elements lost to 0, and the parameters that lose any or their
    direction."""
    regime, low = result.regime, FORMATS[result.regime.low]
    smallest, largest = result.window
    init = result.scale_start
    skipped = growth = 0
    if largest is not None and init > largest:
        skipped = round(math.log2(init / largest))
    if smallest is not None and init < smallest:
        interval = regime.scaler.growth_interval if regime.scaler else 0
        growth = round(math.log2(smallest / init)) * interval
    # a gradient that is rounding noise in float32 too (float64 says so) needs no scale: it is left out
    params = [p for p in result.params if not p.ref_noise]
    total = sum(p.ref_nonzero for p in params) or 1
    at_start = params if result.scale == init else []
    lost_start = sum(p.lost_elements for p in at_start) / total
    top = result.best_scale is not None
    lost_top = sum(round(p.underflow_best * p.ref_nonzero) for p in params) / total if top else 0.0
    return Site("train_loss_scale", _node("loss scale", "GradScaler" if regime.scaler else "loss"), {
        "scale_init": init, "scale_min": smallest, "scale_max": largest, "top_measured": top,
        "window_empty": top and lost_top > 1 - KEEP_FRACTION, "lost_start": lost_start, "lost_top": lost_top,
        "params_start": _names(p.name for p in at_start if p.underflows()),
        "params_top": _names(p.name for p in params if top and p.underflow_best > 1 - KEEP_FRACTION),
        "skipped_steps": skipped, "growth_steps": growth, "backward_max": result.backward_low_max,
        "keep_fraction": KEEP_FRACTION, "scaler": regime.scaler is not None, "inputs_from": inputs_from,
        **_regime_facts(regime, low)})


_SHOWN_NAMES = 6


def _names(names) -> str:
    """Parameter names as a message lists them: quoted, the first few, then how many more ('' for none)."""
    names = list(names)
    shown = ", ".join(f"'{n}'" for n in names[:_SHOWN_NAMES])
    return shown + (f" and {len(names) - _SHOWN_NAMES} more" if len(names) > _SHOWN_NAMES else "")


def _event_site(kind: str, event: Event, result: StepResult, module: Any, extra: dict[str, Any]) -> Site:
    from ..frontends.aten_lowering import _source

    fmt = _format_of(event.dtype)
    op = event.op.split(".")[1] if event.op.startswith("aten.") else event.op
    node = _node("optimizer step" if event.phase == "optimizer step" else event.fx_node or event.op, op)
    fx = next((n for n in module.graph.nodes if n.name == event.fx_node), None) if event.fx_node else None
    forward_op = "-"  # the optimizer's ops belong to no forward op
    if fx is not None:
        _source(node, fx)
        if node.scope and node.scope.startswith("model."):
            node.scope = node.scope.removeprefix("model.")
        elif node.scope == "model":
            node.scope = None
        forward_op = str(getattr(fx.target, "__name__", fx.target)).split(".")[0]
    return Site(kind, node, {
        "op": event.op, "phase": event.phase, "autograd_node": event.autograd_node or "-", "forward_op": forward_op,
        "dtype": event.dtype, "nonfinite_fraction": event.fraction, **extra, **_regime_facts(result.regime, fmt)})
