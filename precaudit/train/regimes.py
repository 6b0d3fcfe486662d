"""The training regimes people run, each as PyTorch runs it: where the forward computes, where the backward does,
what holds the weights and the optimizer's states, and whether a loss scaler multiplies the loss.

A regime is data: a new one (an fp8 recipe) is a new entry of REGIMES, not new code in the step.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["REGIMES", "Regime", "Scaler", "regime_named"]


@dataclass(frozen=True)
class Scaler:
    """torch.amp.GradScaler's defaults: the scale it starts at, and how it grows and backs off."""

    init: float = 2.0 ** 16
    growth: float = 2.0  # multiplied in after growth_interval steps without an inf/NaN gradient
    backoff: float = 0.5  # multiplied in at every step it skips for an inf/NaN gradient
    growth_interval: int = 2000


@dataclass(frozen=True)
class Regime:
    name: str
    low: str  # the low-precision format the regime computes in: 'fp16' or 'bf16'
    autocast: bool  # True: torch.autocast over float32 weights (the CUDA op policy); False: model.to(low)
    weights: str  # the format the weights and the optimizer's states are held in
    scaler: Scaler | None  # GradScaler's model, or None for no loss scaling
    summary: str  # one line for --help and the report

    @property
    def forward(self) -> str:
        return f"torch.autocast({self.low})" if self.autocast else f"model.to({self.low})"


REGIMES: dict[str, Regime] = {r.name: r for r in (
    Regime("amp-fp16", "fp16", True, "fp32", Scaler(),
           "torch.autocast float16, GradScaler (2^16, x2 per 2000 clean steps, x0.5 per skipped step), float32 "
           "master weights and optimizer states"),
    Regime("amp-bf16", "bf16", True, "fp32", None,
           "torch.autocast bfloat16, no loss scaling, float32 weights and optimizer states"),
    Regime("bf16", "bf16", False, "bf16", None,
           "model.to(bfloat16): bfloat16 forward, backward, weights and optimizer states (no master copy)"),
    Regime("fp16", "fp16", False, "fp16", None,
           "model.half(): float16 forward, backward, weights and optimizer states, no loss scaling"),
)}


def regime_named(name: str) -> Regime:
    try:
        return REGIMES[name]
    except KeyError:
        raise KeyError(f"unknown regime {name!r}; choose from {', '.join(REGIMES)}") from None
