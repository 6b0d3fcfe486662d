"""A fix as people read it (text: each repair's node, before → after and tolerance, what was left and why, the
checks) and as scripts read it (JSON: the same, raw names)."""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import TYPE_CHECKING, Any

from ..escape import encodable, printable
from .check import Emulated

if TYPE_CHECKING:
    from .run import FixResult

__all__ = ["SCHEMA_VERSION", "render_json", "render_text"]

SCHEMA_VERSION = 1


def _num(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _g(x: float | None) -> str:
    if x is None:
        return "—"
    return "inf" if math.isinf(x) else f"{x:.3g}"


def render_text(result: FixResult) -> str:
    p = printable
    head = f"{p(result.model)}"
    if result.dry_run:
        head += f"  (--dtype {result.target.name}, --dry-run: the plan only, nothing written)"
    elif result.written:
        head += f" → {p(result.output or '')}  (--dtype {result.target.name})"
    else:
        head += f"  (--dtype {result.target.name}; {p(result.output or '')} not written)"
    lines = [head, *_plan_lines(result), *_check_lines(result)]
    if result.trace is not None:
        lines += _trace_table(result)
    if result.source is not None and result.source.synthesized and (result.plan.repairs or result.withheld):
        lines.append(f"  NOT CHECKED ON YOUR DATA: the float32 check ran on {p(result.source.describe())}, which says "
                     "nothing about the inputs your model sees (quiet audio, padding, real images); give them with "
                     "--inputs FILE.npz (exit 3 until then)")
    lines += _written_lines(result)
    return "\n".join(lines) + "\n"


# why a traced finding is left (fix rewrites what the static audit can show is safe to change)
_MEASURED_REASON = ("fix repairs what the static audit finds; keep this in float32 instead (precaudit keep-list MODEL "
                    "--for CONVERTER, with the same --trace and --inputs)")


def _plan_lines(result: FixResult) -> list[str]:
    """Each repair made, withheld or left, and the plan's notes."""
    p = printable
    plan = result.plan
    lines = []
    if not plan.repairs and not plan.skipped and not result.withheld and not result.measured:
        lines.append("  nothing to repair: the audit finds nothing here")
    for r in plan.repairs:
        lines.append(f"  repair  {r.kind}  node '{p(r.node.name)}' ({p(r.node.op_type)})  {r.rule_text}")
        lines += _repair_body(r, result)
    for r in result.withheld:
        lines.append(f"  withheld {r.kind}  node '{p(r.node.name)}' ({p(r.node.op_type)})  {r.rule_text}: "
                     f"{p(r.withheld or '')}; not in the written model")
        lines += _repair_body(r, result)
        if r.keep_instead:
            lines.append(f"          instead, keep in float32 (no float32 change at all): {_names(r.keep_instead)} "
                         "(precaudit keep-list MODEL --for CONVERTER)")
    for s in plan.skipped:
        lines.append(f"  left    {s.rule_id} {p(s.rule_name)}  node '{p(s.node.name)}' ({p(s.node.op_type)}): {p(s.reason)}")
        if s.keep_fp32:
            lines.append(f"          keep in float32: {_names(s.keep_fp32)}")
    for f in result.measured:
        lines.append(f"  left    {f.rule_id} {p(f.rule_name)}  node '{p(f.node_name)}' ({p(f.op_type)}), {f.severity} "
                     f"measured on {f.inputs} inputs (--trace): {_MEASURED_REASON}")
    lines += [f"  note: {p(note)}" for note in plan.notes]
    return lines


def _check_lines(result: FixResult) -> list[str]:
    """The float32 check against the original outputs, and the re-audit (or, in a dry run, the plan's coverage)."""
    p = printable
    lines = []
    if result.comparison is not None:
        c = result.comparison
        largest = c.largest
        how = " (the model is stored in a narrow type: read as float32 for this)" if c.widened else ""
        if largest is not None:
            lines.append(f"  float32 check (onnxruntime, {p(result.inputs)}){how}: largest output difference "
                         f"{_g(largest.max_abs)} (relative {_g(largest.relative)}) at '{p(largest.name)}'")
        lines += [f"          output '{p(d.name)}': {d.nonfinite_before} inf/NaN elements before, "
                  f"{d.nonfinite_after} after" for d in c.outputs if d.nonfinite_before != d.nonfinite_after]
    if result.compare_problem is not None:
        lines.append(f"  float32 check: not run: {p(result.compare_problem)}")
    plan = result.plan
    if result.after is not None:
        remain = Counter(f.rule_id for f in result.after)
        shown = ", ".join(f"{rule} ×{n}" for rule, n in sorted(remain.items()))
        lines.append(f"  re-audit: {result.fixed_count} finding{'s' * (result.fixed_count != 1)} fixed, "
                     f"{len(result.after)} remain" + (f" ({shown})" if shown else ""))
    elif result.dry_run and plan.repairs:
        covered = sum(len(r.rules) for r in plan.repairs)
        lines.append(f"  plan: {len(plan.repairs)} repair{'s' * (len(plan.repairs) != 1)} for {covered} of "
                     f"{len(result.before)} findings; {len(plan.skipped)} left")
    return lines


def _written_lines(result: FixResult) -> list[str]:
    """What was written, or why nothing was."""
    p = printable
    plan = result.plan
    if result.written:
        where = ""
        if result.external:
            files = ", ".join(f"'{p(f)}'" for f in result.external)
            where = f" (external data: reads {files} in place; nothing copied, the data files unchanged)"
        return [f"  wrote {p(result.output or '')}{where}"]
    if not result.dry_run and not plan.repairs and (plan.skipped or result.withheld):
        return ["  nothing repaired: no model written"]
    if not result.dry_run and plan.repairs:
        return [*(f"  problem: {p(problem)}" for problem in result.problems), "  the fixed model was NOT written"]
    return []


def _repair_body(r, result: FixResult) -> list[str]:
    p = printable
    lines = [f"          before: {p(r.before)}", f"          after:  {p(r.after)}",
             f"          tolerance in float32: {p(r.tolerance)}"]
    if r.within is not None:
        verdict = "within" if r.within else "BEYOND"
        extra = f"; {r.clamped} element{'s' * (r.clamped != 1)} clamped" if r.clamped else ""
        extra += f"; {r.made_finite} inf/NaN element{'s' * (r.made_finite != 1)} now finite" if r.made_finite else ""
        lines.append(f"          measured: {_g(r.difference)} relative, {verdict} its bound {_g(r.bound)}{extra}")
    if r.output_change is not None:
        at = f" at '{p(r.output_name)}'" if r.output_name else ""
        alone = " (in the whole fixed model: not separable)" if r.output_whole else " (this repair alone)"
        verdict = "within" if r.output_change <= result.tolerance and not r.output_newly_bad else "BEYOND"
        finite = f"; {r.output_made_finite} output inf/NaN now finite" if r.output_made_finite else ""
        lines.append(f"          float32 outputs change: {_g(r.output_change)} relative{at}{alone}, {verdict} "
                     f"--tolerance {result.tolerance:g}{finite}")
    if r.keep_instead and not r.withheld:
        lines.append(f"          or instead keep in float32 (no float32 change): {_names(r.keep_instead)}")
    for note in r.notes:
        lines.append(f"          note: {p(note)}")
    if r.still_flagged and not r.withheld:
        lines.append(f"          the re-audit still finds {', '.join(r.still_flagged)} here")
    return lines


def _trace_table(result: FixResult) -> list[str]:
    assert result.trace is not None  # called only for a result with a trace
    before, after = result.trace
    name = result.target.long_name

    def finite(e: Emulated) -> str:
        return "yes" if e.finite else f"no ({e.nonfinite_fraction:.3g} of the output elements inf/NaN)"

    rows = [("outputs finite", finite(before), finite(after)),
            ("output error", _g(before.error), _g(after.error)),
            ("first inf/NaN", f"'{printable(before.first_nonfinite)}'" if before.first_nonfinite else "—",
             f"'{printable(after.first_nonfinite)}'" if after.first_nonfinite else "—")]
    width = max(len(r[1]) for r in rows) + 2
    lines = [f"  emulated {name} (--trace, {printable(result.inputs)}):", f"    {'':<16}{'original':<{width}}fixed"]
    lines += [f"    {label:<16}{a:<{width}}{b}" for label, a, b in rows]
    return lines


def _names(names: list[str], limit: int = 6) -> str:
    shown = [f"'{printable(n)}'" for n in names]
    if len(shown) > limit:
        shown = [*shown[:3], f"… ({len(shown) - 5} more)", *shown[-2:]]
    return f"{len(names)} node{'s' * (len(names) != 1)} " + ", ".join(shown)


def _emulated(e: Emulated) -> dict[str, Any]:
    return {"outputs_finite": e.finite, "nonfinite_fraction": e.nonfinite_fraction, "output_error": _num(e.error),
            "first_nonfinite": e.first_nonfinite}


def render_json(result: FixResult) -> str:
    plan = result.plan
    data: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "model": result.model,
        "output": result.output,
        "dtype": result.target.name,
        "dry_run": result.dry_run,
        "written": result.written,
        "repairs": [_repair_json(r, result) for r in plan.repairs],
        "withheld": [{**_repair_json(r, result), "reason": r.withheld} for r in result.withheld],
        "tolerance": result.tolerance,
        "verified": result.verified,
        "inputs": None if result.source is None else result.source.record(),
        "left": [{"rule_id": s.rule_id, "rule_name": s.rule_name, "node": s.node.name, "op": s.node.op_type,
                  "reason": s.reason, "keep_fp32": s.keep_fp32} for s in plan.skipped] + [
                 {"rule_id": f.rule_id, "rule_name": f.rule_name, "node": f.node_name, "op": f.op_type,
                  "reason": _MEASURED_REASON, "keep_fp32": [], "severity": f.severity, "inputs": f.inputs}
                 for f in result.measured],
        "notes": plan.notes,
        "reaudit": None if result.after is None else {
            "before": len(result.before), "fixed": result.fixed_count, "remain": len(result.after),
            "remaining": [{"rule_id": f.rule_id, "node": f.node_name} for f in result.after],
            "new": [{"rule_id": f.rule_id, "node": f.node_name} for f in result.new]},
        "float32": None if result.comparison is None else {
            "inputs": result.inputs, "synthesized": result.source is not None and result.source.synthesized,
            "widened": result.comparison.widened,
            "outputs": [{"name": d.name, "max_abs_difference": _num(d.max_abs), "relative": _num(d.relative),
                         "nonfinite_before": d.nonfinite_before, "nonfinite_after": d.nonfinite_after,
                         "elements": d.elements} for d in result.comparison.outputs]},
        "float32_not_run": result.compare_problem,
        "emulated": None if result.trace is None else {
            "dtype": result.target.name, "inputs": result.inputs,
            "original": _emulated(result.trace[0]), "fixed": _emulated(result.trace[1])},
        "external_data": result.external,
        "problems": result.problems,
    }
    return json.dumps(_encodable(data), indent=2, ensure_ascii=False) + "\n"


def _repair_json(r, result: FixResult) -> dict[str, Any]:
    return {
        "kind": r.kind, "node": r.node.name, "op": r.node.op_type, "rules": r.rules, "before": r.before,
        "after": r.after, "tolerance": r.tolerance, "nodes": r.nodes, "notes": r.notes,
        "float32": None if r.within is None else {"difference": _num(r.difference), "bound": _num(r.bound),
                                                  "within": r.within, "clamped": r.clamped,
                                                  "made_finite": r.made_finite},
        "output_change": None if r.output_change is None else {
            "relative": _num(r.output_change), "output": r.output_name, "alone": not r.output_whole,
            "made_finite": r.output_made_finite, "made_nonfinite": r.output_newly_bad},
        "still_flagged": r.still_flagged if result.after is not None and not r.withheld else None,
        "keep_fp32_instead": r.keep_instead,
    }


def _encodable(value: Any) -> Any:
    """Names carry raw, but a lone surrogate (a name that is not UTF-8) cannot be written: escape just those."""
    if isinstance(value, str):
        return encodable(value)
    if isinstance(value, list):
        return [_encodable(v) for v in value]
    if isinstance(value, dict):
        return {k: _encodable(v) for k, v in value.items()}
    return value
