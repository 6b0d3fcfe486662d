"""A traced training step's gradients, kept for the HTML report's chart: per parameter, the float32 reference's
|gradient| at the loss scale the regime's backward ran at, against the low dtype's limits and the loss-scale window.
Plain data (the report imports it without torch)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..trace.profile import ValuePoint

__all__ = ["GradientProfile"]


@dataclass
class GradientProfile:
    regime: str
    low: str  # the format name the regime's gradients are held in
    scale: float  # the loss scale the backward ran at (1 without a scaler)
    scaler_init: float | None  # GradScaler's start, where the regime has one
    window: tuple[float | None, float | None]  # the smallest scale that keeps the gradients, the largest finite one
    backward_max: float  # the backward's largest |value| in the low dtype, unscaled
    inputs_from: str
    # one per parameter, in the model's order: its reference gradient times the scale (absmax, smallest nonzero),
    # the elements lost to 0 (underflow) and subnormal at that scale
    points: list[ValuePoint] = field(default_factory=list)

    @staticmethod
    def of(result, inputs_from: str) -> GradientProfile:
        """From a StepResult (train/step.py)."""
        s = result.scale
        points = []
        for i, p in enumerate(result.params):
            scope, _, _ = p.name.rpartition(".")
            points.append(ValuePoint(
                order=i, node=p.name, op="gradient", scope=scope or None, value=p.name, dtype=result.regime.low,
                elements=p.elements, absmax=p.grad_absmax * s,
                min_nonzero=None if p.grad_min_nonzero is None else p.grad_min_nonzero * s, overflow=0,
                underflow=round(p.underflow_scaled * p.ref_nonzero), subnormal=round(p.subnormal_scaled * p.ref_nonzero),
                nonfinite=0, ref_nonfinite=0))
        init = result.regime.scaler.init if result.regime.scaler else None
        return GradientProfile(result.regime.name, result.regime.low, s, init, result.window, result.backward_low_max,
                               inputs_from, points)
