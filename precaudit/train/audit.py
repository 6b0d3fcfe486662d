"""One training audit: the forward graph's static findings in the regime, the training rules' static sites, and
(traced) one step in float32 and in the regime — findings through the same rules, reports and exit codes as check.
"""

from __future__ import annotations

import copy
import math
import numbers
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from .regimes import REGIMES

if TYPE_CHECKING:
    pass

__all__ = ["MAX_STEPS", "TrainOptions", "audit_training", "checked"]

# The audit is about the first steps of a run (the loss scale, the first inf/NaN, updates that do not land), and
# each step is several forward and backward passes, the regime's emulated op by op (GPT-2 small: some 25 s); more
# steps than this is a training run, or a typo, and would run for days.
MAX_STEPS = 1000
# torch.manual_seed takes 64 bits and the step seeds with seed + step: below 2**63, every seed + step fits.
SEED_LIMIT = 2 ** 63


@dataclass
class TrainOptions:
    """What `precaudit train` and precaudit.train_audit() take; validate() checks it before anything runs."""

    regime: str = "amp-fp16"
    trace: bool = False
    steps: int = 1
    seed: int = 0
    loss_scale: float | None = None  # --loss-scale: GradScaler's start (amp-fp16) or a static scale (fp16)
    lr: float | None = None  # --lr: every parameter group's learning rate, instead of the optimizer's
    collapsed_row: bool = True  # traced: also step a batch whose norm inputs have a zero row
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    fail_on: str = "error"
    baseline: str | None = None
    preview: bool = False
    timeout: float = 1800.0  # --timeout: seconds the factory's import, call and step may take; 0: no limit

    def validate(self) -> None:
        """One InputError for the first option that cannot work, named as the command line spells it (--lr for the
        API's lr); numbers from the API (numpy's too) become plain int and float."""
        if not isinstance(self.regime, str) or self.regime not in REGIMES:
            raise InputError(None, f"--regime: unknown regime {_shown(self.regime)}; choose from {', '.join(REGIMES)}")
        self.steps = _whole("--steps", self.steps, 1, MAX_STEPS)
        self.seed = _whole("--seed", self.seed, 0, SEED_LIMIT - 1, "2**63 - 1")
        if self.lr is not None:
            self.lr = _positive("--lr", self.lr)
        if self.loss_scale is not None:
            self.loss_scale = _positive("--loss-scale", self.loss_scale)
        if not (_real(self.timeout) and math.isfinite(self.timeout) and self.timeout >= 0):
            raise InputError(None, f"--timeout must be a finite number of seconds, 0 or more (0: no limit), not "
                                   f"{_shown(self.timeout)}")
        self.timeout = float(self.timeout)


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _shown(value: Any) -> str:
    """The value as the message quotes it: a number as written, a string quoted, anything else by its type."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return repr(float(value))
    return repr(value[:40]) if isinstance(value, str) else f"a {type(value).__name__}"


def _whole(option: str, value: Any, low: int, high: int, high_shown: str | None = None) -> int:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and low <= int(value) <= high:
        return int(value)
    raise InputError(None, f"{option} must be a whole number from {low} to {high_shown or high}, not {_shown(value)}")


def _positive(option: str, value: Any) -> float:
    if _real(value) and math.isfinite(value) and value > 0:
        return float(value)
    raise InputError(None, f"{option} must be a finite number above 0, not {_shown(value)}")


_TRACED_SITES = {"train_grad", "train_update", "train_loss_scale", "train_first_nonfinite", "train_collapsed_row"}
_STATIC_SITES = {"train_optimizer", "train_update_bound", "train_norm_backward", "train_guard_backward"}


def checked(rules, options: TrainOptions, regime, gradients) -> dict[str, Any]:
    """What the audit looked at, for a report (a clean one above all) to say: the rules run on the forward graph,
    on the optimizer and the backward's bounds, and on the traced step, with the regime, steps, seed, loss scale and
    parameters that step had."""
    # the loss-scale window is float16's; the collapsed row is skipped without options.collapsed_row
    absent = ({"train_loss_scale"} if regime.low != "fp16" else set()) | (
        set() if options.collapsed_row else {"train_collapsed_row"})

    def ids(kinds: set[str]) -> list[str]:
        return [r.id for r in rules if set(r.sites) & kinds and not set(r.sites) <= absent]
    static, traced = ids(_STATIC_SITES), ids(_TRACED_SITES)
    forward = sum(1 for r in rules if not set(r.sites) & (_STATIC_SITES | _TRACED_SITES))
    out: dict[str, Any] = {"regime": regime.name, "forward_rules": forward, "static_rules": static,
                           "traced_rules": traced if options.trace else [], "traced": options.trace,
                           "steps": options.steps if options.trace else 0, "seed": options.seed,
                           "parameters": None, "loss_scale": None, "inputs": None}
    text = f"the forward graph as {regime.name} runs it ({forward} rules), the optimizer and the backward's " \
           f"bounds ({', '.join(static) or 'no rule selected'})"
    if options.trace and gradients is not None:
        out |= {"parameters": len(gradients.points), "loss_scale": gradients.scale, "inputs": gradients.inputs_from}
        text += f"; {options.steps} {regime.name} step{'s' * (options.steps != 1)} traced against float32 on " \
                f"{gradients.inputs_from} (seed {options.seed}, loss scale {gradients.scale:g}, " \
                f"{len(gradients.points)} parameters: {', '.join(traced) or 'no rule selected'})"
    elif not options.trace:
        text += f"; no step traced (--trace runs one: {', '.join(ids(_TRACED_SITES)) or 'no rule selected'})"
    out["text"] = text
    return out


def audit_training(spec: str, regime, options: TrainOptions, rules, made: Any):
    """The findings, and (traced) the step's gradient profile for the HTML report."""
    import dataclasses

    from ..rules.engine import apply_rules
    from ..suppress import drop_suppressed
    from .factory import load_setup, setup_of
    from .sites import static_sites, traced_sites

    setup = setup_of(spec, made) if made is not None else load_setup(spec)
    forward = _forward_sites(setup, regime, {r.id: r.pattern for r in rules if r.pattern is not None})
    findings = apply_rules(rules, forward, spec)
    findings += apply_rules(rules, static_sites(setup, regime, forward, options.lr), spec)
    gradients = None
    if options.trace:
        from .collapsed import collapsed_row
        from .step import run_steps

        result = run_steps(setup, regime, options.steps, options.seed, options.loss_scale, options.lr)
        collapsed = collapsed_row(setup, regime, options.seed) if options.collapsed_row else None
        measured = apply_rules(rules, traced_sites(result, collapsed, _BATCH), spec)
        # traced numbers hold for the batch they were measured on: the factory's own (the user's data)
        findings += [dataclasses.replace(f, inputs="user") for f in measured]
        from .profile import GradientProfile

        gradients = GradientProfile.of(result, _BATCH)
    return drop_suppressed(findings), gradients


_BATCH = "the factory's batch"


def _forward_sites(setup, regime, patterns: dict) -> list:
    """The forward graph's sites as the regime computes it: autocast(cuda) over float32, or model.to(low)."""
    from ..analysis.collect import collect_sites
    from ..deployment import Deployment
    from ..dtypes import FORMATS
    from ..frontends.torch_graph import capture, capture_under_autocast
    from ..frontends.user_code import user_code

    with user_code(setup.spec, "copying the model (copy.deepcopy)"):
        module = setup.loss_module(copy.deepcopy(setup.model))
    args = tuple(setup.flat)
    if regime.autocast:
        graph = capture_under_autocast(module, args, setup.spec, "cuda", regime.low)
    else:
        graph = capture(module, args, setup.spec, regime.low)
    for node in graph.nodes:  # the loss module's own prefix: scopes as the user's model names them
        if node.scope and node.scope.startswith("model."):
            node.scope = node.scope.removeprefix("model.")
    return collect_sites(graph, Deployment(FORMATS[regime.low]).resolver(graph), patterns)
