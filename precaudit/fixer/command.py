"""What `precaudit fix` runs once the command line is parsed: settings, rules, the fix, its report."""

from __future__ import annotations

import math

from ..config import load_settings
from ..dtypes import format_named
from ..errors import InputError
from ..options import TraceOptions

__all__ = ["fix_report", "run_checked"]


def fix_report(model: str, given: dict, output: str | None, dry_run: bool, min_eps: float | None,
               inputs: TraceOptions, trace: bool, output_format: str, tolerance: float = 1e-3,
               data_floor: str = "keep") -> tuple[str, int]:
    """The report text and the exit code. given holds the flags the user typed (dtype, keep_fp32, rules, select,
    ignore, converter), over the pyproject."""
    settings = load_settings({k: v for k, v in given.items() if v not in (None, [])})
    result = run_checked(model, settings, output, dry_run, min_eps, inputs, trace, tolerance, data_floor)
    return (result.to_json() if output_format == "json" else result.to_text()), result.exit_code


def run_checked(model: str, settings, output: str | None, dry_run: bool, min_eps: float | None,
                inputs: TraceOptions, trace: bool, tolerance: float, data_floor: str):
    """`precaudit fix` from resolved settings: what the command and the Python API run."""
    from ..rules.loader import load_rules
    from ..selection import active_rules, drop_ignored
    from .run import FixOptions, run_fix

    try:
        target = format_named(settings.dtype)
    except KeyError as exc:
        raise InputError(None, f"--dtype: {exc.args[0]}") from None
    if not model.lower().endswith(".onnx"):
        raise InputError(model, "fix rewrites ONNX files: export the model first (a PyTorch model's findings name "
                                "the source lines to change)")
    if target.name in ("fp32", "fp64"):
        raise InputError(None, f"--dtype {target.name}: fix repairs what a narrower dtype breaks; choose fp16, bf16 or "
                               "an fp8 format")
    if min_eps is not None:
        if not math.isfinite(min_eps) or min_eps < target.smallest_normal or min_eps > 1e-3:
            raise InputError(None, f"--min-eps {min_eps:g}: choose a value from {target.smallest_normal:.4g} (the "
                                   f"smallest normal {target.long_name}) to 1e-3 (larger eps dominate ordinary "
                                   "variances)")
    if not 0 < tolerance < float("inf"):
        raise InputError(None, f"--tolerance must be a positive number, got {tolerance}")
    _check_floor(data_floor, target)
    all_rules = load_rules(settings.rules)
    rules = active_rules(all_rules, settings.select, settings.ignore, settings.preview)
    by_id = {r.id: r for r in rules}

    def keep(findings):
        return drop_ignored(findings, by_id, settings.per_model_ignores, settings.per_node_ignores,
                            settings.project_root)

    options = FixOptions(min_eps, data_floor, tolerance)
    return run_fix(model, output, target, rules, settings.keep_fp32, settings.converter, options, dry_run,
                   inputs, trace, keep)


def _check_floor(data_floor: str, target) -> None:
    """--data-floor: keep, subnormal, normal, or a number the target holds as a normal or subnormal value."""
    if data_floor in ("keep", "subnormal", "normal"):
        return
    try:
        value = float(data_floor)
    except ValueError:
        raise InputError(None, f"--data-floor {data_floor!r}: choose keep, subnormal, normal or a number") from None
    if not math.isfinite(value) or value < target.smallest_subnormal or value > 1e-3:
        raise InputError(None, f"--data-floor {data_floor}: choose a value from {target.smallest_subnormal:.4g} (the "
                               f"smallest subnormal {target.long_name}) to 1e-3")
