"""One audit run from resolved settings to an Outcome: select the rules, audit each model, drop what the ignores
and the baseline hide, decide the exit code. The command line and the Python API both call run_audit, and
run_train_audit for a training factory."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import InputError
from .result import AuditResult

if TYPE_CHECKING:
    from .context import Audit
    from .report.outcome import Outcome
    from .train.audit import TrainOptions

__all__ = ["EXIT_CLEAN", "EXIT_ERROR", "EXIT_FINDINGS", "exit_code_of", "run_audit", "run_train_audit"]

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def run_audit(audit: Audit, models: list[str], write_to: str | None = None, exit_zero: bool = False, jobs: int = 1,
              debug: bool = False) -> Outcome:
    """Audit the models, drop ignored and baselined findings, and decide the exit code. A model that cannot be
    audited is an entry in outcome.result.errors (exit 2), never an exception."""
    from .baseline import apply_baseline, write_baseline
    from .parallel import audit_in_parallel
    from .report.locations import repo_root
    from .report.outcome import Outcome

    settings = audit.settings
    result = audit_in_parallel(models, jobs, debug, audit.inputs.timeout, deployment=audit.deployment, rules=audit.rules,
                               torch_options=audit.torch, trace=audit.trace, check_weights=settings.check_weights,
                               dtype_maps=settings.format == "html", dims=audit.dims, strict_dims=len(models) == 1)
    kept = audit.ignored(result.findings)
    if write_to is not None:
        write_baseline(write_to, kept, may_replace=(settings.baseline,) if settings.baseline else ())
    match = apply_baseline(settings.baseline, kept, result.models) if settings.baseline else None
    counted = match.new if match else kept

    accepted = exit_zero or write_to is not None  # a written baseline accepts what it holds
    code = exit_code_of(counted, bool(result.errors), settings.fail_on, accepted)
    report_settings = {"dtype": audit.deployment.fmt.name, "fail_on": settings.fail_on,
                       "keep_fp32": settings.keep_fp32, "rules": settings.rules, "format": settings.format,
                       "select": settings.selected, "ignore": settings.ignored, "preview": settings.preview,
                       "baseline": settings.baseline, "check_weights": settings.check_weights or audit.traced,
                       "converter": settings.converter, "autocast": settings.autocast,
                       "runtime": audit.deployment.runtime.spelled if audit.deployment.runtime else None,
                       "config_file": settings.config_file}
    return Outcome(result=AuditResult(counted, result.errors, result.models, result.traces, result.dtype_maps,
                                      result.quantized),
                   settings=report_settings,
                   exit_code=code, rules=audit.rules, root=repo_root(), ignored=len(result.findings) - len(kept),
                   baseline=match, written_to_baseline=len(kept) if write_to is not None else 0)


def exit_code_of(counted: list, errors: bool, fail_on: str, accepted: bool = False) -> int:
    """2 when a model could not be audited; 1 when a finding counted is at fail_on or worse (and not accepted)."""
    from .finding import severity_rank

    threshold = severity_rank(fail_on) if fail_on != "never" else 99
    failing = any(severity_rank(f.severity) >= threshold for f in counted)
    return EXIT_ERROR if errors else EXIT_FINDINGS if failing and not accepted else EXIT_CLEAN


def run_train_audit(spec: str, options: TrainOptions, made: Any = None, debug: bool = False,
                    audit: Audit | None = None):
    """The Outcome of auditing one training factory (or, from the API, what a factory would have returned).

    audit: the run's context as check has it (the [tool.precaudit] table under the flags: rules, selectors,
    per-model and per-node ignores, baseline, fail-on); without one, options' own select, ignore, rules, fail_on and
    baseline, and no configuration file.
    A factory spec is imported, called and stepped in a worker process with options.timeout: what it prints goes
    to stderr, and an exit, a fork, a crash or a hang in it is one error. Objects (made) run here, in the caller's
    process, without a time limit: they are the caller's own, already running, and would have to be pickled."""
    from .report.locations import repo_root
    from .report.outcome import Outcome
    from .train.audit import audit_training, checked
    from .train.regimes import regime_named

    options.validate()
    regime = regime_named(options.regime)
    if audit is None:
        audit = _context_of(options)
    rules = audit.rules
    options.fail_on, options.baseline = audit.settings.fail_on, audit.settings.baseline
    result = AuditResult()
    try:
        if made is None:  # the user's code runs in a worker of its own (parallel.run_isolated says why)
            from .parallel import run_isolated

            findings, gradients = run_isolated(audit_training, (spec, regime, options, rules, None), spec,
                                               "running the factory and its step", options.timeout or None, debug,
                                               preload="precaudit.train.step")
        else:
            findings, gradients = audit_training(spec, regime, options, rules, made)
        result.findings = audit.ignored(findings)
        if gradients is not None:
            result.gradients[spec] = gradients
        result.models.append(spec)
    except InputError as exc:
        result.errors.append(exc)
    except (Exception, SystemExit) as exc:
        if debug:
            import traceback

            traceback.print_exc()
        from .audit_models import _internal_error
        result.errors.append(_internal_error(spec, exc))
    counted = result.findings
    match = None
    if options.baseline:
        from .baseline import apply_baseline
        match = apply_baseline(options.baseline, counted, result.models)
        counted = match.new
        result.findings = counted
    code = exit_code_of(counted, bool(result.errors), options.fail_on)
    settings = {"dtype": regime.low, "regime": regime.name, "regime_summary": regime.summary,
                "fail_on": options.fail_on, "trace": options.trace, "steps": options.steps,
                "select": options.select, "ignore": options.ignore, "rules": options.rules,
                "baseline": options.baseline, "preview": options.preview, "keep_fp32": [], "format": "text",
                "check_weights": True, "converter": "plain", "autocast": "cuda" if regime.autocast else None,
                "config_file": audit.settings.config_file,
                # nothing was checked where the factory or its step failed (the error says why)
                "checked": checked(rules, options, regime, result.gradients.get(spec)) if result.models else None}
    return Outcome(result=result, settings=settings, exit_code=code, rules=rules, root=repo_root(), baseline=match)


def _context_of(options: TrainOptions) -> Audit:
    """The audit context of options' own select, ignore, rules, fail_on and baseline, with no configuration file."""
    from .config import load_settings
    from .context import Audit

    given = {"select": options.select, "ignore": options.ignore, "rules": options.rules, "fail_on": options.fail_on,
             "baseline": options.baseline, "preview": options.preview}
    return Audit.of(load_settings({k: v for k, v in given.items() if v not in (None, [], False)}, config=None))
