"""The backward through a collapsed (constant) row at every norm module: row 0 of each norm's input zeroed, the
regime's step run on it, and the first backward op that turns inf/NaN named (PA457)."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import torch
from torch import nn

from ..errors import InputError
from ..frontends.user_code import user_code
from .capture import capture
from .emulate import Event, Recorder, RoundingMode, all_finite, run_loss
from .factory import TrainSetup
from .regimes import Regime

__all__ = ["collapsed_row"]

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
    """The regime's backward first, watching nothing: most models' is finite, and then neither the float32 run
    (which only says whether float32 fails too) nor the op-by-op watch that names the first inf/NaN is needed."""
    counted: list[int] = []
    reg = capture(setup, regime, hooks=lambda m: counted.append(_collapse_first_row(m)))
    if not counted or not counted[0]:
        return None
    if _finite_backward(setup, regime, reg, seed, None):
        return None, True, counted[0], reg.module
    # a fresh copy: the first run's gradients are on this one's parameters
    reg = capture(setup, regime, hooks=_collapse_first_row)
    rec = Recorder(events=True)
    _finite_backward(setup, regime, reg, seed, rec)
    # the backward's first inf/NaN, whether float32's is finite or not (the finding says which): the forward's
    # (T5's log(0) before its where) are the program's own, not the collapsed row's
    event = next((e for e in rec.events if e.phase == "backward"), None)
    ref = capture(setup, None, hooks=_collapse_first_row)
    torch.manual_seed(seed)
    with user_code(setup.spec, "the float32 step on a collapsed row"):
        loss = run_loss(ref.module, ref.flat, Recorder())
        loss.backward()
    ref_finite = math.isfinite(float(loss.detach())) and all(
        p.grad is None or all_finite(p.grad) for _, p in ref.named_parameters())
    return event, ref_finite, counted[0], reg.module


def _finite_backward(setup: TrainSetup, regime: Regime, reg, seed: int, rec: Recorder | None) -> bool:
    """Whether the regime's gradients on the collapsed row are all finite (rec, given, watches every op)."""
    torch.manual_seed(seed)
    rec = rec or Recorder()
    with user_code(setup.spec, f"the {regime.name} step on a collapsed row"), RoundingMode(rec):
        loss = run_loss(reg.module, reg.flat, rec)
        loss.backward()
    return all(p.grad is None or all_finite(p.grad) for _, p in reg.named_parameters())
