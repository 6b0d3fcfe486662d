"""One training step twice — the float32 reference and the regime emulated op by op — and what differs.

Both runs start from copies of the same weights, draw the same random numbers (dropout), and step the same
optimizer; the regime's backward runs once without loss scaling and, under a scaler, once more at the scale
the scaler would use, as GradScaler runs it: the loss multiplied, the float32 master gradients divided back,
the step skipped when any is inf/NaN. What is compared is per parameter (its gradient, its update) and per
op (the first inf/NaN, and the largest backward value in float16: the top of the loss-scale window).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..dtypes import FORMATS
from ..errors import InputError
from ..frontends.user_code import user_code
from .capture import capture, capture_pair
from .emulate import Event, Recorder, RoundingMode, SameDrawsMode, all_finite, run_loss
from .factory import TrainSetup
from .regimes import Regime

__all__ = ["KEEP_FRACTION", "ParamStats", "StepResult", "run_steps"]

KEEP_FRACTION = 0.999  # the loss-scale window's bottom keeps this share of the reference's nonzero gradients
NOISE_CHECK_COSINE = 0.999  # a regime gradient this far from float32's has float32's checked against float64
REF_NOISE_COSINE = 0.9  # float32's gradient this far from float64's is rounding noise


@dataclass
class ParamStats:
    name: str
    elements: int
    weights_dtype: str
    ref_nonzero: int  # elements of the reference's gradient that are not 0
    underflow_unscaled: float  # of those, the share the regime's gradient has as 0 with no loss scaling
    underflow_scaled: float  # ... at the regime's loss scale (the same as unscaled without a scaler)
    subnormal_scaled: float  # ... the share whose scaled gradient is subnormal in the low dtype
    cosine: float | None  # of the regime's gradient (as it trains: unscaled back) against the reference's
    rel_error: float | None
    ref_changed: int  # elements the reference's steps moved
    absorbed: int  # of those, the elements the regime's steps left bit-identical
    lr: float
    absmedian: float  # the median |weight|, for the message
    grad_absmax: float = 0.0  # the reference gradient's largest |element| (the HTML report's chart)
    grad_min_nonzero: float | None = None  # ... and its smallest nonzero one (None: all 0)
    # where the regime's gradient points elsewhere (cosine < NOISE_CHECK_COSINE): float32's own gradient against
    # a float64 run's; low, float32's gradient is rounding noise too (a key bias under softmax's shift
    # invariance has an exact gradient of 0), and no comparison with it means anything
    ref_cosine_f64: float | None = None

    @property
    def ref_noise(self) -> bool:
        return self.ref_cosine_f64 is not None and self.ref_cosine_f64 < REF_NOISE_COSINE


@dataclass
class StepResult:
    regime: Regime
    steps: int
    scale: float  # the loss scale the regime's backward ran at (1 without a scaler)
    loss_ref: float
    loss_regime: float
    params: list[ParamStats] = field(default_factory=list)
    # where the regime's step first turned inf/NaN, past what the float32 program does too (set when the step's
    # result is not finite): in the forward and unscaled backward, and in the optimizer step
    first_unscaled: Event | None = None
    first_step: Event | None = None
    ref_finite: bool = True  # the reference's loss and gradients are all finite
    regime_finite: bool = True  # the regime's loss, unscaled gradients and stepped weights are all finite
    skipped_steps: int = 0  # steps the scaler skipped in this run
    backward_low_max: float = 0.0  # the largest |backward value| held in the low dtype, unscaled
    window: tuple[float | None, float | None] = (None, None)  # (smallest kept scale, largest finite scale)
    module: Any = None  # the regime's captured program: its nodes give the source lines of the events
    ops: int = 0  # ATen ops the emulation ran


def run_steps(setup: TrainSetup, regime: Regime, steps: int = 1, seed: int = 0, loss_scale: float | None = None,  # noqa: C901 -- split by the training branch that reworks it
              lr: float | None = None) -> StepResult:
    ref, reg = capture_pair(setup, regime)
    ref_named, reg_named = ref.named_parameters(), dict(reg.named_parameters())
    scale = loss_scale if loss_scale is not None else regime.scaler.init if regime.scaler else 1.0
    result = StepResult(regime, steps, scale, math.nan, math.nan, module=reg.module)

    ref_before = {n: p.detach().clone() for n, p in ref_named}
    reg_before = {n: p.detach().clone() for n, p in reg_named.items()}
    ref_opt = setup.optimizer.build(ref_named, lr)
    reg_opt = setup.optimizer.build(list(reg_named.items()), lr)
    # what the regime's inf/NaN events are read from: step 0's forward and unscaled backward, and the first
    # optimizer step that made any
    forward_rec: Recorder | None = None
    step_rec: Recorder | None = None
    ref_grads: dict[str, torch.Tensor | None] = {}
    g_unscaled: dict[str, torch.Tensor | None] = {}
    g_scaled: dict[str, torch.Tensor | None] = {}
    low = FORMATS[regime.low]
    for step in range(steps):
        # -- the reference --
        torch.manual_seed(seed + step)
        with user_code(setup.spec, "the float32 reference step"):
            loss = run_loss(ref.module, ref.flat, Recorder())
            if not loss.requires_grad:
                raise InputError(setup.spec, "the loss does not depend on any parameter: no gradient reaches the "
                                             "model's weights")
            loss.backward()
        if step == 0:
            result.loss_ref = float(loss.detach())
            if not math.isfinite(result.loss_ref):
                raise _loss_not_finite(setup.spec, result.loss_ref)
            ref_grads = {n: None if p.grad is None else p.grad.detach().clone() for n, p in ref_named}
            if all(g is None for g in ref_grads.values()):
                raise InputError(setup.spec, "the loss does not depend on any parameter: no gradient reaches the "
                                             "model's weights")
            result.ref_finite = math.isfinite(result.loss_ref) and all(
                g is None or all_finite(g) for g in ref_grads.values())
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)

        # -- the regime, emulated --
        torch.manual_seed(seed + step)
        unscaled = Recorder(watch_backward_max=step == 0)
        stepping = Recorder()
        stepping.phase = "optimizer step"
        # each run under its own mode, one after another: nested modes would each see the other's ops
        with user_code(setup.spec, f"the {regime.name} step"):
            with RoundingMode(unscaled):
                loss = run_loss(reg.module, reg.flat, unscaled)
                if step == 0:
                    result.loss_regime = float(loss.detach())
                    loss.backward(retain_graph=scale != 1.0)
            if step == 0:
                g_unscaled = _grads(reg_named)
                forward_rec = unscaled
                result.backward_low_max = unscaled.backward_low_max
                if scale != 1.0:
                    reg_opt.zero_grad(set_to_none=True)
            if step > 0 or scale != 1.0:
                with RoundingMode(Recorder()):
                    (loss * scale).backward()
            # GradScaler's unscale_: the master gradients divided by the scale, in their own dtype
            if scale != 1.0:
                for p in reg_named.values():
                    if p.grad is not None:
                        p.grad.div_(scale)
            if step == 0:
                g_scaled = _grads(reg_named) if scale != 1.0 else g_unscaled
            finite = all(p.grad is None or all_finite(p.grad) for p in reg_named.values())
            if regime.scaler is not None and not finite:
                result.skipped_steps += 1  # GradScaler skips the step and backs the scale off
                scale *= regime.scaler.backoff
            else:
                with RoundingMode(stepping):
                    reg_opt.step()
                if stepping.events and step_rec is None:
                    step_rec = stepping
            reg_opt.zero_grad(set_to_none=True)
        result.ops += unscaled.ops + stepping.ops

    result.regime_finite = math.isfinite(result.loss_regime) and all(
        g is None or all_finite(g) for g in g_unscaled.values()) and all(
        all_finite(p) for p in reg_named.values())
    if not result.regime_finite and (step_rec is not None or (forward_rec is not None and forward_rec.events)):
        # the first inf/NaN that float32's own run of the program does not make too
        expected = reference_events(setup, seed)
        result.first_unscaled = forward_rec.first_beyond(expected) if forward_rec is not None else None
        result.first_step = step_rec.first_beyond(expected) if step_rec is not None else None
    for name, p in ref_named:
        result.params.append(_param_stats(name, p, ref_before[name], ref_grads.get(name), reg_named[name],
                                          reg_before[name], g_unscaled.get(name), g_scaled.get(name),
                                          result.scale, low, setup.optimizer.hyper(name).get("lr", 0.0)
                                          if lr is None else lr))
    doubtful = {p.name for p in result.params if p.cosine is not None and p.cosine < NOISE_CHECK_COSINE}
    if doubtful:
        wide = float64_gradients(setup, seed, doubtful)
        for stats in result.params:
            g = ref_grads.get(stats.name)
            if stats.name in wide and g is not None:
                stats.ref_cosine_f64 = _agreement(wide[stats.name], g)[0]
    if regime.low == "fp16":
        result.window = _window(ref_grads, result.backward_low_max, low)
    return result


def _loss_not_finite(spec: str, loss: float) -> InputError:
    """An input error, not a finding: float32 makes it, before any low precision, and with no finite float32 step
    there is nothing to measure the regime against (every comparison would be NaN, and the run would look clean)."""
    return InputError(spec, f"the loss is {loss} in float32, before any low precision (the float32 reference step "
                            "on the factory's batch): the audit compares the regime with a finite float32 step; fix "
                            "the model or loss_fn first")


def reference_events(setup: TrainSetup, seed: int) -> set:
    """Where the float32 program's own first step makes inf/NaN from finite inputs (a mask's -inf, T5's
    log(0) before its where): places an inf in the regime's run does not tell anything."""
    ref = capture(setup, None)
    torch.manual_seed(seed)
    rec = Recorder()
    with user_code(setup.spec, "the float32 reference step"), RoundingMode(rec, emulate=False):
        run_loss(ref.module, ref.flat, rec).backward()
    return {e.key for e in rec.events}


def float64_gradients(setup: TrainSetup, seed: int, names: set[str]) -> dict[str, torch.Tensor]:
    """These parameters' gradients from the first step's forward and backward in float64, drawing dropout's
    masks as the float32 reference did."""
    wide = capture(setup, None, wide=True)
    torch.manual_seed(seed)
    with user_code(setup.spec, "the float64 step"), SameDrawsMode():
        run_loss(wide.module, wide.flat, Recorder()).backward()
    return {n: p.grad.detach().clone() for n, p in wide.named_parameters() if n in names and p.grad is not None}


def _grads(named: dict[str, nn.Parameter]) -> dict[str, torch.Tensor | None]:
    return {n: None if p.grad is None else p.grad.detach().float().clone() for n, p in named.items()}


def _param_stats(name, ref_p, ref_before, g_ref, reg_p, reg_before, g1, gs, scale, low, lr) -> ParamStats:
    # counted with count_nonzero: a bool tensor's sum() widens it to int64 first, several times slower
    elements = ref_p.numel()
    nz = (g_ref != 0) if g_ref is not None else torch.zeros(ref_p.shape, dtype=torch.bool)
    n_nz = int(torch.count_nonzero(nz))
    under1 = _share(nz, g1, n_nz)
    unders = _share(nz, gs, n_nz)
    if gs is not None and n_nz:
        held = (gs * scale).abs()
        sub = int(torch.count_nonzero(nz & (held > 0) & (held < low.smallest_normal))) / n_nz
    else:
        sub = 0.0
    cosine = rel = None
    if g_ref is not None and gs is not None:
        cosine, rel = _agreement(g_ref, gs)
    changed = ref_p.detach() != ref_before
    absorbed = int(torch.count_nonzero(changed & (reg_p.detach() == reg_before)))
    # the median |weight| is for PA456's message only, and a median sorts: taken where there is something absorbed
    median = float(ref_before.abs().flatten().median()) if absorbed else 0.0
    top = low_nz = None
    if n_nz:
        magnitude = g_ref.detach().abs()
        top = float(magnitude.max())
        low_nz = float(torch.where(nz, magnitude, torch.inf).min())
    return ParamStats(name, elements, str(reg_p.dtype).replace("torch.", ""), n_nz, under1, unders, sub, cosine,
                      rel, int(torch.count_nonzero(changed)), absorbed, float(lr), median, top or 0.0, low_nz)


def _share(nonzero: torch.Tensor, grad: torch.Tensor | None, total: int) -> float:
    """Of the reference's nonzero elements, the share this gradient has as 0."""
    if not total or grad is None:
        return 0.0
    return int(torch.count_nonzero(nonzero & (grad == 0))) / total


def _agreement(a: torch.Tensor, b: torch.Tensor) -> tuple[float | None, float | None]:
    """The cosine of b against a, and |b - a| / |a|; None where a is 0 or b is not finite. In float32, each
    vector divided by its largest |element| first: squares of gradients below 1e-19 underflow float32."""
    a, b = a.detach().float().flatten(), b.detach().float().flatten()
    sa, sb = float(a.abs().max()) if a.numel() else 0.0, float(b.abs().max()) if b.numel() else 0.0
    if not (sa > 0 and math.isfinite(sa) and math.isfinite(sb)):
        return None, None
    ua = a / sa
    na = float(torch.linalg.vector_norm(ua))
    rel = float(torch.linalg.vector_norm(b / sa - ua)) / na
    if sb == 0:
        return 0.0, rel
    ub = b / sb
    return float(torch.dot(ua, ub)) / (na * float(torch.linalg.vector_norm(ub))), rel


def _window(ref_grads: dict[str, torch.Tensor | None], backward_max: float, low) -> tuple[float | None, float | None]:
    """The powers of two a loss scale can take: the smallest that keeps KEEP_FRACTION of the reference's nonzero
    gradient elements from rounding to 0 in the low dtype, the largest before the backward's largest value
    (measured unscaled, in the low dtype) overflows it."""
    # frexp: |g| = m * 2**e with m in [0.5, 1); g * 2**k is nonzero in the low dtype when e + k >= log2 of its
    # smallest subnormal (g * 2**k > half of it; the exact tie rounds to 0)
    floor = round(math.log2(low.smallest_subnormal))
    counts: dict[int, int] = {}
    total = 0
    for g in ref_grads.values():
        if g is None or not g.numel():
            continue
        # frexp's exponent read off float32's bits (five times faster than frexp): biased exponent b is 2**(b-127)
        # for a normal number, so frexp's e = b - 126; b = 0 holds the zeros and float32's subnormals, which no
        # loss scale below 2**100 lifts: counted at the lowest exponent
        biased = torch.bincount(((g.float().view(torch.int32) >> 23) & 0xFF).flatten(), minlength=256).tolist()
        zeros = g.numel() - int(torch.count_nonzero(g))
        biased[0] -= zeros
        for b, c in enumerate(biased):
            if c:
                e = b - 126 if b else -149
                counts[e] = counts.get(e, 0) + c
        total += g.numel() - zeros
    smallest = None
    if total:
        allowed = (1 - KEEP_FRACTION) * total
        lost = 0
        k_min = None
        for e in sorted(counts):  # the scale must lift every exponent above what may be lost
            if lost + counts[e] > allowed:
                k_min = floor - e
                break
            lost += counts[e]
        smallest = 2.0 ** k_min if k_min is not None else None
    largest = None
    if backward_max > 0 and math.isfinite(backward_max):
        largest = 2.0 ** math.floor(math.log2(low.overflow_threshold / backward_max))
        if largest * backward_max >= low.overflow_threshold:
            largest /= 2
    return smallest, largest


_NORM_CLASS = re.compile(r"Norm(alization)?(\d+d)?\Z")  # LayerNorm, LlamaRMSNorm, GroupNorm, T5LayerNorm


def _is_norm(module: nn.Module) -> bool:
    # BatchNorm's statistics run over the batch, not a row: zeroing one row does not collapse them
    name = type(module).__name__
    return bool(_NORM_CLASS.search(name)) and "BatchNorm" not in name


def _collapse_first_row(model: nn.Module) -> int:
    """A forward pre-hook on every norm module: row 0 of its input (along the last axis) set to zeros, the
    collapsed row a constant or padded position gives, whose variance is exactly 0."""
    def hook(module, args):
        if not args or not isinstance(args[0], torch.Tensor) or args[0].dim() < 2:
            return None
        x = args[0]
        keep = torch.ones(x.shape[-2], 1, dtype=x.dtype)
        keep[0] = 0
        return (x * keep, *args[1:])
    found = 0
    for module in model.modules():
        if _is_norm(module):
            module.register_forward_pre_hook(hook)
            found += 1
    return found


def collapsed_row(setup: TrainSetup, regime: Regime, seed: int = 0) -> tuple[Event | None, bool, int, Any] | None:
    """The backward through a zero row at every norm: the first inf/NaN in the regime, whether float32's is
    finite, how many norm modules, and the program run (its nodes name the source lines); None when the model
    has no norm module. Run on the batch's first sample where the inputs share a batch axis (one row is what it
    is about: a quarter of the work on a batch of 4), on the whole batch where that fails."""
    first = _first_sample(setup)
    if first is not None:
        try:
            return _collapsed_row(first, regime, seed)
        except InputError:
            pass  # a model or loss_fn that needs the whole batch (a fixed reshape, targets it closes over)
    return _collapsed_row(setup, regime, seed)


def _first_sample(setup: TrainSetup) -> TrainSetup | None:
    tensors = [a for a in setup.flat if isinstance(a, torch.Tensor) and a.dim() >= 1]
    sizes = {t.shape[0] for t in tensors}
    if len(sizes) != 1 or min(sizes) < 2:
        return None
    flat = [a[:1] if isinstance(a, torch.Tensor) and a.dim() >= 1 else a for a in setup.flat]
    return dataclasses.replace(setup, flat=flat)


def _collapsed_row(setup: TrainSetup, regime: Regime, seed: int) -> tuple[Event | None, bool, int, Any] | None:
    counted: list[int] = []
    ref, reg = capture_pair(setup, regime, hooks=lambda m: counted.append(_collapse_first_row(m)))
    if not counted or not counted[0]:
        return None
    torch.manual_seed(seed)
    with user_code(setup.spec, "the float32 step on a collapsed row"):
        loss = run_loss(ref.module, ref.flat, Recorder())
        loss.backward()
    ref_finite = math.isfinite(float(loss.detach())) and all(
        p.grad is None or all_finite(p.grad) for _, p in ref.named_parameters())
    torch.manual_seed(seed)
    rec = Recorder()
    with user_code(setup.spec, f"the {regime.name} step on a collapsed row"), RoundingMode(rec):
        loss = run_loss(reg.module, reg.flat, rec)
        loss.backward()
    finite = all(p.grad is None or all_finite(p.grad) for _, p in reg.named_parameters())
    # the backward's first inf/NaN, whether float32's is finite or not (the finding says which): the forward's
    # (T5's log(0) before its where) are the program's own, not the collapsed row's
    event = next((e for e in rec.events if e.phase == "backward"), None) if not finite else None
    return event, ref_finite, counted[0], reg.module
