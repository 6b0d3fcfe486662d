"""What `precaudit fix` decides before it touches the model: one Repair per repaired node (its rules, the node's
before → after, the tolerance it promises in float32 and how that is checked), and the findings left alone with
the reason. Every repair module (eps.py, softmax.py, guards.py, masks.py, islands.py) builds these."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..analysis.compute_dtype import DtypeResolver
from ..analysis.sites.base import Site
from ..dtypes import Format
from ..ir import Graph, Node, Value
from ..keeplist.chains import NormChains
from ..rules.loader import Rule
from .model import Editable

__all__ = ["EXACT", "Check", "Context", "Group", "Left", "Plan", "Repair", "Skipped"]

# "Exact" in float32: the same function computed in another order (LogSoftmax against Log(Softmax), the max shift),
# or the same ops where a Cast is now a no-op. Relative to the compared value's largest |x|.
EXACT = 1e-5


@dataclass
class Check:
    """How the float32 run of both models verifies one repair.

    kind: "exact" (the compared value agrees within EXACT wherever the original is finite), "ratio" (a norm's
    denominator changed: each row of the compared value is scaled by g_old/g_new, so its relative change is at most
    max |g_old/g_new - 1| over the rows; g_old and g_new are functions of the statistic `stat` the original computes),
    "guard" (exact wherever `stat` >= threshold: only what the clamp clamps changes), or "none".
    offset: subtracted from the original before taking its largest |x| (a fused norm's bias: the bound holds for
    the normalized part, y - beta).
    """

    kind: str
    value: str | None = None  # compared in both models (same name in both)
    stat: str | None = None  # in the original: the statistic (ratio) or the guarded value (guard)
    old: Callable[[np.ndarray | None], np.ndarray] | None = None
    new: Callable[[np.ndarray | None], np.ndarray] | None = None
    threshold: float | None = None
    offset: Callable[[np.ndarray], np.ndarray] | None = None


@dataclass
class Repair:
    kind: str  # eps-raise, stash-type, eps-inside-root, eps-add, log-softmax, log-sigmoid, max-shift,
    #            logsumexp-shift, norm-float32, guard, guard-raise, mask-fill
    node: Node  # the node the findings point at
    rules: list[str]  # the rule ids this repair answers at that node
    before: str
    after: str
    tolerance: str  # in words, as the report prints it
    check: Check
    apply: Callable[[], None] = field(repr=False, default=lambda: None)
    notes: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)  # nodes added or changed (names in the fixed model)
    # values the repair makes or changes in the fixed model (new initializers, outputs of new or changed nodes):
    # what the float32 check copies into the original to see the repair on the original's own values
    changed: list[str] = field(default_factory=list)
    moved_to: str | None = None  # the node the norm's findings point at in the fixed model, when the repair moved it
    # filled once the fixed model is written and checked
    difference: float | None = None  # largest relative difference at the compared value, float32
    bound: float | None = None  # the tolerance that applied, as a number
    clamped: int = 0  # guard: elements the clamp changed (below its threshold)
    made_finite: int = 0  # elements inf/NaN in the original and finite in the fixed model
    within: bool | None = None
    still_flagged: list[str] = field(default_factory=list)  # rule ids the re-audit still finds at the node
    # the gate: what this repair alone changes in the model's float32 outputs, on the checked inputs
    output_change: float | None = None  # largest |changed - original| over the output's largest |value|
    output_name: str | None = None  # the graph output where that is
    output_made_finite: int = 0  # output elements inf/NaN in the original, finite with the repair
    output_newly_bad: int = 0  # output elements finite in the original, inf/NaN with the repair
    output_whole: bool = False  # measured in the whole fixed model (its nodes could not be copied out alone)
    withheld: str | None = None  # why this repair is not in the written model
    keep_instead: list[str] = field(default_factory=list)  # the nodes to keep in float32 instead: no float32 change

    @property
    def rule_text(self) -> str:
        return ", ".join(self.rules)


@dataclass
class Skipped:
    """A finding fix leaves as it is, and why (with what to do instead)."""

    rule_id: str
    rule_name: str
    node: Node
    reason: str
    keep_fp32: list[str] = field(default_factory=list)  # the nodes to keep in float32 instead, when that is the fix


@dataclass
class Left:
    """A repair module's answer where the right change is not to the model: why, and the nodes to keep in float32."""

    reason: str
    keep_fp32: list[str] = field(default_factory=list)


@dataclass
class Plan:
    repairs: list[Repair] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Group:
    """The findings at one node: each rule that fired with the site it fired on."""

    node: Node
    pairs: list[tuple[Rule, Site]]

    @property
    def ids(self) -> set[str]:
        return {rule.id for rule, _ in self.pairs}

    def site(self, *kinds: str) -> Site | None:
        return next((s for _, s in self.pairs if s.kind in kinds), None)

    def rule(self, rule_id: str) -> Rule | None:
        return next((r for r, _ in self.pairs if r.id == rule_id), None)


@dataclass
class Context:
    graph: Graph
    resolver: DtypeResolver
    edit: Editable
    target: Format
    chains: NormChains
    min_eps: float | None = None
    data_floor: str = "keep"  # a clamp on data whose floor is 0.0 there: keep (float32) | subnormal | normal | V

    def dtype_of(self, value: Value | None) -> str | None:
        return value.dtype if value is not None else None
