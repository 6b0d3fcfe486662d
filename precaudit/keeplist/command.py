"""What `precaudit keep-list` runs over an audit's context: the list, its snippet run as printed, its rendering."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ..errors import InputError
from ..options import check_choice, check_int, check_number

if TYPE_CHECKING:
    from ..context import Audit

__all__ = ["keep_list_report", "build_checked", "check_printed"]


def keep_list_report(audit: Audit, model: str, target_for: str | None, tolerance: float, max_runs: int,
                     output_format: str) -> tuple[str, int]:
    """The report text and the exit code of `precaudit keep-list`."""
    traced = audit.trace
    keep = build_checked(audit, model, target_for, tolerance, max_runs,
                         progress=_progress if traced is not None and traced.progress else None)
    return (keep.to_json() if output_format == "json" else keep.to_text()), keep.exit_code


def build_checked(audit: Audit, model: str, target_for: str | None, tolerance: float, max_runs: int, progress=None):
    """The keep-list of one model with its snippet run as printed: what the command and the Python API return.
    Every value is checked before the model is read; an error names it as the settings name it (--for, or for_)."""
    from . import FOR_TARGETS, build_keep_list

    named = audit.settings.named
    if target_for is None:
        raise InputError(None, f"keep-list needs {named('for_')}: one of {', '.join(FOR_TARGETS)}")
    target_for = check_choice(target_for, FOR_TARGETS, named("for_"))
    tolerance = check_number(tolerance, named("tolerance"), minimum=0.0, above=True)
    max_runs = check_int(max_runs, named("max_runs"), 1)
    keep = build_keep_list(audit, model, target_for, tolerance, max_runs, progress=progress)
    if not keep.pytorch:
        check_printed(keep, audit.rules)
    return keep


def check_printed(keep, rules) -> None:
    """Run the snippet as printed; where the converter turns the list into a model onnxruntime refuses and the list
    keeps control flow (a converter that cannot block an If), try the list without it, and print that one if its
    model loads: the hazard inside the body then stays in the narrow dtype, and the verdict says so."""
    from .render import keep_args, snippet
    from .snippet_run import check_snippet

    def run() -> None:
        keep.snippet_check = check_snippet(keep.target_for, keep_args(keep), lambda a: snippet(keep, a), keep.target,
                                           rules, keep.batches, keep.inputs, keep.model,
                                           frozenset((f.rule_id, f.node_name) for f in keep.not_fixed))

    run()
    first = keep.snippet_check
    flow = [n for n in keep.nodes if n.bodies or n.subgraph_path]
    if first is None or first.loads is not False or not flow:
        return
    held = {id(n) for n in flow}
    removed = []
    for entry in keep.entries:
        if any(id(n) in held for n in entry.nodes):
            removed.append(entry)
            entry.nodes = [n for n in entry.nodes if id(n) not in held]
    run()
    names = ", ".join(f"'{n.name}'" for n in flow[:3]) + (" and more" if len(flow) > 3 else "")
    if keep.snippet_check.loads:
        keep.alternative = (f"the list with {names} kept: {first.problem}; printed instead: the list without them, "
                            f"whose model loads, but the hazard inside stays in {keep.target.long_name}")
    else:
        keep.alternative = (f"no list this converter turns into a model onnxruntime loads keeps {names}: "
                            f"{first.problem}; try --for modelopt (it keeps a blocked If whole) or precaudit fix "
                            "for the hazard inside")


def _progress(message: str) -> None:
    """One line per emulation run, on a terminal only (trace.progress is set for a terminal)."""
    sys.stderr.write(f"precaudit: {message}\n")
    sys.stderr.flush()
