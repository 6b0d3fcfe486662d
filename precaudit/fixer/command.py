"""What `precaudit fix` runs once the command line is parsed: settings, rules, the fix, its report."""

from __future__ import annotations

import math
import numbers
import sys
from typing import Any

from ..config import load_settings
from ..dtypes import format_named
from ..errors import InputError
from ..escape import printable
from ..options import TraceOptions, check_number, shown

__all__ = ["fix_report", "run_checked", "check_data_floor"]


def fix_report(model: str, given: dict, output: str | None, dry_run: bool, min_eps: float | None,
               inputs: TraceOptions, trace: bool, output_format: str, tolerance: float = 1e-3,
               data_floor: str = "keep") -> tuple[str, int]:
    """The report text and the exit code. given holds the flags the user typed (dtype, keep_fp32, rules, select,
    ignore, converter), over the pyproject."""
    settings = load_settings({k: v for k, v in given.items() if v not in (None, [])})
    result = run_checked(model, settings, output, dry_run, min_eps, inputs, trace, tolerance, data_floor)
    reason = result.reason()
    if reason is not None:  # what exit 1 means, where a script's log shows it (the report goes to stdout)
        sys.stderr.write(f"precaudit: {printable(model)}: {printable(reason)}\n")
    return (result.to_json() if output_format == "json" else result.to_text()), result.exit_code


def run_checked(model: str, settings, output: str | None, dry_run: bool, min_eps: float | None,
                inputs: TraceOptions, trace: bool, tolerance: float, data_floor: str | float):
    """`precaudit fix` from resolved settings: what the command and the Python API run. Every value is checked before
    the model is read; an error names it as settings.named does (--min-eps, or the API's min_eps)."""
    from ..pipeline import check_all_selectors
    from ..rules.loader import load_rules
    from ..selection import active_rules, drop_ignored
    from .run import FixOptions, run_fix

    named = settings.named
    target = format_named(settings.dtype)  # checked when the settings were made
    if not model.lower().endswith(".onnx"):
        raise InputError(model, "fix rewrites ONNX files: export the model first (a PyTorch model's findings name "
                                "the source lines to change)")
    if target.name in ("fp32", "fp64"):
        raise InputError(None, f"{named('dtype')} {target.name}: fix repairs what a narrower dtype breaks; choose "
                               "fp16, bf16 or an fp8 format")
    if min_eps is not None:
        min_eps = check_number(min_eps, named("min_eps"))
        if min_eps < target.smallest_normal or min_eps > 1e-3:
            raise InputError(None, f"{named('min_eps')} {min_eps:g}: choose a value from {target.smallest_normal:.4g} "
                                   f"(the smallest normal {target.long_name}) to 1e-3 (larger eps dominate ordinary "
                                   "variances)")
    tolerance = check_number(tolerance, named("tolerance"), minimum=0.0, above=True)
    data_floor = check_data_floor(data_floor, target, named("data_floor"))
    all_rules = load_rules(settings.rules)
    check_all_selectors(settings, all_rules)
    rules = active_rules(all_rules, settings.select, settings.ignore, settings.preview)
    by_id = {r.id: r for r in rules}

    def keep(findings):
        return drop_ignored(findings, by_id, settings.per_model_ignores, settings.per_node_ignores,
                            settings.project_root)

    options = FixOptions(min_eps, data_floor, tolerance)
    from ..deployment import Deployment

    deployment = Deployment.named(target, settings.converter, settings.keep_fp32)
    return run_fix(model, output, deployment, rules, options, dry_run, inputs, trace, keep)


def check_data_floor(data_floor: Any, target, where: str) -> str:
    """--data-floor: keep, subnormal, normal, or a number (a str, or a float from the API) the target holds as a
    normal or subnormal value."""
    if isinstance(data_floor, str) and data_floor in ("keep", "subnormal", "normal"):
        return data_floor
    try:
        if isinstance(data_floor, bool) or not isinstance(data_floor, (str, numbers.Real)):
            raise ValueError(data_floor)
        value = float(data_floor)
    except ValueError:
        raise InputError(None, f"{where} {shown(data_floor)}: choose keep, subnormal, normal or a number") from None
    if not math.isfinite(value) or value < target.smallest_subnormal or value > 1e-3:
        raise InputError(None, f"{where} {shown(data_floor)}: choose a value from {target.smallest_subnormal:.4g} "
                               f"(the smallest subnormal {target.long_name}) to 1e-3")
    return str(data_floor)
