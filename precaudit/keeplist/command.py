"""What `precaudit keep-list` runs over an audit's context: the list, its snippet run as printed, its rendering."""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING

from ..errors import InputError
from ..escape import printable
from ..options import check_choice, check_int, check_number

if TYPE_CHECKING:
    from ..context import Audit

__all__ = ["build_checked", "check_printed", "keep_list_report"]


def keep_list_report(audit: Audit, model: str, target_for: str | None, tolerance: float, max_runs: int,
                     output_format: str, policy: str | None = None) -> tuple[str, int]:
    """The report text and the exit code of `precaudit keep-list`."""
    traced = audit.trace
    keep = build_checked(audit, model, target_for, tolerance, max_runs,
                         progress=_progress if traced is not None and traced.progress else None, policy=policy)
    reason = keep.reason()
    if reason is not None:  # what exit 1 means, where a script's log shows it (the report goes to stdout or -o)
        sys.stderr.write(f"precaudit: {printable(model)}: {printable(reason)}\n")
    return (keep.to_json() if output_format == "json" else keep.to_text()), keep.exit_code


def build_checked(audit: Audit, model: str, target_for: str | None, tolerance: float, max_runs: int, progress=None,
                  policy: str | None = None):
    """The keep-list of one model with its snippet run as printed: what the command and the Python API return.
    Every value is checked before the model is read; an error names it as the settings name it (--for, or for_)."""
    from . import FOR_TARGETS, POLICIES, build_keep_list

    named = audit.settings.named
    if target_for is None:
        raise InputError(None, f"keep-list needs {named('for_')}: one of {', '.join(FOR_TARGETS)}")
    target_for = check_choice(target_for, FOR_TARGETS, named("for_"))
    tolerance = check_number(tolerance, named("tolerance"), minimum=0.0, above=True)
    max_runs = check_int(max_runs, named("max_runs"), 1)
    if policy is not None:
        policy = check_choice(policy, POLICIES, named("policy"))
        if audit.trace is None:
            raise InputError(None, f"{named('policy')} {policy}: the minimal and the safe list differ by what a "
                                   f"traced run measures; add {named('trace')}")
    keep = build_keep_list(audit, model, target_for, tolerance, max_runs, progress=progress, policy=policy)
    if keep.target_for == "coreml":
        from .coreml_snippet import check_coreml
        from .render import snippet

        keep.snippet_check = check_coreml(keep, audit.torch, lambda a: snippet(keep, a))
    elif not keep.pytorch:
        check_printed(keep, audit.rules)
    return keep


def check_printed(keep, rules) -> None:
    """Run the snippet as printed. Where the converter turns the list into a model onnxruntime refuses, look for a
    list it can convert: without the control-flow nodes and their bodies' nodes it holds (a converter that cannot
    block an If), without the kept nodes whose outputs a body reads from outside (a read the converter leaves
    uncast), or without both; print the first whose model loads, and say what was left out and why. The hazard
    there then stays in the narrow dtype, and only a run of the real model on inputs can verify it."""
    from .render import keep_args, snippet
    from .runtime_targets import written_check
    from .snippet_run import check_snippet

    def run() -> None:
        keep.snippet_check = check_snippet(keep.target_for, keep_args(keep), lambda a: snippet(keep, a), keep.target,
                                           rules, keep.batches, keep.inputs, keep.model,
                                           frozenset((f.rule_id, f.node_name) for f in keep.not_fixed),
                                           written_check(keep))

    run()
    for _ in range(_MOST_UNRUNNABLE):  # a node the runtime has no low-dtype kernel for, as the converter writes it
        if not _keep_unrunnable(keep):
            break
        run()
    first = keep.snippet_check
    if first is None or first.loads is not False:
        return
    flow = [n for n in keep.nodes if n.bodies or n.subgraph_path]
    outer = _read_by_bodies(keep)
    tries = [t for t in (flow, outer, _union(flow, outer) if flow and outer else []) if t]
    listed = {id(e): list(e.nodes) for e in keep.entries}
    for left_out in tries:
        held = {id(n) for n in left_out}
        for entry in keep.entries:
            entry.nodes = [n for n in listed[id(entry)] if id(n) not in held]
        run()
        if keep.snippet_check.loads:
            keep.alternative = (f"the list with {_names(left_out)} kept: {first.problem}; printed instead: the list "
                                f"without them ({_why(left_out, flow)}), whose model loads, but the hazard there "
                                f"stays in {keep.target.long_name}")
            return
    yours = _read_by_bodies(keep, _user_kept(keep))
    if not tries and not yours:
        return
    names = _names(_union(flow, outer) or yours)
    also = (f"; {_names(yours)}, kept by your --keep-fp32, make{'s' * (len(yours) == 1)} values an If/Loop body "
            "reads, which this converter leaves uncast") if yours else ""
    keep.alternative = (f"no list this converter turns into a model onnxruntime loads keeps {names}: "
                        f"{first.problem}{also}; try --for modelopt (it keeps a blocked If whole) or precaudit fix "
                        "for the hazard there")


_MOST_UNRUNNABLE = 16  # nodes added one per snippet run: a converted model refused for more is said as it is
# onnxruntime's refusal of a node it has no kernel for in the converted dtype (RandomUniform in float16), and
# onnxruntime's type check of a node the converter retyped but whose dtype attribute it left float32
_NO_KERNEL = re.compile(r"Could not find an implementation for (\w+)\(\d+\) node with name '(.*?)'")
_RETYPED = re.compile(r"of output arg \(.*?\) of node \((.*?)\) does not match expected type")


def _keep_unrunnable(keep) -> bool:
    """Where onnxruntime refuses the converted model for one node it cannot run as the converter wrote it, keep
    that node in float32 too (an entry of its own, found by running the snippet as printed). False when the
    refusal names no such node, or one already kept."""
    from . import Entry
    from .render import raw_name

    check = keep.snippet_check
    if check is None or check.loads is not False or not check.problem:
        return False
    found = _NO_KERNEL.search(check.problem) or _RETYPED.search(check.problem)
    if found is None:
        return False
    name = found.groups()[-1]
    kept = {id(n) for n in keep.nodes}
    # a main-graph node that makes data of its own dtype (RandomUniform's dtype attribute), or has no kernel in
    # it: not a body's node, whose types a blocked If leaves mismatched (the control-flow fallback's case)
    node = next((n for n in keep.graph.nodes if raw_name(n) == name and id(n) not in kept and not n.subgraph_path
                 and not n.bodies and (found.re is _NO_KERNEL or "dtype" in n.attrs)), None)
    if node is None:
        return False
    keep.entries.append(Entry("runtime", [f"onnxruntime cannot run '{name}' ({node.op_type}) as the converter writes "
                                          f"it ({check.problem.split(': ', 1)[-1][:160]}): kept in float32"], [node]))
    return True


def _read_by_bodies(keep, among: list | None = None) -> list:
    """The kept nodes (or those of `among`) whose outputs an If/Loop/Scan body reads by name from outside."""
    from ..ir import implicit_inputs

    nodes = keep.nodes if among is None else among
    kept = {id(n) for n in nodes}
    found: dict[int, object] = {}
    for node in keep.graph.nodes:
        if node.bodies:
            for value in implicit_inputs(node):
                if value.producer is not None and id(value.producer) in kept:
                    found.setdefault(id(value.producer), value.producer)
    return [n for n in nodes if id(n) in found]


def _user_kept(keep) -> list:
    """The nodes the user's own --keep-fp32 names or globs keep (not op types): no fallback drops them."""
    from fnmatch import fnmatchcase

    ops = {n.op_type for n in keep.graph.nodes}
    patterns = [e for e in keep.keep_fp32 if e not in ops]
    return [n for n in keep.graph.nodes if any(fnmatchcase(n.name, p) for p in patterns)]


def _union(a: list, b: list) -> list:
    return list({id(n): n for n in [*a, *b]}.values())


def _names(nodes: list) -> str:
    return ", ".join(f"'{n.name}'" for n in nodes[:3]) + (" and more" if len(nodes) > 3 else "")


def _why(left_out: list, flow: list) -> str:
    held = {id(n) for n in flow}
    if all(id(n) in held for n in left_out):
        return "control flow, which this converter cannot block"
    if not any(id(n) in held for n in left_out):
        return "their outputs are read inside an If/Loop body, which this converter leaves uncast"
    return "control flow, and nodes whose outputs a body reads, which this converter cannot keep"


def _progress(message: str) -> None:
    """One line per emulation run, on a terminal only (trace.progress is set for a terminal)."""
    sys.stderr.write(f"precaudit: {message}\n")
    sys.stderr.flush()
