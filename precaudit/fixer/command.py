"""What `precaudit fix` runs over an audit's context: the checks of its own values, the fix, its report."""

from __future__ import annotations

import math
import numbers
import sys
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..escape import printable
from ..options import check_number, shown

if TYPE_CHECKING:
    from ..context import Audit

__all__ = ["check_data_floor", "fix_report", "run_checked"]


def fix_report(audit: Audit, model: str, output: str | None, dry_run: bool, min_eps: float | None,
               output_format: str, tolerance: float = 1e-3, data_floor: str = "keep") -> tuple[str, int]:
    """The report text and the exit code of `precaudit fix`."""
    result = run_checked(audit, model, output, dry_run, min_eps, tolerance, data_floor)
    reason = result.reason()
    if reason is not None:  # what exit 1 means, where a script's log shows it (the report goes to stdout)
        sys.stderr.write(f"precaudit: {printable(model)}: {printable(reason)}\n")
    return (result.to_json() if output_format == "json" else result.to_text()), result.exit_code


def run_checked(audit: Audit, model: str, output: str | None, dry_run: bool, min_eps: float | None,
                tolerance: float, data_floor: str | float):
    """`precaudit fix` over an audit's context: what the command and the Python API run. Every value is checked
    before the model is read; an error names it as the settings name it (--min-eps, or the API's min_eps). The
    audit's inputs are what each repair's float32 change is measured on; traced, both models are emulated too."""
    from .run import FixOptions, run_fix

    named = audit.settings.named
    target = audit.deployment.fmt
    if not model.lower().endswith(".onnx"):
        raise InputError(model, "fix rewrites ONNX files: export the model first (a PyTorch model's findings name "
                                "the source lines to change)")
    if target.wide or target.blocked:
        raise InputError(None, f"{named('dtype')} {target.name}: fix repairs what a narrower dtype breaks; choose "
                               "fp16, bf16 or an fp8 format" + (" (a block-scaled format quantizes what MatMul, Gemm "
                               "and Conv read: precaudit keep-list names those to keep)" if target.blocked else ""))
    if min_eps is not None:
        min_eps = check_number(min_eps, named("min_eps"))
        if min_eps < target.smallest_normal or min_eps > 1e-3:
            raise InputError(None, f"{named('min_eps')} {min_eps:g}: choose a value from {target.smallest_normal:.4g} "
                                   f"(the smallest normal {target.long_name}) to 1e-3 (larger eps dominate ordinary "
                                   "variances)")
    tolerance = check_number(tolerance, named("tolerance"), minimum=0.0, above=True)
    data_floor = check_data_floor(data_floor, target, named("data_floor"))
    options = FixOptions(min_eps, data_floor, tolerance)
    return run_fix(model, output, audit.deployment, audit.rules, options, dry_run, audit.inputs, audit.traced,
                   audit.ignored, weights=bool(audit.settings.check_weights))


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
