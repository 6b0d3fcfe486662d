"""The Python API: the audit the command line runs, called from a notebook or a pytest suite.

    import precaudit
    report = precaudit.audit("model.onnx", dtype="bf16")
    assert report.ok, report.to_text()

audit() takes what `precaudit check` takes, as keyword arguments, and returns a Report that renders itself in every
format the command line writes (and as HTML in a notebook). keep_list() and fix() are `precaudit keep-list` and
`precaudit fix`. They run the same pass as the commands: the same rules, inline suppressions, per-model and
per-node ignores, baseline and converter model.

Errors: every argument is checked before any model is read, by the same check the command line's flag and the
pyproject's key get: a wrong type or value (an unknown dtype, samples=0 or samples=True, a rule file that does not
load, a selector that names no rule) raises precaudit.InputError, one line naming the argument (or the file) and
saying what is allowed. A model that cannot be audited (a broken file, a factory that raises) is an entry in
Report.errors, and Report.exit_code is then 2, as on the command line.

Lists (select, ignore, keep_fp32, rules) are lists or tuples of strings (rules: of paths, str or os.PathLike). A bare
string is refused, not taken as one item: select="PA1" would otherwise be read as the selectors "P", "A", "1"; write
select=["PA1"]. Paths are a str or an os.PathLike.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InputError
from .options import argument, check_bool, check_choice, check_int, check_number, check_path, check_paths, shown

if TYPE_CHECKING:
    from .checkpoint import ScanReport
    from .finding import Finding
    from .fixer.run import FixResult
    from .keeplist import KeepList
    from .report.outcome import Outcome

__all__ = ["InputError", "Report", "audit", "fix", "keep_list", "scales", "train_audit"]


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
        """The text report, and why each model that could not be audited could not (the command line says that on
        stderr, one line each)."""
        from .escape import printable
        from .report import render

        text = render(self.outcome, "text", color=check_bool(color, "color"), group=check_bool(group, "group"))
        return text + "".join(f"could not audit {printable(str(e))}\n" for e in self.errors)

    def to_json(self) -> str:
        from .report import render
        return render(self.outcome, "json")

    def to_dict(self) -> dict:
        from .report.json import report_document
        return report_document(self.outcome)

    def to_sarif(self) -> str:
        from .report import render
        return render(self.outcome, "sarif")

    def to_html(self) -> str:
        from .report import render
        return render(self.outcome, "html")

    def to_junit(self) -> str:
        from .report import render
        return render(self.outcome, "junit")

    def to_github(self) -> str:
        from .report import render
        return render(self.outcome, "github")

    def _repr_html_(self) -> str:  # a notebook shows the report inline: a fragment whose styles touch only itself
        from .report.html import render_html_fragment

        return render_html_fragment(self.outcome)

    def __repr__(self) -> str:
        counts = {s: sum(1 for f in self.outcome.result.findings if f.severity == s) for s in ("error", "warning")}
        return (f"<precaudit.Report {len(self.models)} model(s), {len(self.outcome.result.findings)} findings "
                f"({counts['error']} errors, {counts['warning']} warnings), exit code {self.exit_code}>")


def audit(model: Any, dtype: str = "fp16", *, select: Sequence[str] | None = None,
          ignore: Sequence[str] | None = None, keep_fp32: Sequence[str] = (), converter: str | None = None,
          runtime: str | None = None, autocast: str | None = None, trace: Any = None, config: str | os.PathLike | None = "pyproject",
          baseline: str | os.PathLike | None = None, fail_on: str | None = None,
          rules: Sequence[str | os.PathLike] = (), preview: bool | None = None, check_weights: bool | None = None,
          example_inputs: Any = None, trust_pickle: bool = False) -> Report:
    """Audit one model, or several (a list of paths), against dtype.

    model: a path (an .onnx file, model.py:factory, package.module:factory, a .pt2 or TorchScript file), a list of
    paths, an onnx.ModelProto, or a torch.nn.Module with example_inputs: a tensor, a tuple of positional inputs, a
    dict of keyword inputs, or both as `((x,), {"mask": m})` (what a factory returns after the module).
    trace: None/False for a static audit; True for traced mode on synthesized inputs; a path or a list of paths of
    .npz batches; or a dict of TraceOptions fields (inputs, samples, dims, seed, engine, ranges, timeout).
    config: "pyproject" finds the nearest [tool.precaudit] as the command line does; None reads none; a path reads
    that pyproject.toml. Keyword arguments override it as flags do. Lists: see the module's docstring.
    """
    from .context import Audit
    from .options import TorchOptions
    from .pipeline import run_audit

    _check_model(model, ("path", "paths", "proto", "module"))
    _check_example_inputs(model, example_inputs)
    trust_pickle = check_bool(trust_pickle, "trust_pickle")
    trace_options = _trace_options(trace, "trace")
    settings = _settings({"dtype": dtype, "keep_fp32": keep_fp32, "rules": rules, "select": select,
                          "ignore": ignore, "preview": preview, "fail_on": fail_on, "baseline": baseline,
                          "check_weights": check_weights, "converter": converter, "autocast": autocast,
                          "runtime": runtime}, config)
    context = _noted(Audit.of(settings, TorchOptions(trust_pickle=trust_pickle), trace_options,
                              trace_options is not None))
    with _as_paths(model, example_inputs) as (paths, shown_as):
        outcome = run_audit(context, paths)
        _rename(outcome, shown_as)
    return Report(outcome)


def keep_list(model: Any, for_: str, dtype: str = "fp16", *, keep_fp32: Sequence[str] = (), runtime: str | None = None,
              trace: Any = None, example_inputs: Any = None,
              tolerance: float = 1e-2, max_runs: int = 30, config: str | os.PathLike | None = "pyproject",
              rules: Sequence[str | os.PathLike] = (), policy: str | None = None) -> KeepList:
    """`precaudit keep-list MODEL --for CONVERTER`: the nodes to keep in float32, the converter's arguments
    (KeepList.code()), its verdict (.verified, .exit_code). model: a path, an onnx.ModelProto (the snippet then
    takes it as the variable `model`), or a torch.nn.Module with example_inputs, as audit() takes them (for
    pytorch or torch-tensorrt). tolerance: a finite number above 0; max_runs: a whole number >= 1; policy: minimal
    or safe, the traced list returned (None: minimal on inputs given, safe on synthesized ones)."""
    from .context import Audit
    from .keeplist import FOR_TARGETS
    from .keeplist.command import build_checked

    _check_model(model, ("path", "proto", "module"))
    _check_example_inputs(model, example_inputs)
    # build_checked checks these too, but only once a ModelProto has been written to a scratch file
    for_ = check_choice(for_, FOR_TARGETS, "for_")
    tolerance = check_number(tolerance, "tolerance", minimum=0.0, above=True)
    max_runs = check_int(max_runs, "max_runs", 1)
    if policy is not None:
        from .keeplist import POLICIES

        policy = check_choice(policy, POLICIES, "policy")
    trace_options = _trace_options(trace, "trace")
    settings = _settings({"dtype": dtype, "keep_fp32": keep_fp32, "rules": rules, "runtime": runtime}, config)
    context = _noted(Audit.of(settings, inputs=trace_options, traced=trace_options is not None))
    with _as_paths(model, example_inputs) as (paths, shown_as):
        keep = build_checked(context, paths[0], for_, tolerance, max_runs, policy=policy)
    keep.shown = shown_as.get(paths[0])
    keep.in_memory = _is_proto(model)
    return keep


def fix(model: Any, output: str | os.PathLike | None = None, dtype: str = "fp16", *,
        dry_run: bool = False, inputs: Any = None, tolerance: float = 1e-3, data_floor: str | float = "keep",
        min_eps: float | None = None, keep_fp32: Sequence[str] = (), converter: str | None = None,
        runtime: str | None = None, select: Sequence[str] | None = None, ignore: Sequence[str] | None = None,
        trace: bool = False, check_weights: bool | None = None,
        config: str | os.PathLike | None = "pyproject", rules: Sequence[str | os.PathLike] = ()) -> FixResult:
    """`precaudit fix MODEL -o OUTPUT` (model a path or an onnx.ModelProto): repair, gate each repair on the float32
    change it makes on `inputs` (a path or list of .npz batches, or TraceOptions fields as a dict; None:
    synthesized), write OUTPUT only after every check; FixResult.exit_code says what the command line would exit
    with. data_floor: keep, subnormal, normal or a
    number; min_eps, tolerance and data_floor are checked against dtype before the model is read. trace and
    check_weights run those parts of the audit too: fix repairs none of their findings, and an error among them
    is left (FixResult.measured) and makes the exit code 1."""
    from .context import Audit
    from .fixer.command import run_checked
    from .options import TraceOptions

    _check_model(model, ("path", "proto"))
    output = None if output is None else check_path(output, "output")
    dry_run, trace = check_bool(dry_run, "dry_run"), check_bool(trace, "trace")
    if isinstance(inputs, bool):  # trace= switches traced mode on; inputs= says which inputs the checks run on
        raise InputError(None, f"inputs: must be .npz paths or a dict of TraceOptions fields, got {inputs}")
    options = _trace_options(inputs, "inputs") or TraceOptions()
    settings = _settings({"dtype": dtype, "keep_fp32": keep_fp32, "rules": rules, "select": select,
                          "ignore": ignore, "converter": converter, "runtime": runtime,
                          "check_weights": check_weights}, config)
    # run_checked checks min_eps, tolerance and data_floor, named as settings.named names them, before the model
    context = _noted(Audit.of(settings, inputs=options, traced=trace))
    with _as_paths(model, None) as (paths, shown_as):
        result = run_checked(context, paths[0], output, dry_run, min_eps, tolerance, data_floor)
    result.model = shown_as.get(paths[0], result.model)
    return result


def scales(checkpoint: str | os.PathLike) -> ScanReport:
    """`precaudit scales CHECKPOINT`: a quantized safetensors checkpoint's scales checked from its headers and scale
    tensors alone (precaudit.checkpoint.scan); bad input raises InputError."""
    from .checkpoint import scan

    return scan(check_path(checkpoint, "checkpoint"))


# ---- the arguments as the pipeline takes them ------------------------------------------------------------------

def _noted(audit):
    """A runtime version judged as the nearest modelled one is said as a warning (the command line's stderr line)."""
    import warnings

    for note in audit.notes:
        warnings.warn(note, UserWarning, stacklevel=3)
    return audit


def _settings(given: dict, config: Any):
    """The pyproject that config names under the arguments given (None and empty lists: not given), each checked by
    config.check_setting as its flag and its pyproject key are, and named as the argument."""
    from .config import load_settings

    chosen = {k: v for k, v in given.items() if v is not None and not (isinstance(v, (list, tuple)) and not v)}
    if isinstance(config, str) and config == "pyproject":
        return load_settings(chosen, named=argument)
    if config is not None and not isinstance(config, (str, os.PathLike)):
        raise InputError(None, f'config: must be "pyproject", None or the path of a pyproject.toml, got '
                               f'{shown(config)}')
    path = None if config is None else Path(check_path(config, "config"))
    return load_settings(chosen, config=path, named=argument)


def _trace_options(value: Any, name: str):
    """trace= (or fix's inputs=) as TraceOptions: every field checked, and named as the caller wrote it
    (trace['samples'])."""
    from .options import TraceOptions, check_trace_option

    if value is None or value is False:
        return None
    if value is True:
        return TraceOptions()
    if isinstance(value, (str, os.PathLike)):
        return TraceOptions(inputs=[check_path(value, name)])
    if isinstance(value, (list, tuple)):
        return TraceOptions(inputs=check_paths(value, name))
    if isinstance(value, TraceOptions):  # checked again: its fields may have been changed since it was made
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if not isinstance(value, dict):
        raise InputError(None, f"{name}: must be True, .npz paths or a dict of TraceOptions fields, got "
                               f"{type(value).__name__}")
    known = [f.name for f in dataclasses.fields(TraceOptions)]
    unknown = [k for k in value if k not in known]
    if unknown:
        raise InputError(None, f"{name}: unknown option {shown(unknown[0])} (choose from {', '.join(sorted(known))})")
    return TraceOptions(**{k: check_trace_option(k, v, f"{name}[{k!r}]") for k, v in value.items()})


_KINDS = {"path": "a path", "paths": "a list of paths", "proto": "an onnx.ModelProto", "module": "a torch.nn.Module"}


def _check_model(model: Any, accepts: tuple[str, ...]) -> None:
    """model is one of the kinds the function accepts; a path is a str or an os.PathLike, never empty."""
    if isinstance(model, (str, os.PathLike)):
        check_path(model, "model")
    elif isinstance(model, (list, tuple)) and "paths" in accepts:
        if not check_paths(model, "model"):
            raise InputError(None, "model: an empty list names no model")
    elif not ("proto" in accepts and _is_proto(model)) and not ("module" in accepts and _is_module(model)):
        kinds = [_KINDS[k] for k in accepts]
        raise InputError(None, f"model: expected {', '.join(kinds[:-1])} or {kinds[-1]}, got {type(model).__name__}")


def _check_example_inputs(model: Any, example_inputs: Any) -> None:
    """An nn.Module needs example_inputs, as a factory returns them (torch_objects.call_inputs), of tensors; any other
    model has its own inputs."""
    if not _is_module(model):
        if example_inputs is not None:
            raise InputError(None, "example_inputs: only a torch.nn.Module model takes them (a path or an ONNX model "
                                   "has its own inputs)")
        return
    import torch

    from .frontends.torch_objects import call_inputs

    args, kwargs = call_inputs("example_inputs", example_inputs)
    if example_inputs is None or not all(isinstance(t, torch.Tensor) for t in (*args, *kwargs.values())):
        raise InputError(None, f"example_inputs: auditing an nn.Module needs example_inputs= (a tensor, a tuple of "
                               f"positional inputs, a dict of keyword inputs, or both as ((...), {{...}})), got "
                               f"{type(example_inputs).__name__}")


class _as_paths:
    """The model as the pipeline reads it (checked by _check_model): paths as they are; an onnx.ModelProto saved into
    a scratch folder; an nn.Module registered for the torch frontend under a name of its own. Findings name the
    object, not the file."""

    def __init__(self, model: Any, example_inputs: Any):
        self.model, self.example_inputs = model, example_inputs
        self._folder: tempfile.TemporaryDirectory | None = None
        self._registered: str | None = None

    def __enter__(self) -> tuple[list[str], dict[str, str]]:
        model = self.model
        if isinstance(model, (str, os.PathLike)):
            return [os.fspath(model)], {}
        if isinstance(model, (list, tuple)):
            return [os.fspath(m) for m in model], {}
        if _is_proto(model):
            self._folder = tempfile.TemporaryDirectory(prefix="precaudit-")
            path = os.path.join(self._folder.name, "model.onnx")
            with open(path, "wb") as fh:
                fh.write(model.SerializeToString())
            name = model.graph.name or "model"
            return [path], {path: f"<onnx.ModelProto {name}>"}
        from .frontends.torch_objects import register_module

        self._registered = register_module(model, self.example_inputs)
        return [self._registered], {self._registered: f"<{type(model).__name__}>"}

    def __exit__(self, *exc) -> None:
        if self._folder is not None:
            self._folder.cleanup()
        if self._registered is not None:
            from .frontends.torch_objects import unregister_module
            unregister_module(self._registered)


def _is_proto(model: Any) -> bool:
    return type(model).__name__ == "ModelProto" and hasattr(model, "SerializeToString")


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
                ignore: Sequence[str] | None = None, rules: Sequence[str | os.PathLike] = (), fail_on: str = "error",
                baseline: str | os.PathLike | None = None, timeout: float = 1800.0) -> Report:
    """`precaudit train`: a factory spec ("model.py:make"), or the model (a torch.nn.Module) with its inputs (and
    loss_fn, optimizer) as objects. Returns a Report; a model that cannot be audited is in Report.errors (exit code
    2). select, ignore, rules, fail_on and baseline are checked as audit() checks them.

    The training options are checked as the command line checks them, before anything runs: one that cannot work
    (lr nan, steps 2.5) raises InputError, naming it as the command line spells it (--lr). A factory spec runs in a
    process of its own, as on the command line: stopped after timeout seconds (0: no limit), its prints on stderr, an
    exit or crash in it an entry in Report.errors; from a script, call it under `if __name__ == "__main__":`, as any
    multiprocessing code (the worker imports the script's module). Objects run in this process, without a time
    limit: they are yours, already running here, and would have to be pickled to go anywhere else."""
    from .config import check_setting
    from .pipeline import run_train_audit
    from .train.audit import TrainOptions

    spec = check_path(model, "model") if isinstance(model, (str, os.PathLike)) else None
    if spec is None and not _is_module(model):
        raise InputError(None, f"model: expected a factory spec (model.py:make) or a torch.nn.Module, got "
                               f"{type(model).__name__}")
    shared = {name: check_setting(name, value, name) for name, value in
              {"select": select, "ignore": ignore, "rules": rules, "fail_on": fail_on, "baseline": baseline}.items()
              if value is not None}
    options = TrainOptions(regime=regime, trace=trace, steps=steps, seed=seed, loss_scale=loss_scale, lr=lr,
                           timeout=timeout, **shared)
    if spec is not None:
        return Report(run_train_audit(spec, options))
    made = (model, inputs, loss_fn, optimizer)
    return Report(run_train_audit(f"<{type(model).__name__} object>", options, made=made))
