"""One audit run from resolved settings to an Outcome: select the rules, audit each model, drop what the ignores
and the baseline hide, decide the exit code. The command line and the Python API both call run_audit."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .context import Audit
    from .report.outcome import Outcome

__all__ = ["EXIT_CLEAN", "EXIT_ERROR", "EXIT_FINDINGS", "exit_code_of", "run_audit"]

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def run_audit(audit: Audit, models: list[str], write_to: str | None = None, exit_zero: bool = False, jobs: int = 1,
              debug: bool = False) -> Outcome:
    """Audit the models, drop ignored and baselined findings, and decide the exit code. A model that cannot be
    audited is an entry in outcome.result.errors (exit 2), never an exception."""
    from .baseline import apply_baseline, write_baseline
    from .parallel import audit_in_parallel
    from .report.locations import repo_root
    from .report.outcome import Outcome
    from .result import AuditResult

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
