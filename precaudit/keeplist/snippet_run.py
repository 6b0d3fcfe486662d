"""Every keep-list snippet checked as printed: the real converter runs it (where it is installed, in a child
Python), onnxruntime loads the model it writes (in another child: a converted model has crashed onnxruntime, and
keep-list must outlive that), a static audit of that model looks for error findings, and, with inputs, the
converted model runs on them against the original's float32 outputs.

The snippet run is the printed one but for the path it saves to (a scratch folder: the user's folder gets nothing).
It runs with `python -I`: no current folder or user site on sys.path, so a module file beside the model cannot
stand in for the converter. The names in it are Python literals (repr), so a model's names cannot run code there.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..converters import KeepArgs
from .child import run_child

if TYPE_CHECKING:
    from ..runtime import Runtime

__all__ = ["RUNNABLE", "SnippetCheck", "Written", "check_snippet"]

# --for → the module the snippet imports: its converter is installed when this is found
RUNNABLE = {"onnxruntime": "onnxruntime.transformers.onnx_model", "onnxconverter-common": "onnxconverter_common",
            "openvino": "openvino"}


@dataclass
class SnippetCheck:
    """What running the printed snippet showed."""

    ran: bool  # the real converter ran it
    how: str  # which converter ran it, or why it did not run
    loads: bool | None = None  # onnxruntime accepted the model it wrote (None: not known, it crashed or never ran)
    problem: str | None = None  # what failed, in one line
    errors: list[str] = field(default_factory=list)  # error findings of a static audit of the written model
    finite: bool | None = None  # on the inputs: every output finite where the float32 reference is
    error: float | None = None  # largest output error over the output's largest |value|, on the inputs
    inputs: str = ""
    crashed: int | None = None  # the signal that ended onnxruntime loading or running the converted model
    loader: str = "onnxruntime"  # what loads the converted model (OpenVINO reads the IR its snippet writes)
    # why the model the snippet wrote could not be run here, though the snippet ran and its model was checked
    # ("Core ML predicts on macOS only"): keep-list exits 3, as for a snippet it could not run
    unverified: str | None = None

    @property
    def ok(self) -> bool:
        return (self.ran and bool(self.loads) and not self.errors and self.finite is not False
                and self.problem is None)

    def within(self, tolerance: float) -> bool:
        return self.ok and (self.error is None or self.error <= tolerance)

    def record(self) -> dict:
        return {f.name: getattr(self, f.name) if f.name != "error" or self.error is None or math.isfinite(self.error)
                else None for f in dataclasses.fields(self)}


@dataclass
class Written:
    """What a runtime target's check asks of the model its snippet writes, besides loading: the runtime it is
    audited for, the module the snippet imports, and the nodes that must read only float32 there (None: not asked)."""

    runtime: Runtime | None = None
    module: str | None = None
    kept: list[str] | None = None


def check_snippet(target_for: str, args: KeepArgs, render, target, rules, batches: list[dict[str, np.ndarray]] | None,
                  inputs: str, reference_model: str, not_fixed: frozenset[tuple[str, str]] = frozenset(),
                  written: Written | None = None) -> SnippetCheck:
    """Run the snippet render(args) makes for this target. render is the keep-list's snippet function; not_fixed
    holds (rule id, node name) of the error findings no float32 node fixes (an eps of inf): the list never claimed
    them, the report says them apart, and the converted model still having them does not fail the snippet."""
    written = written or Written()
    module = written.module or RUNNABLE.get(target_for)
    if module is None:
        return SnippetCheck(False, _NOT_RUN.get(target_for) or
                            f"not run: {target_for}'s snippet is not a Python script precaudit can run here")
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return SnippetCheck(False, f"not run: {module.split('.')[0]} is not installed, so the snippet was checked "
                                   "against precaudit's model of the converter only")
    with tempfile.TemporaryDirectory(prefix="precaudit-snippet-") as folder:
        out = os.path.join(folder, "converted.xml" if target_for == "openvino" else "converted.onnx")
        script = os.path.join(folder, "snippet.py")
        with open(script, "w", encoding="utf-8") as fh:
            fh.write(render(dataclasses.replace(args, out_path=out, in_memory=False)) + "\n")  # (reads the file)
        check = SnippetCheck(True, f"ran with the installed {module.split('.')[0]}", inputs=inputs)
        proc = run_child([script], check, "the snippet did not finish", cwd=os.getcwd())
        if proc is None:
            return check
        if proc.returncode != 0 or not os.path.exists(out):
            check.problem = "the snippet failed: " + _last_line(proc.stderr)
            return check
        if target_for == "openvino":  # an IR, read and checked by OpenVINO itself
            from .snippet_openvino import check_ir

            check.loader = "OpenVINO"
            check_ir(out, dict(zip(args.nodes, args.outputs)), check)
            if check.problem is not None:
                check.problem = check.problem.replace(out, "the IR").replace(folder, "a scratch folder")
            return check
        reference = _reference(reference_model, batches or [], check)
        outputs = _run_converted(out, folder, batches or [], list(reference[0]) if reference else [], check)
        if check.problem is not None:  # the scratch path means nothing to the user
            check.problem = check.problem.replace(out, "the converted model").replace(folder, "a scratch folder")
        if not check.loads:
            return check
        check.errors = _error_findings(out, target, rules, not_fixed, check, written.runtime)
        if written.kept is not None and check.problem is None:
            from .casts import check_written

            check_written(out, written.kept, check, written.runtime.title if written.runtime else target_for)
            if check.problem is not None:
                check.problem = check.problem.replace(out, "the written model")
        if reference and outputs is not None:
            _compare(check, reference, outputs)
    return check


# why a target's snippet is not run here, where that is more than "not a script precaudit can run"
_NOT_RUN = {"qnn": "not run: no HTP here, and no QNN option keeps a node in float32 there: the list is where to split "
                   "the model for the CPU execution provider"}


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no message"


def _one_line(text: str) -> str:
    """A message of several lines (onnxruntime's, onnx.checker's) as one line: the last line alone can be
    ' is not output of any previous nodes.'. onnxruntime's 'Load model from PATH failed:' goes (the path is the
    scratch file), so the rest fits."""
    return " ".join(re.sub(r"Load model from .*? failed:", "", text).split())[:400] or "no message"


# The child that loads and runs the converted model: argv is the model, the inputs (.npz, or - for none) and the
# file to write the outputs to. It says "loaded" once the session is made; exit 3 is a model onnxruntime refuses
# (its message on stderr), 4 a run that fails. Graph optimizations stay on, as the user's own session has them.
_RUNNER = """
import json, sys
import numpy as np
import onnxruntime as ort
model, feeds, outs = sys.argv[1:4]
options = ort.SessionOptions()
options.log_severity_level = 4
try:
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
except Exception as exc:
    sys.stderr.write(" ".join(str(exc).split()) or type(exc).__name__)
    sys.exit(3)
print("loaded", flush=True)
if feeds == "-":
    sys.exit(0)
plan = json.loads(open(feeds + ".json", encoding="utf-8").read())
data = np.load(feeds, allow_pickle=False)
types = {i.name: i.type for i in session.get_inputs()}
made = {o.name for o in session.get_outputs()}
wanted = [n for n in plan["outputs"] if n in made]
got = {}
for b, names in enumerate(plan["batches"]):
    fed = {}
    for k, name in enumerate(names):
        if name in types:
            a = data[f"b{b}_{k}"]
            kind = {"tensor(float16)": np.float16, "tensor(float)": np.float32}.get(types[name])
            fed[name] = a.astype(kind) if kind is not None and a.dtype.kind == "f" else a
    try:
        results = session.run(wanted, fed)
    except Exception as exc:
        sys.stderr.write(" ".join(str(exc).split()) or type(exc).__name__)
        sys.exit(4)
    got.update({f"b{b}_{k}": np.asarray(r) for k, r in enumerate(results)})
np.savez(outs, **got)
print(json.dumps(wanted), flush=True)
"""


def _run_converted(path: str, folder: str, batches: list[dict[str, np.ndarray]], names: list[str],
                   check: SnippetCheck) -> list[dict[str, np.ndarray]] | None:
    """Load the converted model in onnxruntime, in a child process, and run it on the batches: per batch, its
    outputs by name (None when it did not load or run). Fills check.loads, check.problem, check.crashed."""
    feeds, outs = "-", os.path.join(folder, "outputs.npz")
    if batches and names:
        feeds = os.path.join(folder, "inputs.npz")
        arrays: dict[str, np.ndarray] = {f"b{b}_{k}": np.asarray(v) for b, f in enumerate(batches)
                                         for k, v in enumerate(f.values())}
        np.savez(feeds, **arrays)  # type: ignore[arg-type]  # (numpy's stub takes the first keyword for allow_pickle)
        with open(feeds + ".json", "w", encoding="utf-8") as fh:
            json.dump({"batches": [list(f) for f in batches], "outputs": names}, fh)
    proc = run_child(["-c", _RUNNER, path, feeds, outs], check, "onnxruntime did not finish with the converted model")
    if proc is None:
        return None
    loaded = proc.stdout.startswith("loaded")
    check.loads = True if loaded else None
    if proc.returncode < 0:
        check.crashed = -proc.returncode
        check.problem = (f"onnxruntime crashed (signal {check.crashed}) "
                         f"{'running' if loaded else 'loading'} the converted model")
        return None
    if proc.returncode == 3:
        check.loads = False
        check.problem = "onnxruntime refuses the model the snippet writes: " + _one_line(proc.stderr)
        return None
    if proc.returncode != 0:
        check.problem = "onnxruntime cannot run the converted model: " + _one_line(proc.stderr or proc.stdout)
        check.finite = False
        return None
    if feeds == "-":
        return None
    wanted = json.loads(proc.stdout.strip().splitlines()[-1])
    with np.load(outs, allow_pickle=False) as data:
        return [{name: data[f"b{b}_{k}"] for k, name in enumerate(wanted)} for b in range(len(batches))]


def _error_findings(path: str, target, rules, not_fixed: frozenset[tuple[str, str]], check: SnippetCheck,
                    runtime: Runtime | None = None) -> list[str]:
    """The error findings of a static audit of the converted model, as it is stored (it runs as written), but for
    those the list does not claim to fix. A model precaudit cannot read is a problem of the check, said in one line
    (never an error about a scratch file the user never gave)."""
    from ..audit_models import load_graph, static_matches
    from ..deployment import Deployment
    from ..errors import InputError

    try:
        graph = load_graph(path, None, target.name)
    except InputError as exc:
        check.problem = "precaudit cannot read the converted model: " + exc.problem.replace(path, "it")
        return []
    resolver = Deployment(target, runtime=runtime).resolver(graph)  # it runs as stored, on the runtime if named
    found = [m.finding for m in static_matches(graph, resolver, rules, path, weights=False)]
    return [f"{f.rule_id} {f.rule_name} at '{f.node_name}'" for f in found
            if f.severity == "error" and (f.rule_id, f.node_name) not in not_fixed]


def _reference(model: str, batches: list[dict[str, np.ndarray]], check: SnippetCheck
               ) -> tuple[dict[str, None], list[dict[str, np.ndarray]]] | None:
    """The original's float32 outputs on each batch (onnxruntime, no fusions): (its output names, the runs)."""
    if not batches:
        return None
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        check.problem = "onnxruntime cannot run the original model: " + _one_line(str(exc))
        return None
    names = [o.name for o in session.get_outputs()]
    known = {i.name for i in session.get_inputs()}
    runs = [dict(zip(names, session.run(names, {k: v for k, v in f.items() if k in known}))) for f in batches]
    return dict.fromkeys(names), runs


def _compare(check: SnippetCheck, reference: tuple[dict[str, None], list[dict[str, np.ndarray]]],
             converted: list[dict[str, np.ndarray]]) -> None:
    """The converted model's outputs on each batch against the original's in float32."""
    finite, error = True, 0.0
    for ref, got in zip(reference[1], converted):
        for name, b in got.items():
            a = np.asarray(ref[name])
            if a.dtype.kind != "f":
                error = max(error, 0.0 if np.array_equal(a, b) else math.inf)
                continue
            a, b = a.astype(np.float64), np.asarray(b).astype(np.float64)  # noqa: PLW2901 -- compared in float64
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
