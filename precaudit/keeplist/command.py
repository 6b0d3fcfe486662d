"""What `precaudit keep-list` runs once the command line is parsed: settings, rules, the list, its rendering."""

from __future__ import annotations

import sys

from ..config import load_settings
from ..dtypes import format_named
from ..errors import InputError
from ..options import TorchOptions, TraceOptions, check_choice, check_int, check_number

__all__ = ["keep_list_report", "build_checked", "check_printed"]


def keep_list_report(model: str, given: dict, target_for: str | None, torch_options: TorchOptions,
                     trace: TraceOptions | None, tolerance: float, max_runs: int, output_format: str,
                     dims: dict[str, int] | None = None) -> tuple[str, int]:
    """The report text and the exit code. given holds the flags the user typed (dtype, keep_fp32, rules), over the
    pyproject."""
    settings = load_settings({k: v for k, v in given.items() if v not in (None, [])})
    keep = build_checked(model, settings, target_for, torch_options, trace, tolerance, max_runs,
                         progress=_progress if trace is not None and trace.progress else None, dims=dims)
    return (keep.to_json() if output_format == "json" else keep.to_text()), keep.exit_code


def build_checked(model: str, settings, target_for: str | None, torch_options: TorchOptions | None,
                  trace: TraceOptions | None, tolerance: float, max_runs: int, progress=None,
                  dims: dict[str, int] | None = None):
    """The keep-list of one model with its snippet run as printed: what the command and the Python API return.
    Every value is checked before the model is read; an error names it as settings.named does (--for, or for_)."""
    from ..pipeline import check_all_selectors
    from ..rules.loader import load_rules
    from ..selection import active_rules, drop_ignored
    from . import FOR_TARGETS, build_keep_list

    named = settings.named
    if target_for is None:
        raise InputError(None, f"keep-list needs {named('for_')}: one of {', '.join(FOR_TARGETS)}")
    target_for = check_choice(target_for, FOR_TARGETS, named("for_"))
    target = format_named(settings.dtype)  # checked when the settings were made
    tolerance = check_number(tolerance, named("tolerance"), minimum=0.0, above=True)
    max_runs = check_int(max_runs, named("max_runs"), 1)
    all_rules = load_rules(settings.rules)
    check_all_selectors(settings, all_rules)
    rules = active_rules(all_rules, settings.select, settings.ignore, settings.preview)
    by_id = {r.id: r for r in rules}

    def ignored(findings):  # the pyproject's per-model and per-node ignores, as check and fix apply them
        return drop_ignored(findings, by_id, settings.per_model_ignores, settings.per_node_ignores,
                            settings.project_root)

    keep = build_keep_list(model, target, target_for, settings.keep_fp32, rules, torch_options, trace, tolerance,
                           max_runs, progress=progress, keep=ignored, dims=dims)
    if not keep.pytorch:
        check_printed(keep, rules)
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
