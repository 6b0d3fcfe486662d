"""Every keep-list snippet checked as printed: the real converter runs it (where it is installed, in a child
Python), onnxruntime loads the model it writes, a static audit of that model looks for error findings, and, with
inputs, the converted model runs on them against the original's float32 outputs.

The snippet run is the printed one but for the path it saves to (a scratch folder: the user's folder gets nothing).
It runs with `python -I`: no current folder or user site on sys.path, so a module file beside the model cannot
stand in for the converter. The names in it are Python literals (repr), so a model's names cannot run code there.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

import numpy as np

from ..converters import KeepArgs

__all__ = ["SnippetCheck", "check_snippet", "RUNNABLE"]

# --for → the module the snippet imports: its converter is installed when this is found
RUNNABLE = {"onnxruntime": "onnxruntime.transformers.onnx_model", "onnxconverter-common": "onnxconverter_common"}
_TIMEOUT = 1800  # seconds: the converters run shape inference, which takes minutes on the largest models


@dataclass
class SnippetCheck:
    """What running the printed snippet showed."""

    ran: bool  # the real converter ran it
    how: str  # which converter ran it, or why it did not run
    loads: bool | None = None  # onnxruntime accepted the model it wrote
    problem: str | None = None  # the first line of what failed
    errors: list[str] = field(default_factory=list)  # error findings of a static audit of the written model
    finite: bool | None = None  # on the inputs: every output finite where the float32 reference is
    error: float | None = None  # largest output error over the output's largest |value|, on the inputs
    inputs: str = ""

    @property
    def ok(self) -> bool:
        return self.ran and bool(self.loads) and not self.errors and self.finite is not False

    def within(self, tolerance: float) -> bool:
        return self.ok and (self.error is None or self.error <= tolerance)

    def record(self) -> dict:
        return {f.name: getattr(self, f.name) if f.name != "error" or self.error is None or math.isfinite(self.error)
                else None for f in dataclasses.fields(self)}


def check_snippet(target_for: str, args: KeepArgs, render, target, rules, batches: list[dict[str, np.ndarray]] | None,
                  inputs: str, reference_model: str, not_fixed: frozenset[tuple[str, str]] = frozenset()
                  ) -> SnippetCheck:
    """Run the snippet render(args) makes for this target. render is the keep-list's snippet function; not_fixed
    holds (rule id, node name) of the error findings no float32 node fixes (an eps of inf): the list never claimed
    them, the report says them apart, and the converted model still having them does not fail the snippet."""
    module = RUNNABLE.get(target_for)
    if module is None:
        return SnippetCheck(False, f"not run: {target_for}'s snippet is not a Python script precaudit can run here")
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return SnippetCheck(False, f"not run: {module.split('.')[0]} is not installed, so the snippet was checked "
                                   "against precaudit's model of the converter only")
    with tempfile.TemporaryDirectory(prefix="precaudit-snippet-") as folder:
        out = os.path.join(folder, "converted.onnx")
        script = os.path.join(folder, "snippet.py")
        with open(script, "w", encoding="utf-8") as fh:
            fh.write(render(dataclasses.replace(args, out_path=out)) + "\n")
        check = SnippetCheck(True, f"ran with the installed {module.split('.')[0]}", inputs=inputs)
        try:
            proc = subprocess.run([sys.executable, "-I", script], cwd=os.getcwd(), capture_output=True, text=True,
                                  timeout=_TIMEOUT, errors="replace")
        except subprocess.TimeoutExpired:
            check.problem = f"the snippet did not finish in {_TIMEOUT} s"
            return check
        if proc.returncode != 0 or not os.path.exists(out):
            check.problem = "the snippet failed: " + _last_line(proc.stderr)
            return check
        session = _session(out, check)
        if check.problem:  # the scratch path means nothing to the user
            check.problem = check.problem.replace(out, "the converted model")
        if session is None:
            return check
        check.errors = _error_findings(out, target, rules, not_fixed)
        if batches:
            _compare(check, session, reference_model, batches)
    return check


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no message"


def _session(path: str, check: SnippetCheck):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        check.loads = False
        check.problem = "onnxruntime refuses the model the snippet writes: " + _last_line(str(exc) or type(exc).__name__)
        return None
    check.loads = True
    return session


def _error_findings(path: str, target, rules, not_fixed: frozenset[tuple[str, str]]) -> list[str]:
    """The error findings of a static audit of the converted model, as it is stored (it runs as written), but for
    those the list does not claim to fix."""
    from ..deployment import Deployment
    from ..audit_models import load_graph
    from . import static_findings

    graph = load_graph(path, None, target.name)
    resolver = Deployment(target).resolver(graph)  # the converted model runs as it is stored
    found = static_findings(graph, resolver, rules, path, weights=False)
    return [f"{f.rule_id} {f.rule_name} at '{f.node_name}'" for f in found
            if f.severity == "error" and (f.rule_id, f.node_name) not in not_fixed]


def _compare(check: SnippetCheck, session, reference_model: str, batches: list[dict[str, np.ndarray]]) -> None:
    """The converted model on each batch against the original in float32 (both by onnxruntime, no fusions)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    try:
        reference = ort.InferenceSession(reference_model, options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        check.problem = "onnxruntime cannot run the original model: " + _last_line(str(exc))
        return
    wanted = {i.name: i.type for i in session.get_inputs()}
    names = [o.name for o in reference.get_outputs()]
    converted_names = {o.name for o in session.get_outputs()}
    finite, error = True, 0.0
    for feeds in batches:
        ref = dict(zip(names, reference.run(names, {k: v for k, v in feeds.items()
                                                    if k in {i.name for i in reference.get_inputs()}})))
        cast = {k: _as(v, wanted[k]) for k, v in feeds.items() if k in wanted}
        try:
            got = dict(zip(names, session.run([n for n in names if n in converted_names], cast)))
        except Exception as exc:
            check.problem = "onnxruntime cannot run the converted model: " + _last_line(str(exc))
            check.finite = False
            return
        for name in names:
            if name not in got:
                continue
            a = np.asarray(ref[name])
            b = np.asarray(got[name])
            if a.dtype.kind != "f":
                error = max(error, 0.0 if np.array_equal(a, b) else math.inf)
                continue
            a, b = a.astype(np.float64), b.astype(np.float64)
            ok = np.isfinite(a)
            if np.any(ok & ~np.isfinite(b)):
                finite = False
            both = ok & np.isfinite(b)
            if both.any():
                top = float(np.max(np.abs(a[both])))
                diff = float(np.max(np.abs(a[both] - b[both])))
                error = max(error, diff / top if top > 0 else diff)
    check.finite = finite
    check.error = error if finite else math.inf


def _as(array: np.ndarray, onnx_type: str) -> np.ndarray:
    """A batch's array in the dtype the converted model's input now has (float16 where keep_io_types=False)."""
    if onnx_type == "tensor(float16)":
        return np.asarray(array).astype(np.float16)
    if onnx_type == "tensor(float)":
        return np.asarray(array).astype(np.float32)
    return np.asarray(array)
