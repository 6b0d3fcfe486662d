"""The loss as one captured ATen program per run: float32 (the reference), or as the regime computes it.

amp regimes: the float32 program with autocast's casts written in (frontends/autocast.py reads the CUDA policy
from torch's own kernels), so forward and backward take autocast's dtypes on a CPU without autocast; the casts
are aten._to_copy, whose backward casts the gradient back as autocast's do. Pure regimes: model.to(low) with its
float inputs, captured as it runs. The model is copied first: the user's module is never converted or stepped.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..frontends.torch_graph import _CAPTURE_IN as LOW  # the low dtypes, by format name
from ..frontends.user_code import user_code
from .factory import TrainSetup
from .regimes import Regime

__all__ = ["LOW", "Captured", "capture", "capture_pair"]


_FAILED = ("torch.export could not capture the loss ({}); data-dependent control flow in forward() or the loss_fn "
           "is the usual cause")


@dataclass
class Captured:
    module: Any  # the GraphModule: call it with the flat batch; its parameters are a copy of the model's
    flat: list[Any]  # the batch as this run feeds it (float inputs in the low dtype for a pure regime)
    regime: Regime | None  # None: the float32 reference
    names: dict[str, str]  # the program's parameter name -> the model's own

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(self.names.get(n, n), p) for n, p in self.module.named_parameters() if p.requires_grad]


def capture(setup: TrainSetup, regime: Regime | None, hooks: Any = None, wide: bool = False) -> Captured:
    """The loss of a fresh copy of the model, captured in train mode for the reference or the regime (or, wide,
    the reference in float64: what tells float32's own rounding noise from a gradient)."""
    return _module_of(setup, regime, *_export(setup, regime, hooks, wide))


def capture_pair(setup: TrainSetup, regime: Regime, hooks: Any = None) -> tuple[Captured, Captured]:
    """The float32 reference and the regime. Under autocast the regime is the reference's program with the casts
    written in: one export, copied before either is run, serves both."""
    if not regime.autocast:
        return capture(setup, None, hooks), capture(setup, regime, hooks)
    program, flat = _export(setup, None, hooks, False)
    twin = copy.deepcopy(program)
    _cast(setup, regime, twin)
    return _module_of(setup, None, program, flat), _module_of(setup, regime, twin, list(flat))


def _converted_to(regime: Regime | None, wide: bool) -> torch.dtype | None:
    """The dtype the model and its float inputs are converted to before capture: float64 (wide), the low dtype of
    a pure regime, or None (float32 as given: the reference, and autocast, which casts inside the program)."""
    if wide:
        return torch.float64
    if regime is not None and not regime.autocast:
        return LOW[regime.low]
    return None


def _flat(setup: TrainSetup, regime: Regime | None, wide: bool) -> list[Any]:
    low = _converted_to(regime, wide)
    if low is None:
        return list(setup.flat)
    return [a.to(low) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in setup.flat]


def _cast(setup: TrainSetup, regime: Regime, program) -> None:
    from ..frontends.autocast import plan_autocast
    from ..frontends.autocast_export import cast_explicitly

    plan = plan_autocast(program, "cuda", regime.low, setup.spec)
    cast_explicitly(program, plan)


def _export(setup: TrainSetup, regime: Regime | None, hooks: Any, wide: bool) -> tuple[Any, list[Any]]:
    """The exported program, and the batch as it was fed (its float inputs converted as the model was)."""
    with user_code(setup.spec, "copying the model (copy.deepcopy)"):
        model = copy.deepcopy(setup.model)
    flat = _flat(setup, regime, wide)
    low = _converted_to(regime, wide)
    if low is not None:
        with user_code(setup.spec, f"converting the model with model.to({low})"):
            model = model.to(low)
    if hooks is not None:
        hooks(model)
    loss_module = setup.loss_module(model).train()
    with user_code(setup.spec, "running forward() under torch.export", _FAILED), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(loss_module, tuple(flat), strict=False)
    if regime is not None and regime.autocast:
        _cast(setup, regime, program)
    return program, flat


def _module_of(setup: TrainSetup, regime: Regime | None, program, flat: list[Any]) -> Captured:
    # torch writes Python source for the program: a parameter name it cannot quote (a module named with a quote
    # character) fails there, the model's doing, not precaudit's
    with user_code(setup.spec, "building the captured program (torch.export's ExportedProgram.module())"):
        module = program.module()
    _trainable_casts(module)
    names = {n: setup.names.get(n, n.removeprefix("model.")) for n, _ in module.named_parameters()}
    return Captured(module, flat, regime, names)


def _trainable_casts(module) -> None:
    """autocast's casts, written as prims.convert_element_type (no autograd formula), become aten._to_copy."""
    graph = module.graph
    for node in graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.prims.convert_element_type.default:
            node.target = torch.ops.aten._to_copy.default
            node.kwargs = {"dtype": node.args[1]}
            node.args = (node.args[0],)
    module.recompile()
