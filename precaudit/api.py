"""The Python API: the audit the command line runs, called from a notebook or a pytest suite.

    import precaudit
    report = precaudit.audit("model.onnx", dtype="bf16")
    assert report.ok, report.to_text()

audit() takes what `precaudit check` takes, as keyword arguments, and returns a Report that renders itself in every
format the command line writes (and as HTML in a notebook). keep_list() and fix() are `precaudit keep-list` and
`precaudit fix`. They run the same pass as the commands: the same rules, inline suppressions, per-model and
per-node ignores, baseline and converter model.

Errors: arguments that cannot work (an unknown dtype, a rule file that does not load, a selector that names no
rule) raise precaudit.InputError, with the file and the problem. A model that cannot be audited (a broken file, a
factory that raises) is an entry in Report.errors, and Report.exit_code is then 2, as on the command line.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from .errors import InputError

if TYPE_CHECKING:
    from .finding import Finding
    from .fixer.run import FixResult
    from .keeplist import KeepList
    from .report.outcome import Outcome

__all__ = ["audit", "keep_list", "fix", "train_audit", "Report", "InputError"]


@dataclass
class Report:
    """One audit: its findings (those that count: not ignored, not in the baseline), the models audited, the models
    that could not be, and the exit code the command line would give."""

    outcome: Outcome = field(repr=False)

    @property
    def findings(self) -> list[Finding]:
        return list(self.outcome.result.findings)

    @property
    def models(self) -> list[str]:
        return list(self.outcome.result.models)

    @property
    def errors(self) -> list[InputError]:
        return list(self.outcome.result.errors)

    @property
    def exit_code(self) -> int:
        return self.outcome.exit_code

    @property
    def ok(self) -> bool:
        """Nothing at or above fail_on, and every model audited (exit code 0)."""
        return self.exit_code == 0

    def to_text(self, color: bool = False, group: bool = True) -> str:
        from .report.text import render_text
        return render_text(self.outcome, color=color, group=group)

    def to_json(self) -> str:
        from .report.json import render_json
        return render_json(self.outcome)

    def to_dict(self) -> dict:
        from .report.json import report_document
        return report_document(self.outcome)

    def to_sarif(self) -> str:
        from .report.sarif import render_sarif
        return render_sarif(self.outcome)

    def to_html(self) -> str:
        from .report.html import render_html
        return render_html(self.outcome)

    def to_junit(self) -> str:
        from .report.junit import render_junit
        return render_junit(self.outcome)

    def to_github(self) -> str:
        from .report.github import render_github
        return render_github(self.outcome)

    def _repr_html_(self) -> str:  # a notebook shows the HTML report inline
        return self.to_html()

    def __repr__(self) -> str:
        counts = {s: sum(1 for f in self.outcome.result.findings if f.severity == s) for s in ("error", "warning")}
        return (f"<precaudit.Report {len(self.models)} model(s), {len(self.outcome.result.findings)} findings "
                f"({counts['error']} errors, {counts['warning']} warnings), exit code {self.exit_code}>")


def audit(model: Any, dtype: str = "fp16", *, select: Sequence[str] | None = None,
          ignore: Sequence[str] | None = None, keep_fp32: Sequence[str] = (), converter: str | None = None,
          autocast: str | None = None, trace: Any = None, config: str | os.PathLike | None = "pyproject",
          baseline: str | None = None, fail_on: str | None = None, rules: Sequence[str] = (),
          preview: bool | None = None, check_weights: bool | None = None, example_inputs: Any = None,
          trust_pickle: bool = False) -> Report:
    """Audit one model, or several (a list of paths), against dtype.

    model: a path (an .onnx file, model.py:factory, package.module:factory, a .pt2 or TorchScript file), an
    onnx.ModelProto, or a torch.nn.Module with example_inputs (a tensor or a tuple of them).
    trace: None/False for a static audit; True for traced mode on synthesized inputs; a path or a list of paths of
    .npz batches; or a dict of TraceOptions fields (inputs, samples, dims, seed, engine, ranges).
    config: "pyproject" finds the nearest [tool.precaudit] as the command line does; None reads none; a path reads
    that pyproject.toml. Keyword arguments override it as flags do.
    """
    from .options import TorchOptions
    from .pipeline import run_audit

    given = {"dtype": dtype, "keep_fp32": list(keep_fp32), "rules": list(rules), "select": list(select or ()),
             "ignore": list(ignore or ()), "preview": preview, "fail_on": fail_on, "baseline": baseline,
             "check_weights": check_weights, "converter": converter, "autocast": autocast}
    settings = _settings(given, config)
    trace_options = _trace_options(trace)
    torch_options = TorchOptions(autocast=settings.autocast, trust_pickle=trust_pickle)
    with _as_paths(model, example_inputs) as (paths, shown):
        outcome = run_audit(paths, settings, None, False, torch_options, trace_options)
        _rename(outcome, shown)
    return Report(outcome)


def keep_list(model: Any, for_: str, dtype: str = "fp16", *, keep_fp32: Sequence[str] = (), trace: Any = None,
              tolerance: float = 1e-2, max_runs: int = 30, config: str | os.PathLike | None = "pyproject",
              rules: Sequence[str] = ()) -> KeepList:
    """`precaudit keep-list MODEL --for CONVERTER`: the nodes to keep in float32, the converter's arguments
    (KeepList.snippet()), its verdict (.verified, .exit_code); model a path or an onnx.ModelProto."""
    from .keeplist.command import build_checked

    settings = _settings({"dtype": dtype, "keep_fp32": list(keep_fp32), "rules": list(rules)}, config)
    with _as_paths(model, None) as (paths, _):
        return build_checked(paths[0], settings, for_, None, _trace_options(trace), tolerance, max_runs)


def fix(model: str | os.PathLike, output: str | os.PathLike | None = None, dtype: str = "fp16", *,
        dry_run: bool = False, inputs: Any = None, tolerance: float = 1e-3, data_floor: str = "keep",
        min_eps: float | None = None, keep_fp32: Sequence[str] = (), converter: str | None = None,
        select: Sequence[str] | None = None, ignore: Sequence[str] | None = None, trace: bool = False,
        config: str | os.PathLike | None = "pyproject", rules: Sequence[str] = ()) -> FixResult:
    """`precaudit fix MODEL -o OUTPUT`: repair, gate each repair on the float32 change it makes on `inputs` (a path
    or list of .npz batches, or TraceOptions fields as a dict), write OUTPUT only after every check;
    FixResult.exit_code says what the command line would exit with."""
    from .fixer.command import run_checked
    from .options import TraceOptions

    settings = _settings({"dtype": dtype, "keep_fp32": list(keep_fp32), "rules": list(rules),
                          "select": list(select or ()), "ignore": list(ignore or ()), "converter": converter},
                         config)
    options = _trace_options(inputs if inputs is not None else True) or TraceOptions()
    return run_checked(str(model), settings, None if output is None else str(output), dry_run, min_eps, options,
                       trace, tolerance, data_floor)


# ---- the arguments as the pipeline takes them ------------------------------------------------------------------

def _settings(given: dict, config: str | os.PathLike | None):
    from .config import load_settings

    chosen = {k: v for k, v in given.items() if v not in (None, [])}
    if config == "pyproject":
        return load_settings(chosen)
    return load_settings(chosen, config=None if config is None else Path(config))


def _trace_options(trace: Any):
    from .options import TraceOptions

    if trace is None or trace is False:
        return None
    if trace is True:
        return TraceOptions()
    if isinstance(trace, TraceOptions):
        return trace
    if isinstance(trace, (str, os.PathLike)):
        return TraceOptions(inputs=[str(trace)])
    if isinstance(trace, dict):
        known = set(TraceOptions.__dataclass_fields__)
        unknown = sorted(set(trace) - known)
        if unknown:
            raise InputError(None, f"trace: unknown option {unknown[0]!r} (choose from {', '.join(sorted(known))})")
        options = TraceOptions(**trace)
        options.inputs = [str(p) for p in options.inputs]
        return options
    if isinstance(trace, Iterable):
        return TraceOptions(inputs=[str(p) for p in trace])
    raise InputError(None, f"trace: expected True, .npz paths or a dict of options, got {type(trace).__name__}")


class _as_paths:
    """The model as the pipeline reads it: paths as they are; an onnx.ModelProto saved into a scratch folder; an
    nn.Module registered for the torch frontend under a name of its own. Findings name the object, not the file."""

    def __init__(self, model: Any, example_inputs: Any):
        self.model, self.example_inputs = model, example_inputs
        self._folder: tempfile.TemporaryDirectory | None = None
        self._registered: str | None = None

    def __enter__(self) -> tuple[list[str], dict[str, str]]:
        model = self.model
        if isinstance(model, (str, os.PathLike)):
            return [str(model)], {}
        if isinstance(model, (list, tuple)) and model and all(isinstance(m, (str, os.PathLike)) for m in model):
            return [str(m) for m in model], {}
        if type(model).__name__ == "ModelProto" and hasattr(model, "SerializeToString"):
            self._folder = tempfile.TemporaryDirectory(prefix="precaudit-")
            path = os.path.join(self._folder.name, "model.onnx")
            with open(path, "wb") as fh:
                fh.write(model.SerializeToString())
            name = model.graph.name or "model"
            return [path], {path: f"<onnx.ModelProto {name}>"}
        if _is_module(model):
            from .frontends.torch_objects import register_module

            if self.example_inputs is None:
                raise InputError(None, "auditing an nn.Module needs example_inputs= (a tensor or a tuple of them)")
            self._registered = register_module(model, self.example_inputs)
            return [self._registered], {self._registered: f"<{type(model).__name__}>"}
        raise InputError(None, f"model: expected a path, an onnx.ModelProto or a torch.nn.Module, got "
                               f"{type(model).__name__}")

    def __exit__(self, *exc) -> None:
        if self._folder is not None:
            self._folder.cleanup()
        if self._registered is not None:
            from .frontends.torch_objects import unregister_module
            unregister_module(self._registered)


def _is_module(model: Any) -> bool:
    import sys

    torch = sys.modules.get("torch")  # an nn.Module means torch is imported already
    return torch is not None and isinstance(model, torch.nn.Module)


def _rename(outcome: Outcome, shown: dict[str, str]) -> None:
    """Findings and errors name the object the caller passed, not the scratch file or registry key."""
    if not shown:
        return
    result = outcome.result
    result.findings = [dataclasses.replace(f, model=shown.get(f.model, f.model)) for f in result.findings]
    result.models = [shown.get(m, m) for m in result.models]
    result.traces = {shown.get(m, m): run for m, run in result.traces.items()}
    result.quantized = {shown.get(m, m): q for m, q in result.quantized.items()}
    result.dtype_maps = {shown.get(m, m): d for m, d in result.dtype_maps.items()}
    for error in result.errors:
        if error.file in shown:
            error.file = shown[error.file]


def train_audit(model: Any, inputs: Any = None, loss_fn: Any = None, optimizer: Any = None, *,
                regime: str = "amp-fp16", trace: bool = False, steps: int = 1, seed: int = 0,
                loss_scale: float | None = None, lr: float | None = None, select: Sequence[str] | None = None,
                ignore: Sequence[str] | None = None, rules: Sequence[str] = (), fail_on: str = "error",
                baseline: str | None = None) -> Report:
    """`precaudit train`: a factory spec ("model.py:make"), or the model with its inputs (and loss_fn, optimizer)
    as objects. Returns a Report; a model that cannot be audited is in Report.errors (exit code 2)."""
    from .train.audit import TrainOptions, run_train_audit

    options = TrainOptions(regime=regime, trace=trace, steps=steps, seed=seed, loss_scale=loss_scale, lr=lr,
                           select=list(select or ()), ignore=list(ignore or ()), rules=list(rules),
                           fail_on=fail_on, baseline=baseline)
    if isinstance(model, (str, os.PathLike)):
        return Report(run_train_audit(os.fspath(model), options))
    made = (model, inputs, loss_fn, optimizer)
    return Report(run_train_audit(f"<{type(model).__name__} object>", options, made=made))
