"""`precaudit fix`, start to end: audit, plan, edit, write next to the target under a temporary name, check
(onnx.checker with shape inference, the re-audit, float32 against the original, the emulated run with --trace),
and only then rename into place."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from ..analysis.compute_dtype import DtypeResolver
from ..deployment import Deployment
from ..dims import size_dims
from ..dtypes import Format
from ..errors import InputError
from ..files import check_output, replace_with
from ..finding import Finding
from ..frontends.onnx import load_onnx
from ..ir import Graph
from ..keeplist.chains import NormChains
from ..options import TraceOptions
from ..rules.loader import Rule
from .check import Comparison, Emulated, compare, emulated
from .model import Editable, relocate_external
from .plan import Context, Plan, Repair
from .planner import audit_pairs, plan_repairs

if TYPE_CHECKING:
    from ..analysis.sites.base import Site
    from ..trace.inputs import InputSource

__all__ = ["FixResult", "run_fix"]


@dataclass
class FixResult:
    """What `precaudit fix` (and precaudit.fix()) did: the repairs planned, the findings before and after, the float32
    check, and whether the fixed model was written (written, output); exit_code is what the command line exits with."""

    model: str
    output: str | None
    target: Format
    dry_run: bool
    plan: Plan
    before: list[Finding]
    after: list[Finding] | None = None
    new: list[Finding] = field(default_factory=list)  # in the fixed model and not in the original
    comparison: Comparison | None = None
    inputs: str = ""
    source: InputSource | None = None  # where the checks' inputs came from
    trace: tuple[Emulated, Emulated] | None = None
    external: list[str] = field(default_factory=list)  # data files the fixed model reads in place
    written: bool = False
    problems: list[str] = field(default_factory=list)  # why the fixed model was not written
    compare_problem: str | None = None  # why the float32 comparison could not run
    withheld: list[Repair] = field(default_factory=list)  # measured, and left out of the written model
    # the findings of before that the traced audit makes (--trace): no repair is planned for them; each is left as
    # it is, and said so
    measured: list[Finding] = field(default_factory=list)
    tolerance: float = 1e-3

    def __repr__(self) -> str:  # (the dataclass's would print the whole plan and every finding)
        from ..escape import printable

        state = "dry run" if self.dry_run else "written" if self.written else "not written"
        return (f"<precaudit.FixResult {printable(self.model)[:80]} → {printable(self.output or '-')[:80]}: "
                f"{len(self.plan.repairs)} repairs, {state}, {self.fixed_count} of {len(self.before)} findings fixed, "
                f"exit code {self.exit_code}>")

    def to_text(self) -> str:
        from .render import render_text
        return render_text(self)

    def to_json(self) -> str:
        from .render import render_json
        return render_json(self)

    @property
    def fixed_count(self) -> int:
        if self.after is None:
            return 0
        left = {(f.rule_id, f.node_name) for f in self.after}
        return sum(1 for f in self.before if (f.rule_id, f.node_name) not in left)

    @property
    def verified(self) -> bool:
        """The float32 gate ran on the user's inputs (not synthesized ones) and every written repair passed it."""
        return (self.comparison is not None and self.source is not None and not self.source.synthesized
                and not self.withheld and not self.problems)

    @property
    def errors_left(self) -> list[Finding]:
        """The error findings the run leaves: in the fixed model where one was written, else in the model as it
        was (none after a dry run: it was asked for a plan only)."""
        if self.dry_run:
            return []
        left = self.after if self.written and self.after is not None else self.before
        return [f for f in left if f.severity == "error"]

    @property
    def exit_code(self) -> int:
        """0 written and checked on the user's inputs (or nothing to write and no error left); 1 a repair withheld,
        a check failed, or error findings remain, in the fixed model or, where none was written, in the model (as
        `ruff --fix` exits 1 when violations remain); 3 written, but its float32 check ran on synthesized inputs
        only, or could not run."""
        if self.problems or self.withheld or self.errors_left:
            return 1
        if self.written and not self.verified:
            return 3
        return 0

    def reason(self) -> str | None:
        """Why the exit code is 1, in one line (for stderr); None otherwise."""
        if self.exit_code != 1:
            return None
        if self.problems:
            more = f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
            return f"the fixed model was not written: {self.problems[0]}{more}"
        if self.withheld:
            first = self.withheld[0]
            rest = len(self.plan.repairs)
            what = f"the {rest} other repair{'s' * (rest != 1)} written" if self.written else "no model written"
            return (f"{len(self.withheld)} repair{'s' * (len(self.withheld) != 1)} withheld ({first.kind} at "
                    f"'{first.node.name}': {first.withheld}); {what}")
        left = self.errors_left
        shown = ", ".join(f"{f.rule_id} at '{f.node_name}'" for f in left[:3]) + (" ..." if len(left) > 3 else "")
        count = f"{len(left)} error finding{'s' * (len(left) != 1)} remain{'s' * (len(left) == 1)} ({shown})"
        if self.written:
            return f"the fixed model was written and {count} in it, which fix does not repair"
        return f"nothing repaired and {count}: no model written"


@dataclass
class FixOptions:
    """How fix repairs and how it gates: the floors it writes and the float32 change it accepts."""

    min_eps: float | None = None  # --min-eps: raise eps (and new guards) to this instead of the smallest normal
    data_floor: str = "keep"  # --data-floor for a clamp on data that is 0.0 there: keep | subnormal | normal | V
    tolerance: float = 1e-3  # --tolerance: the largest float32 change of an output a repair may make (relative)


def run_fix(model: str, output: str | None, deployment: Deployment, rules: list[Rule],
            options: FixOptions, dry_run: bool, inputs: TraceOptions, trace: bool,
            keep: Callable[[list[Finding]], list[Finding]] | None = None, weights: bool = False) -> FixResult:
    # notes the model and its external data as read (-o may be neither); --dim sizes its symbolic dims
    deployment.check_runs(model)
    graph = size_dims(load_onnx(model), inputs.dims)
    if output is not None:
        check_output(output, what="the fixed model")
    target = deployment.fmt
    resolver = deployment.resolver(graph)
    audit = _Pass(rules, keep, weights or trace, inputs if trace else None)
    triples = audit.static(model, graph, resolver)
    pairs = [(r, s) for r, s, _ in triples]
    ctx, plan = _planned(model, graph, resolver, target, options, pairs, set())
    traced = audit.traced(model, graph, resolver)
    result = FixResult(model, output, target, dry_run, plan, [f for _, _, f in triples] + traced,
                       tolerance=options.tolerance, measured=traced)
    if dry_run or not plan.repairs:
        return result
    if output is None:
        raise InputError(None, "fix writes a new model: give -o FIXED.onnx (or --dry-run for the plan only)")
    # the file the OS will write (its missing folders made now: the model is written beside it first), no symlink
    target_path = check_output(output, what="the fixed model", create=True)
    out_dir = target_path.parent
    from ..trace.inputs import input_batches

    batches, result.source = input_batches(graph, inputs)
    result.inputs = result.source.describe()
    excluded: set[tuple[str, str]] = set()
    tmp = out_dir / f".{target_path.name}.precaudit-{os.getpid()}.tmp"
    try:
        # each round writes the repairs not yet withheld and measures them; one whose float32 change on these
        # inputs is beyond the tolerance is withheld and the rest written and measured again (a repair is measured
        # alone, so the next round confirms this one, but for repairs only the whole model could measure). Each
        # round withholds at least one repair, so the rounds end.
        while True:
            pristine = onnx.ModelProto()
            pristine.CopyFrom(ctx.edit.model)
            for repair in plan.repairs:
                repair.apply()
            fixed = ctx.edit.apply()
            result.external = relocate_external(fixed, Path(model).resolve().parent, out_dir, output)
            if tmp.exists():
                tmp.unlink()
            with open(tmp, "xb") as fh:
                fh.write(fixed.SerializeToString())
            _checker(tmp, output, model)
            fixed_graph = _reaudit(result, str(tmp), deployment, audit)
            _compare(result, graph, fixed_graph, pristine, fixed, str(tmp), batches)
            failed = _gate(plan.repairs, options.tolerance, ctx) or _gate_whole(plan.repairs, options.tolerance, ctx,
                                                                               result.comparison)
            if not failed:
                break
            result.withheld += failed
            excluded |= {(r.kind, r.node.name) for r in failed}
            ctx, plan = _planned(model, graph, resolver, target, options, pairs, excluded)
            result.plan.repairs = plan.repairs
            if not plan.repairs:  # nothing left to write: no re-audit, no comparison of a model not written
                result.after, result.new, result.comparison = None, [], None
                break
        _problems(result, options.data_floor)
        for repair in result.plan.repairs:  # the alternative where float32 answers it: the keep, no change at all
            repair.keep_instead = _keep_instead(ctx, repair)
        if trace and result.plan.repairs:
            result.trace = (emulated(graph, deployment, batches, inputs.engine, inputs.timeout),
                            emulated(fixed_graph, deployment, batches, inputs.engine, inputs.timeout))
        if not result.problems and result.plan.repairs:
            replace_with(target_path, None, what="the fixed model", shown=output, written=tmp)
            result.written = True
    except OSError as exc:
        raise InputError(output, f"cannot write it: {exc.strerror or exc}") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return result


def _planned(model: str, graph, resolver: DtypeResolver, target: Format, options: FixOptions, pairs,
             excluded: set[tuple[str, str]]) -> tuple[Context, Plan]:
    """The plan on a fresh copy of the model, less the repairs withheld so far (planning is deterministic: the
    same repairs, with the same new names, in the same order)."""
    edit = Editable.load(model, graph)
    ctx = Context(graph, resolver, edit, target, NormChains(graph, resolver), options.min_eps, options.data_floor)
    plan = plan_repairs(ctx, pairs)
    plan.repairs = [r for r in plan.repairs if (r.kind, r.node.name) not in excluded]
    return ctx, plan


def _checker(path: Path, shown: str, original: str) -> None:
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:
        first = _first_line(exc)
        try:
            onnx.checker.check_model(original, full_check=True)
            also = ""
        except Exception as again:
            also = f" (so does the original: {_first_line(again)})"
        raise InputError(shown, f"the fixed model fails onnx.checker (full check, with shape inference): {first}"
                                f"{also}; nothing written") from None


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__


@dataclass
class _Pass:
    """The audit fix runs on the model, and again on the fixed one, with the run's settings: the static pass (every
    weight too where --check-weights or --trace reads them, as `precaudit check` does) and, with --trace, the
    traced findings, none of which fix repairs."""

    rules: list[Rule]
    keep: Callable[[list[Finding]], list[Finding]] | None
    weights: bool
    trace: TraceOptions | None

    def static(self, path: str, graph: Graph, resolver: DtypeResolver) -> list[tuple[Rule, Site, Finding]]:
        return audit_pairs(graph, resolver, self.rules, path, self.keep, weights=self.weights)

    def traced(self, path: str, graph: Graph, resolver: DtypeResolver) -> list[Finding]:
        if self.trace is None:
            return []
        from ..suppress import drop_suppressed
        from .measured import traced_findings

        found = drop_suppressed(traced_findings(path, graph, resolver, self.rules, self.trace))
        return self.keep(found) if self.keep is not None else found


def _reaudit(result: FixResult, tmp: str, deployment: Deployment, audit: _Pass) -> Graph:
    """The fixed model audited with the same settings: what is fixed, what remains, what is new."""
    fixed_graph = load_onnx(tmp)
    shown = fixed_graph.path = result.output or tmp
    fixed_resolver = deployment.resolver(fixed_graph)
    result.after = [f for _, _, f in audit.static(shown, fixed_graph, fixed_resolver)]
    result.after += audit.traced(shown, fixed_graph, fixed_resolver)
    # a repair that moved a norm's eps (inside the root, or added one) moved its site: its findings are the same norm's
    moved = {r.moved_to: r.node.name for r in result.plan.repairs if r.moved_to}
    result.after = [dataclasses.replace(f, node_name=moved[f.node_name]) if f.node_name in moved else f
                    for f in result.after]
    before = {(f.rule_id, f.node_name) for f in result.before}
    after = {(f.rule_id, f.node_name) for f in result.after}
    result.new = [f for f in result.after if (f.rule_id, f.node_name) not in before]
    for repair in result.plan.repairs:
        repair.still_flagged = [r for r in repair.rules if (r, repair.node.name) in after]
    return fixed_graph


def _compare(result: FixResult, graph: Graph, fixed_graph: Graph, pristine: onnx.ModelProto,
             fixed: onnx.ModelProto, tmp: str, batches: list[dict[str, np.ndarray]]) -> None:
    result.comparison, result.compare_problem = None, None
    hint = result.source.shape_hint() if result.source is not None else ""
    try:
        result.comparison = compare(pristine, result.model, fixed, tmp, graph, fixed_graph, batches,
                                    result.plan.repairs, hint)
    except InputError as exc:  # a model onnxruntime cannot run (a custom op, an op variant its CPU kernels lack)
        result.compare_problem = exc.problem


def _gate(repairs: list[Repair], tolerance: float, ctx: Context) -> list[Repair]:
    """The repairs to withhold: a float32 output change beyond the tolerance, an output made inf/NaN, or a change
    beyond the repair's own bound. Those measured alone go first; one measured only in the whole model is judged
    once every separable failure is out (the whole model's change may have been theirs)."""
    def failure(r: Repair) -> str | None:
        if r.output_newly_bad:
            return f"it makes {r.output_newly_bad} output element{'s' * (r.output_newly_bad != 1)} inf/NaN in float32"
        if r.within is False:
            return (f"its float32 change at the value it repairs is {r.difference:.3g}, beyond its own bound "
                    f"{r.bound:.3g}")
        if r.output_change is not None and r.output_change > tolerance:
            at = f" at '{r.output_name}'" if r.output_name else ""
            whole = " (measured in the whole fixed model)" if r.output_whole else ""
            return (f"it changes the float32 outputs by {r.output_change:.3g} (relative){at}{whole}, beyond "
                    f"--tolerance {tolerance:g}")
        return None

    failed = []
    for alone in (True, False):
        for r in repairs:
            if r.output_whole != alone and (why := failure(r)) is not None:
                r.withheld = why
                r.keep_instead = _keep_instead(ctx, r)
                failed.append(r)
        if failed:
            return failed
    return failed


def _gate_whole(repairs: list[Repair], tolerance: float, ctx: Context, whole: Comparison | None) -> list[Repair]:
    """The tolerance bounds the written model, not each repair: when every repair is within it alone but the
    fixed model's outputs together move beyond it (several norms' eps raised, each a little), the repair that
    changes the outputs most is withheld, and the rest measured again (one a round, largest first)."""
    if whole is None or whole.largest is None or len(repairs) < 2:
        return []
    worst = whole.largest
    if worst.relative <= tolerance and not any(d.nonfinite_after > d.nonfinite_before for d in whole.outputs):
        return []
    largest = max(repairs, key=lambda r: r.output_change or 0.0)
    largest.withheld = (f"the repairs together change the float32 outputs by {worst.relative:.3g} (relative) at "
                        f"'{worst.name}', beyond --tolerance {tolerance:g}, though each alone is within it: this one "
                        f"changes them most ({largest.output_change or 0.0:.3g} alone), so it is left out first")
    largest.keep_instead = _keep_instead(ctx, largest)
    return [largest]


# the repairs of a hazard only the narrow dtype has (an eps or a floor lost there, a fill beyond its range): keeping
# the node in float32 answers them too. The others (a Log of a Softmax, an eps outside the root, a missing eps) are
# wrong in every dtype, and float32 does not fix them.
_KEEP_ANSWERS = ("eps-raise", "guard", "guard-raise", "mask-fill")


def _keep_instead(ctx: Context, repair: Repair) -> list[str]:
    """The keep-list entry that answers the same finding with no float32 change: its norm chain, or the node and
    the clamp it reads; none where float32 would not answer it."""
    if repair.kind not in _KEEP_ANSWERS:
        return []
    chain = ctx.chains.of(repair.node)
    if chain:
        return [n.name for n in chain]
    nodes = [repair.node]
    for v in repair.node.inputs:
        producer = v.producer if v is not None else None
        while producer is not None and producer.op_type in ("Cast", "Identity"):
            x = producer.input(0)
            producer = x.producer if x is not None else None
        if producer is not None and producer.op_type in ("Max", "Clip"):
            nodes.insert(0, producer)
    return [n.name for n in nodes]


def _problems(result: FixResult, data_floor: str) -> None:
    """What keeps the fixed model from being written at all: a repaired finding still there, a new finding."""
    for repair in result.plan.repairs:
        if repair.still_flagged:
            result.problems.append(f"{repair.kind} at '{repair.node.name}': the re-audit still finds "
                                   f"{', '.join(repair.still_flagged)} there")
    asked = {name: r for r in result.plan.repairs if r.kind in ("guard", "guard-raise") for name in r.nodes}
    for finding in result.new:
        floored = asked.get(finding.node_name)
        if floored is not None and finding.rule_id == "PA306" and data_floor == "subnormal":
            # the floor the user asked for is a subnormal number, which is what PA306 says: a note, not a failure
            floored.notes.append(f"PA306 now holds here: the floor asked for (--data-floor subnormal) is a subnormal "
                                f"{result.target.long_name} number, 0.0 wherever subnormals are flushed to zero")
            continue
        result.problems.append(f"the fixed model has a finding the original had not: {finding.rule_id} at "
                               f"'{finding.node_name}'")
