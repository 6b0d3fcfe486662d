"""One training step twice — the float32 reference and the regime emulated op by op — and what differs.

Both runs start from copies of the same weights, draw the same random numbers (dropout), and step the same
optimizer. The regime's first step runs its forward once and its backward at the loss scale it trains with, as
GradScaler runs it (the loss multiplied, the float32 master gradients divided back, the step skipped when any is
inf/NaN), and, on the same forward, the backward without scaling. In float16, where the scale the run starts at
overflows the backward, the backward runs once more at the scale GradScaler backs off to; where a larger scale
keeps the backward finite and the run's gradient is in doubt (it points elsewhere than float32's, it loses
elements, or the float32 gradients' smallest elements need more), once more at the largest: what it tells apart
is underflow at the run's scale (PA451) from a direction lost at any scale (PA455), and whether any scale works
(PA452). Compared per parameter: its gradients and, at every step, the updates the regime's step did not make.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..dtypes import FORMATS
from ..errors import InputError
from ..frontends.user_code import user_code
from .capture import Captured, capture, capture_pair
from .emulate import Event, Recorder, RoundingMode, SameDrawsMode, all_finite, run_loss
from .factory import TrainSetup
from .regimes import Regime
from .stats import (
    KEEP_FRACTION,
    NOISE_CHECK_COSINE,
    Agreement,
    ParamStats,
    Scratch,
    above_noise,
    lost_share,
    subnormal_share,
    window,
)

__all__ = ["StepResult", "float64_gradients", "reference_events", "run_steps"]

Grads = dict[str, torch.Tensor | None]


@dataclass
class StepResult:
    regime: Regime
    steps: int
    scale: float  # the loss scale the run trains with: its start, or where GradScaler backs off to from it
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
    scale_start: float = 1.0  # the scale the regime starts at (GradScaler's init_scale, --loss-scale; 1 without)
    best_scale: float | None = None  # the largest scale that keeps the backward finite, where the step ran at it


def run_steps(setup: TrainSetup, regime: Regime, steps: int = 1, seed: int = 0, loss_scale: float | None = None,
              lr: float | None = None) -> StepResult:
    ref, reg = capture_pair(setup, regime)
    scale = loss_scale if loss_scale is not None else regime.scaler.init if regime.scaler else 1.0
    result = StepResult(regime, steps, scale, math.nan, math.nan, module=reg.module, scale_start=scale)
    run = _Run(setup, regime, ref, reg, lr, result)
    for step in range(steps):
        run.snapshot(step)
        run.reference_step(seed + step, step)
        scale = run.regime_step(seed + step, step, scale)
    run.finish(seed, lr)
    return result


class _Run:
    """The two runs' copies, optimizers and what the steps measured."""

    def __init__(self, setup: TrainSetup, regime: Regime, ref: Captured, reg: Captured, lr: float | None,
                 result: StepResult):
        self.setup, self.regime, self.ref, self.reg, self.result = setup, regime, ref, reg, result
        self.ref_named = ref.named_parameters()
        self.reg_named = dict(reg.named_parameters())
        self.ref_opt = setup.optimizer.build(self.ref_named, lr)
        self.reg_opt = setup.optimizer.build(list(self.reg_named.items()), lr)
        self.lr = {n: float(setup.optimizer.hyper(n).get("lr", 0.0) if lr is None else lr) for n, _ in self.ref_named}
        self.low = FORMATS[regime.low]
        # the weights before the step being counted: the user's own model before the first (the copies start
        # from it: no copy of every weight is needed), a snapshot before each later one
        self.originals = dict(setup.model.named_parameters())
        self.before: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None = None
        self.moved = {n: 0 for n, _ in self.ref_named}
        self.absorbed = dict(self.moved)
        self.ref_grads: Grads = {}
        self.unscaled: Grads = {}
        self.scratch = Scratch()  # the update counts' masks, reused from parameter to parameter

    # ---- the float32 reference -----------------------------------------------------------------------------

    def reference_step(self, seed: int, step: int) -> None:
        spec = self.setup.spec
        torch.manual_seed(seed)
        with user_code(spec, "the float32 reference step"):
            loss = run_loss(self.ref.module, self.ref.flat, Recorder())
            if not loss.requires_grad:
                raise InputError(spec, "the loss does not depend on any parameter: no gradient reaches the "
                                       "model's weights")
            loss.backward()
        if step == 0:
            result = self.result
            result.loss_ref = float(loss.detach())
            if not math.isfinite(result.loss_ref):
                raise _loss_not_finite(spec, result.loss_ref)
            # kept as they are, not copied: zero_grad(set_to_none) lets go of them, and no optimizer writes a grad
            self.ref_grads = {n: None if p.grad is None else p.grad.detach() for n, p in self.ref_named}
            if all(g is None for g in self.ref_grads.values()):
                raise InputError(spec, "the loss does not depend on any parameter: no gradient reaches the "
                                       "model's weights")
            result.ref_finite = all(g is None or all_finite(g) for g in self.ref_grads.values())
        self.ref_opt.step()
        self.ref_opt.zero_grad(set_to_none=True)

    # ---- the regime ----------------------------------------------------------------------------------------

    def regime_step(self, seed: int, step: int, scale: float) -> float:
        """One step of the regime at this scale; the scale the next one runs at (GradScaler backs off)."""
        regime, result = self.regime, self.result
        torch.manual_seed(seed)
        with user_code(self.setup.spec, f"the {regime.name} step"):
            forward = Recorder()
            with RoundingMode(forward):
                loss = run_loss(self.reg.module, self.reg.flat, forward)
            result.ops += forward.ops
            if step == 0:
                result.loss_regime = float(loss.detach())
                applied = self._first_backwards(loss, scale)
            else:
                applied = self._backward(loss, scale, retain=False)[0]
            del loss  # the forward's graph, held for the backwards of the first step
            finite = all(g is None or all_finite(g) for g in applied.values())
            if regime.scaler is not None and not finite:
                result.skipped_steps += 1  # GradScaler skips the step and backs the scale off
                return scale * regime.scaler.backoff
            for name, p in self.reg_named.items():
                p.grad = applied[name]
            if regime.weights == "fp32":  # float32 master weights and states: nothing in the step to round
                self.reg_opt.step()
            else:
                stepping = Recorder()
                with RoundingMode(stepping):
                    self.reg_opt.step()
                result.ops += stepping.ops
            self.reg_opt.zero_grad(set_to_none=True)
        self._count_updates(step)
        return scale

    def _backward(self, loss: torch.Tensor, scale: float, retain: bool, watch: bool = False) -> tuple[Grads, float]:
        """The regime's gradients at this loss scale, divided back by it in their own dtype (GradScaler's
        unscale_), and the largest |value| the backward held in the low dtype (watch) at that scale."""
        for p in self.reg_named.values():
            p.grad = None
        rec = Recorder(watch_backward_max=watch)
        with RoundingMode(rec):
            (loss * scale if scale != 1.0 else loss).backward(retain_graph=retain)
        self.result.ops += rec.ops
        grads: Grads = {}
        for name, p in self.reg_named.items():
            g = None if p.grad is None else p.grad.detach()
            if g is not None and scale != 1.0:
                g.div_(scale)
            grads[name] = g
            p.grad = None
        return grads, rec.backward_low_max

    def _first_backwards(self, loss: torch.Tensor, scale: float) -> Grads:
        """The first step's backwards, all on its one forward: the gradient it applies, and what the statistics
        compare (result.params). Its backward max is read where it runs at its scale (below float16's floor, an
        unscaled backward can be all zeros); where that overflows, from the unscaled one."""
        fp16 = self.regime.low == "fp16"
        applied, top = self._backward(loss, scale, retain=True, watch=fp16)
        backward_max = top / scale if math.isfinite(top) else math.nan
        unscaled = applied
        if scale != 1.0:
            unscaled, top1 = self._backward(loss, 1.0, retain=True, watch=fp16 and not math.isfinite(backward_max))
            backward_max = top1 if not math.isfinite(backward_max) else backward_max
        self.unscaled = unscaled
        result = self.result
        if not fp16:
            self._compare(unscaled, applied, scale)
            return applied
        result.backward_low_max = backward_max if math.isfinite(backward_max) else 0.0
        result.window = window(self.ref_grads, result.backward_low_max, self.low)
        largest = result.window[1]
        trains_at = self._trains_at(scale, largest)
        trains = applied if trains_at == scale else self._backward(loss, trains_at, retain=True)[0]
        self._compare(unscaled, trains, trains_at)
        # a static scale above the top (no GradScaler backs it off) overflows: the top is run to tell the rest
        if largest is not None and (largest < trains_at or (largest > trains_at and self._in_doubt(trains_at))):
            best = self._backward(loss, largest, retain=False)[0]
            result.best_scale = largest
            for stats in result.params:
                g_ref = self.ref_grads.get(stats.name)
                if g_ref is not None:
                    _best_stats(stats, g_ref, trains.get(stats.name), best.get(stats.name))
        elif trains_at == largest:
            result.best_scale = largest  # the run trains at the top: its own numbers are the best there are
        return applied

    def _trains_at(self, scale: float, largest: float | None) -> float:
        """The scale the run's gradients are measured at: its own, or, where that overflows the backward and a
        GradScaler backs off, the first it reaches that does not."""
        result, scaler = self.result, self.regime.scaler
        result.scale = scale
        if scaler is None or largest is None or scale <= largest:
            return scale
        while scale > largest:
            scale *= scaler.backoff
        result.scale = scale
        return scale

    def _in_doubt(self, scale: float) -> bool:
        """Whether the run's gradient may have lost to underflow what a larger scale keeps: one points elsewhere
        than float32's or loses elements to 0, or the float32 gradients' smallest elements need a larger scale."""
        smallest = self.result.window[0]
        return (smallest is not None and smallest > scale) or any(
            (p.cosine is not None and p.cosine < NOISE_CHECK_COSINE) or p.underflow_scaled > 1 - KEEP_FRACTION
            for p in self.result.params)

    def _compare(self, unscaled: Grads, trains: Grads, scale: float) -> None:
        """result.params from the reference's gradients and the regime's, without scaling and at the run's
        scale."""
        params = []
        scratch = Scratch()
        for name, _ in self.ref_named:
            stats = _grad_stats(name, self.ref_grads.get(name), unscaled.get(name), trains.get(name), scale, self.low,
                                scratch)
            stats.weights_dtype = str(self.reg_named[name].dtype).replace("torch.", "")
            stats.lr = self.lr[name]
            params.append(stats)
        self.result.params = params

    # ---- updates -------------------------------------------------------------------------------------------

    def snapshot(self, step: int) -> None:
        """The weights before this step (after the first, a copy: the one before it is the user's model)."""
        if step > 0:
            self.before = ({n: p.detach().clone() for n, p in self.ref_named},
                           {n: p.detach().clone() for n, p in self.reg_named.items()})

    def _count_updates(self, step: int) -> None:
        """The element updates the reference made at this step, and those the regime's step left bit-identical
        (a step the scaler skipped counts none: nothing was applied)."""
        for name, p in self.ref_named:
            reg_p = self.reg_named[name].detach()
            if self.before is None:
                original = self.originals.get(name)
                if original is None:
                    continue
                ref_before, reg_before = original.detach(), original.detach().to(reg_p.dtype)
            else:
                ref_before, reg_before = self.before[0][name], self.before[1][name]
            changed = torch.ne(p.detach(), ref_before, out=self.scratch.like("changed", p))
            self.moved[name] += int(torch.count_nonzero(changed))
            kept = torch.eq(reg_p, reg_before, out=self.scratch.like("kept", reg_p)).logical_and_(changed)
            self.absorbed[name] += int(torch.count_nonzero(kept))

    # ---- after the steps -----------------------------------------------------------------------------------

    def finish(self, seed: int, lr: float | None) -> None:
        result = self.result
        result.regime_finite = math.isfinite(result.loss_regime) and all(
            g is None or all_finite(g) for g in self.unscaled.values()) and all(
            all_finite(p) for p in self.reg_named.values())
        for stats in result.params:
            stats.ref_changed, stats.absorbed = self.moved[stats.name], self.absorbed[stats.name]
            original = self.originals.get(stats.name)
            # the median |weight| is for PA456's message only, and a median sorts: taken where it can say it
            if stats.absorbed and original is not None:
                stats.absmedian = float(original.detach().abs().flatten().median())
        if not result.regime_finite:
            result.first_unscaled, result.first_step = first_events(self.setup, self.regime, result.steps, seed,
                                                                    result.scale_start, lr)
        doubtful = {p.name for p in result.params if p.cosine is not None and p.cosine < NOISE_CHECK_COSINE}
        if doubtful:
            wide = float64_gradients(self.setup, seed, doubtful)
            for stats in result.params:
                g = self.ref_grads.get(stats.name)
                if stats.name in wide and g is not None:
                    stats.ref_cosine_f64 = Agreement(wide[stats.name]).against(Agreement(g))[0]


def _grad_stats(name: str, g_ref: torch.Tensor | None, g1: torch.Tensor | None, gs: torch.Tensor | None,
                scale: float, low, scratch: Scratch) -> ParamStats:
    """A parameter's gradient in the regime against the reference's: elements lost to 0 without scaling and at the
    run's scale, subnormal there, and its direction (ParamStats' update fields are the step's to fill)."""
    elements = g_ref.numel() if g_ref is not None else gs.numel() if gs is not None else 0
    if g_ref is None:
        return ParamStats(name, elements, "", 0, 0.0, 0.0, 0.0, None, None, 0, 0, 0.0, 0.0)
    mask = torch.ne(g_ref, 0, out=scratch.like("nonzero", g_ref))
    n_nz = int(torch.count_nonzero(mask))
    nz = None if n_nz == elements else mask  # None: every element is nonzero, no mask to apply
    # a float16 gradient is 0 exactly where its float32 copy is: only the scaled one, compared as float32, is copied
    gs = gs.float() if gs is not None else None
    under1 = lost_share(nz, g1, n_nz, scratch)
    unders = under1 if gs is g1 else lost_share(nz, gs, n_nz, scratch)
    cosine = rel = None
    top = low_nz = None
    if gs is not None:
        ref = Agreement(g_ref, scratch.like("unit", g_ref, torch.float32))
        cosine, rel = ref.against(Agreement(gs, scratch.like("unit2", gs, torch.float32)))
    if n_nz:
        magnitude = torch.abs(g_ref, out=scratch.like("held", g_ref, g_ref.dtype))
        top = float(magnitude.max())
        if nz is not None:
            magnitude.masked_fill_(torch.logical_not(nz, out=scratch.like("zero", g_ref)), math.inf)
        low_nz = float(magnitude.min())
    # lost elements that matter: those above float32's own noise (read only where any are lost)
    best = lost_share(above_noise(g_ref), gs, n_nz) if unders else 0.0
    return ParamStats(name, elements, "", n_nz, under1, unders, subnormal_share(nz, gs, scale, n_nz, low, scratch),
                      cosine, rel, 0, 0, 0.0, 0.0, top or 0.0, low_nz, cosine_best=cosine, rel_error_best=rel,
                      underflow_best=best)


def _best_stats(stats: ParamStats, g_ref: torch.Tensor, trains: torch.Tensor | None,
                best: torch.Tensor | None) -> None:
    """The gradient at the largest finite scale against float32's, and the run's against it."""
    if best is None:
        return
    best = best.float()
    at_best = Agreement(best)
    stats.cosine_best, stats.rel_error_best = Agreement(g_ref).against(at_best)
    stats.underflow_best = lost_share(above_noise(g_ref), best, stats.ref_nonzero)
    if trains is not None:
        stats.underflow_cosine = at_best.against(Agreement(trains))[0]


def _loss_not_finite(spec: str, loss: float) -> InputError:
    """An input error, not a finding: float32 makes it, before any low precision, and with no finite float32 step
    there is nothing to measure the regime against (every comparison would be NaN, and the run would look clean)."""
    return InputError(spec, f"the loss is {loss} in float32, before any low precision (the float32 reference step "
                            "on the factory's batch): the audit compares the regime with a finite float32 step; fix "
                            "the model or loss_fn first")


def first_events(setup: TrainSetup, regime: Regime, steps: int, seed: int, scale: float,
                 lr: float | None) -> tuple[Event | None, Event | None]:
    """Where the regime's steps first turned inf/NaN: the forward and unscaled backward of the first step, and the
    first optimizer step that made any. The steps again from a fresh copy, every op watched, as the run stepped
    (the backward at the scale applied, a step skipped where the scaler skips it)."""
    reg = capture(setup, regime)
    named = dict(reg.named_parameters())
    opt = setup.optimizer.build(list(named.items()), lr)
    forward_rec, step_rec = Recorder(events=True), None
    for step in range(steps):
        torch.manual_seed(seed + step)
        rec = forward_rec if step == 0 else Recorder()
        with user_code(setup.spec, f"the {regime.name} step"):
            with RoundingMode(rec):
                loss = run_loss(reg.module, reg.flat, rec)
                if step == 0:
                    loss.backward(retain_graph=scale != 1.0)
            if step > 0 or scale != 1.0:
                opt.zero_grad(set_to_none=True)
                with RoundingMode(Recorder()):
                    (loss * scale).backward()
                for p in named.values():
                    if p.grad is not None:
                        p.grad.div_(scale)
            finite = all(p.grad is None or all_finite(p.grad) for p in named.values())
            if regime.scaler is not None and not finite:
                scale *= regime.scaler.backoff
            else:
                stepping = Recorder(events=True)
                stepping.phase = "optimizer step"
                with RoundingMode(stepping):
                    opt.step()
                if stepping.events and step_rec is None:
                    step_rec = stepping
            opt.zero_grad(set_to_none=True)
    if not forward_rec.events and step_rec is None:
        return None, None
    # the first inf/NaN that float32's own run of the program does not make too
    expected = reference_events(setup, seed)
    return forward_rec.first_beyond(expected), step_rec.first_beyond(expected) if step_rec is not None else None


def reference_events(setup: TrainSetup, seed: int) -> set:
    """Where the float32 program's own first step makes inf/NaN from finite inputs (a mask's -inf, T5's
    log(0) before its where): places an inf in the regime's run does not tell anything."""
    ref = capture(setup, None)
    torch.manual_seed(seed)
    rec = Recorder(events=True)
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
