"""What a training factory returns, checked: the model, its batch, how its output becomes a loss, the optimizer.

`precaudit train model.py:make` calls make() (the user's code, under the same net as every PyTorch input: its
exceptions and exits are one InputError). It returns

    (model, inputs)                          the model's output is the loss: a scalar, or an object with .loss
    (model, inputs, loss_fn)                 loss_fn(output) is the loss (close over your targets)
    (model, inputs, loss_fn, optimizer)      or (model, inputs, optimizer), or a dict with those four keys

inputs is a tensor, a tuple of positional inputs, or a dict of keyword inputs (input_ids=..., labels=...). The
optimizer's class and param_groups (lr, eps, betas, weight_decay, momentum) are read as configured; the audit
builds its own copies for each run, so the user's objects are never stepped.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from ..errors import InputError
from ..files import check_regular
from ..frontends.user_code import safe_str, user_code

__all__ = ["MODELLED_OPTIMIZERS", "LossModule", "OptimizerSpec", "TrainSetup", "load_setup", "setup_of"]

# The optimizers whose step the audit reproduces (their update rule and where eps enters are known to it).
MODELLED_OPTIMIZERS = ("SGD", "Adam", "AdamW")
_HYPER = ("lr", "eps", "betas", "weight_decay", "momentum", "dampening", "nesterov", "amsgrad", "maximize")


@dataclass
class OptimizerSpec:
    """An optimizer as configured: its class name and, per parameter name, its group's hyperparameters."""

    kind: str
    groups: list[dict[str, Any]]  # each: the hyperparameters, and "params": the parameter names in it
    given: bool  # False: none was given, torch's defaults of AdamW are modelled

    def hyper(self, name: str) -> dict[str, Any]:
        for group in self.groups:
            if name in group["params"]:
                return {k: v for k, v in group.items() if k != "params"}
        return {k: v for k, v in self.groups[0].items() if k != "params"}

    def build(self, named: list[tuple[str, nn.Parameter]], lr: float | None = None) -> torch.optim.Optimizer:
        """A fresh optimizer of the same class over these parameters (by name), stepping one op at a time."""
        cls = getattr(torch.optim, self.kind)
        groups = []
        for group in self.groups:
            members = [p for n, p in named if n in group["params"]]
            if members:
                hyper = {k: v for k, v in group.items() if k != "params"}
                if lr is not None:
                    hyper["lr"] = lr
                groups.append({"params": members, **hyper})
        # foreach/fused off: every update op runs (and is rounded) one tensor at a time, as written in torch
        return cls(groups, foreach=False)

    @property
    def label(self) -> str:
        first = self.groups[0]
        parts = [f"lr {first['lr']:g}"]
        if "eps" in first:
            parts.append(f"eps {first['eps']:g}")
        if first.get("weight_decay"):
            parts.append(f"weight_decay {first['weight_decay']:g}")
        more = f", {len(self.groups)} parameter groups" if len(self.groups) > 1 else ""
        return f"{self.kind} ({', '.join(parts)}{more}{'' if self.given else '; none given: torch defaults'})"


class LossModule(nn.Module):
    """model + loss_fn as one module whose forward takes the batch's tensors flat and returns the scalar loss:
    what torch.export captures and every run differentiates."""

    def __init__(self, model: nn.Module, loss_fn: Callable | None, tree: Any, spec: str):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn
        self._tree = tree  # the pytree of (args, kwargs) the flat inputs rebuild
        self._spec = spec

    def forward(self, *flat):
        args, kwargs = pytree.tree_unflatten(list(flat), self._tree)
        out = self.model(*args, **kwargs)
        return loss_of(out, self.loss_fn, self._spec)


def loss_of(out: Any, loss_fn: Callable | None, spec: str) -> torch.Tensor:
    """The scalar loss the output (or loss_fn of it) is; anything else is the user's error, said once."""
    if loss_fn is not None:
        out = loss_fn(out)
    loss = out
    if not isinstance(loss, torch.Tensor):
        loss = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        got = f"a {tuple(loss.shape)} {str(loss.dtype).replace('torch.', '')} tensor" \
            if isinstance(loss, torch.Tensor) else type(out).__name__
        where = "loss_fn(output)" if loss_fn is not None else "the model's output"
        raise InputError(spec, f"{where} is {safe_str(got)[:120]}, not a scalar float loss: return (model, inputs, "
                               "loss_fn) from the factory, or give labels so the output has .loss")
    return loss.reshape(())


@dataclass
class TrainSetup:
    spec: str
    model: nn.Module
    flat: list[Any]  # the batch's leaves (tensors and any other values), as LossModule takes them
    tree: Any  # their pytree of (args, kwargs)
    loss_fn: Callable | None
    optimizer: OptimizerSpec
    names: dict[str, str] = field(default_factory=dict)  # LossModule's parameter name -> the model's own

    def loss_module(self, model: nn.Module | None = None) -> LossModule:
        return LossModule(self.model if model is None else model, self.loss_fn, self.tree, self.spec)


def load_setup(spec: str) -> TrainSetup:
    """Import model.py (or package.module), call the factory, and check what it returned."""
    from ..frontends.torch_graph import _import_model, _isolated_imports
    from ..frontends.torch_objects import check_importable

    check_importable(spec)  # a file named `model.py:make` is a file, never code
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr.isidentifier():
        raise InputError(spec, "name the training factory as model.py:make or package.module:make")
    folder = check_regular(target).resolve().parent if target.endswith(".py") else None
    with _isolated_imports(folder):
        with user_code(target, "importing it"):
            module = _import_model(target, folder) if folder else importlib.import_module(target)
            factory = getattr(module, attr, None)
        if not callable(factory):
            raise InputError(spec, f"'{attr}' is not a function or class in {target}")
        with user_code(spec, f"calling {attr}()"):
            made = factory()
        return setup_of(spec, made)


def setup_of(spec: str, made: Any) -> TrainSetup:
    """The factory's return value (or the API's arguments as one tuple), checked and taken apart."""
    model, inputs, loss_fn, optimizer = _parts(spec, made)
    if not isinstance(model, nn.Module):
        raise InputError(spec, f"the training factory must return (model, inputs, ...), with an nn.Module first, "
                               f"not {type(model).__name__}")
    args, kwargs = (tuple(inputs), {}) if isinstance(inputs, (tuple, list)) else \
        ((), dict(inputs)) if isinstance(inputs, dict) else ((inputs,), {})
    flat, tree = pytree.tree_flatten((args, kwargs))
    for leaf in flat:
        if isinstance(leaf, torch.Tensor) and leaf.device.type != "cpu":
            raise InputError(spec, f"an input is on {leaf.device}: precaudit train runs on the CPU (it emulates "
                                   "the GPU's dtypes there); build the batch on the CPU")
    with user_code(spec, "reading the model's parameters"):
        named = list(model.named_parameters())
    for name, p in named:
        if p.device.type != "cpu":
            raise InputError(spec, f"parameter '{name}' is on {p.device}: precaudit train runs on the CPU (it "
                                   "emulates the GPU's dtypes there); build the model on the CPU")
        if p.is_floating_point() and p.dtype != torch.float32:
            raise InputError(spec, f"parameter '{name}' is {str(p.dtype).replace('torch.', '')}: give the model in "
                                   "float32; --regime says what it is trained in (bf16 is model.to(bfloat16))")
    if not any(p.requires_grad for _, p in named):
        raise InputError(spec, "the model has no parameter that requires a gradient: nothing to train")
    setup = TrainSetup(spec, model, flat, tree, loss_fn, _optimizer_spec(spec, optimizer, named))
    setup.names = {f"model.{n}": n for n, _ in named}
    return setup


def _parts(spec: str, made: Any) -> tuple[Any, Any, Callable | None, Any]:
    if isinstance(made, dict):
        unknown = set(made) - {"model", "inputs", "loss_fn", "optimizer"}
        if unknown or "model" not in made or "inputs" not in made:
            raise InputError(spec, "a dict from the training factory needs 'model' and 'inputs' (and may have "
                                   f"'loss_fn', 'optimizer'){'; unknown: ' + ', '.join(sorted(map(str, unknown)))[:200] if unknown else ''}")
        return made["model"], made["inputs"], made.get("loss_fn"), made.get("optimizer")
    if not isinstance(made, tuple) or not 2 <= len(made) <= 4:
        raise InputError(spec, "the training factory must return (model, inputs), (model, inputs, loss_fn) or "
                               "(model, inputs, loss_fn, optimizer), not "
                               f"{type(made).__name__}{f' of {len(made)}' if isinstance(made, tuple) else ''}")
    model, inputs, *rest = made
    loss_fn = optimizer = None
    for item in rest:
        if isinstance(item, torch.optim.Optimizer):
            optimizer = item
        elif callable(item) and loss_fn is None:
            loss_fn = item
        elif item is not None:
            raise InputError(spec, f"after (model, inputs) the factory may return a loss_fn and an optimizer, not "
                                   f"{type(item).__name__}")
    return model, inputs, loss_fn, optimizer


def _optimizer_spec(spec: str, optimizer: Any, named: list[tuple[str, nn.Parameter]]) -> OptimizerSpec:
    names = [n for n, p in named if p.requires_grad]
    if optimizer is None:
        defaults = torch.optim.AdamW([torch.zeros(1, requires_grad=True)]).defaults
        return OptimizerSpec("AdamW", [{"params": set(names), **_hyper(defaults)}], given=False)
    kind = type(optimizer).__name__
    if kind not in MODELLED_OPTIMIZERS or type(optimizer).__module__.split(".")[0] != "torch":
        raise InputError(spec, f"the optimizer {safe_str(kind)[:80]} is not one the audit models; it models "
                               f"torch.optim's {', '.join(MODELLED_OPTIMIZERS)}")
    by_id = {id(p): n for n, p in named}
    groups = []
    for group in optimizer.param_groups:
        members = {by_id[id(p)] for p in group["params"] if id(p) in by_id}
        groups.append({"params": members, **_hyper(group)})
    if not any(g["params"] for g in groups):
        raise InputError(spec, "the optimizer holds none of the model's parameters")
    return OptimizerSpec(kind, groups, given=True)


def _hyper(group: dict) -> dict[str, Any]:
    out = {}
    for key in _HYPER:
        if key in group:
            value = group[key]
            out[key] = float(value) if isinstance(value, torch.Tensor) else value
    return out
