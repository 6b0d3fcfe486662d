"""`precaudit fix`, start to end: audit, plan, edit, write next to the target under a temporary name, check
(onnx.checker with shape inference, the re-audit, float32 against the original, the emulated run with --trace),
and only then rename into place."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from ..analysis.compute_dtype import DtypeResolver
from ..dtypes import Format
from ..errors import InputError
from ..files import check_output
from ..finding import Finding
from ..frontends.onnx import load_onnx
from ..keeplist.chains import NormChains
from ..options import TraceOptions
from ..rules.loader import Rule
from .check import Comparison, Emulated, compare, emulated
from .model import Editable, relocate_external
from .plan import Context, Plan
from .planner import audit_pairs, plan_repairs

__all__ = ["FixResult", "run_fix"]


@dataclass
class FixResult:
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
    trace: tuple[Emulated, Emulated] | None = None
    external: list[str] = field(default_factory=list)  # data files the fixed model reads in place
    written: bool = False
    problems: list[str] = field(default_factory=list)  # why the fixed model was not written
    compare_problem: str | None = None  # why the float32 comparison could not run

    @property
    def fixed_count(self) -> int:
        if self.after is None:
            return 0
        left = {(f.rule_id, f.node_name) for f in self.after}
        return sum(1 for f in self.before if (f.rule_id, f.node_name) not in left)

    @property
    def exit_code(self) -> int:
        return 1 if self.problems else 0


def run_fix(model: str, output: str | None, target: Format, rules: list[Rule], keep_fp32: list[str], converter: str,
            min_eps: float | None, dry_run: bool, inputs: TraceOptions, trace: bool,
            keep: Callable[[list[Finding]], list[Finding]] | None = None) -> FixResult:
    graph = load_onnx(model)  # notes the model and its external data as read: -o may be neither
    if output is not None:
        check_output(output, what="the fixed model")
    resolver = DtypeResolver(graph, target, keep_fp32, converter)
    triples = audit_pairs(graph, resolver, rules, model, keep)
    edit = Editable.load(model, graph)
    ctx = Context(graph, resolver, edit, target, NormChains(graph, resolver), min_eps)
    plan = plan_repairs(ctx, [(r, s) for r, s, _ in triples])
    result = FixResult(model, output, target, dry_run, plan, [f for _, _, f in triples])
    if dry_run or not plan.repairs:
        return result
    if output is None:
        raise InputError(None, "fix writes a new model: give -o FIXED.onnx (or --dry-run for the plan only)")
    pristine = onnx.ModelProto()
    pristine.CopyFrom(edit.model)
    for repair in plan.repairs:
        repair.apply()
    fixed = edit.apply()
    target_path = Path(output).resolve()
    out_dir = target_path.parent
    if not out_dir.is_dir():
        raise InputError(output, "its folder does not exist")
    result.external = relocate_external(fixed, Path(model).resolve().parent, out_dir, output)
    tmp = out_dir / f".{target_path.name}.precaudit-{os.getpid()}.tmp"
    try:
        with open(tmp, "xb") as fh:
            fh.write(fixed.SerializeToString())
        _checker(tmp, output, model)
        _verify(result, ctx, pristine, fixed, str(tmp), target, rules, keep_fp32, converter, inputs, trace, keep)
        if not result.problems:
            check_output(output, what="the fixed model")
            os.replace(tmp, target_path)
            result.written = True
    except OSError as exc:
        raise InputError(output, f"cannot write it: {exc.strerror or exc}") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return result


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


def _verify(result: FixResult, ctx: Context, pristine: onnx.ModelProto, fixed: onnx.ModelProto, tmp: str,
            target: Format, rules: list[Rule], keep_fp32: list[str], converter: str, options: TraceOptions,
            trace: bool, keep) -> None:
    graph = ctx.graph
    fixed_graph = load_onnx(tmp)
    fixed_graph.path = result.output or tmp
    fixed_resolver = DtypeResolver(fixed_graph, target, keep_fp32, converter)
    result.after = [f for _, _, f in audit_pairs(fixed_graph, fixed_resolver, rules, result.output or tmp, keep)]
    # a repair that moved a norm's eps (inside the root, or added one) moved its site: its findings are the same norm's
    moved = {r.moved_to: r.node.name for r in result.plan.repairs if r.moved_to}
    for finding in result.after:
        finding.node_name = moved.get(finding.node_name, finding.node_name)
    before = {(f.rule_id, f.node_name) for f in result.before}
    after = {(f.rule_id, f.node_name) for f in result.after}
    result.new = [f for f in result.after if (f.rule_id, f.node_name) not in before]
    for repair in result.plan.repairs:
        repair.still_flagged = [r for r in repair.rules if (r, repair.node.name) in after]
    batches = _batches(graph, options)
    result.inputs = (f"inputs from {', '.join(options.inputs)}" if options.inputs else
                     f"{len(batches)} synthesized sample{'s' * (len(batches) != 1)} (seed {options.seed})")
    try:
        result.comparison = compare(pristine, result.model, fixed, tmp, graph, fixed_graph, batches,
                                    result.plan.repairs)
    except InputError as exc:  # a model onnxruntime cannot run (a custom op, an op variant its CPU kernels lack)
        result.compare_problem = exc.problem
    if trace:
        result.trace = (emulated(graph, target, keep_fp32, converter, batches, options.engine),
                        emulated(fixed_graph, target, keep_fp32, converter, batches, options.engine))
    for repair in result.plan.repairs:
        where = f"{repair.kind} at '{repair.node.name}'"
        if repair.within is False:
            result.problems.append(f"{where}: the float32 outputs differ by {repair.difference:.3g}, beyond its "
                                   f"tolerance {repair.bound:.3g}")
        if repair.still_flagged:
            result.problems.append(f"{where}: the re-audit still finds {', '.join(repair.still_flagged)} there")
    for finding in result.new:
        result.problems.append(f"the fixed model has a finding the original had not: {finding.rule_id} at "
                               f"'{finding.node_name}'")


def _batches(graph, options: TraceOptions) -> list[dict[str, np.ndarray]]:
    from ..trace.inputs import load_inputs, synthesize_inputs

    if options.inputs:
        return [load_inputs(graph, p, options.dims) for p in options.inputs]
    return [synthesize_inputs(graph, options.dims, options.seed + i) for i in range(max(1, options.samples))]
