"""One audit run from resolved settings to an Outcome: select the rules, audit each model, drop what the ignores
and the baseline hide, decide the exit code. The command line and the Python API both call run_audit."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import InputError

if TYPE_CHECKING:
    from .config import Settings
    from .dtypes import Format
    from .options import TorchOptions, TraceOptions
    from .report.outcome import Outcome
    from .rules.loader import Rule

__all__ = ["run_audit", "target_of", "exit_code_of", "EXIT_CLEAN", "EXIT_FINDINGS", "EXIT_ERROR"]

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def target_of(settings: Settings) -> Format:
    """The target format; an unknown dtype names where it came from (a pyproject's was checked when read)."""
    from .dtypes import format_named

    try:
        return format_named(settings.dtype)
    except KeyError as exc:
        raise InputError(None, f"--dtype: {exc.args[0]}") from None


def run_audit(models: list[str], settings: Settings, write_to: str | None, exit_zero: bool,
              torch_options: TorchOptions, trace_options: TraceOptions | None, jobs: int = 1,
              debug: bool = False, dims: dict[str, int] | None = None) -> Outcome:
    """Select rules, audit, drop ignored and baselined findings, and decide the exit code. A model that cannot be
    audited is an entry in outcome.result.errors (exit 2), never an exception; bad settings raise InputError.
    dims (--dim) sizes symbolic dims for the static pass; traced mode's own are in trace_options."""
    from .result import AuditResult
    from .baseline import apply_baseline, write_baseline
    from .deployment import Deployment
    from .parallel import audit_in_parallel
    from .report.locations import repo_root
    from .report.outcome import Outcome
    from .rules.loader import load_rules
    from .selection import active_rules, drop_ignored

    target = target_of(settings)
    all_rules = load_rules(settings.rules)
    check_all_selectors(settings, all_rules)
    rule_set = active_rules(all_rules, settings.select, settings.ignore, settings.preview)
    deployment = Deployment.named(target, settings.converter, settings.keep_fp32)
    result = audit_in_parallel(models, jobs, debug, deployment=deployment, rules=rule_set,
                               torch_options=torch_options, trace=trace_options, check_weights=settings.check_weights,
                               dtype_maps=settings.format == "html",
                               dims=dims or (trace_options.dims if trace_options else None),
                               strict_dims=len(models) == 1)
    kept = drop_ignored(result.findings, {r.id: r for r in rule_set}, settings.per_model_ignores,
                        settings.per_node_ignores, settings.project_root)
    if write_to is not None:
        write_baseline(write_to, kept, may_replace=(settings.baseline,) if settings.baseline else ())
    match = apply_baseline(settings.baseline, kept, result.models) if settings.baseline else None
    counted = match.new if match else kept

    accepted = exit_zero or write_to is not None  # a written baseline accepts what it holds
    code = exit_code_of(counted, bool(result.errors), settings.fail_on, accepted)
    report_settings = {"dtype": target.name, "fail_on": settings.fail_on, "keep_fp32": settings.keep_fp32,
                       "rules": settings.rules, "format": settings.format, "select": settings.select,
                       "ignore": settings.ignore, "preview": settings.preview, "baseline": settings.baseline,
                       "check_weights": settings.check_weights or trace_options is not None,
                       "converter": settings.converter, "autocast": settings.autocast,
                       "config_file": settings.config_file}
    return Outcome(result=AuditResult(counted, result.errors, result.models, result.traces, result.dtype_maps,
                                      result.quantized),
                   settings=report_settings,
                   exit_code=code, rules=rule_set, root=repo_root(), ignored=len(result.findings) - len(kept),
                   baseline=match, written_to_baseline=len(kept) if write_to is not None else 0)


def exit_code_of(counted: list, errors: bool, fail_on: str, accepted: bool = False) -> int:
    """2 when a model could not be audited; 1 when a finding counted is at fail_on or worse (and not accepted)."""
    from .finding import severity_rank

    threshold = severity_rank(fail_on) if fail_on != "never" else 99
    failing = any(severity_rank(f.severity) >= threshold for f in counted)
    return EXIT_ERROR if errors else EXIT_FINDINGS if failing and not accepted else EXIT_CLEAN


def check_all_selectors(settings: Settings, rules: list[Rule]) -> None:
    """Every selector must name a rule; the error names the flag (the API's argument), or the pyproject file and
    key."""
    from .selection import check_selectors

    for name in ("select", "ignore"):
        origin = settings.origins.get(name)
        if origin == "command line":  # a flag, or an argument of the Python API
            check_selectors(getattr(settings, name), rules, None, settings.named(name))
        else:
            check_selectors(getattr(settings, name), rules, origin, f"[tool.precaudit] {name}")
    for table in ("per_model_ignores", "per_node_ignores"):
        for glob, selectors in getattr(settings, table).items():
            key = f"[tool.precaudit] {table.replace('_', '-')}.\"{glob}\""
            check_selectors(selectors, rules, settings.config_file, key)
