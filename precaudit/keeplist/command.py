"""What `precaudit keep-list` runs once the command line is parsed: settings, rules, the list, its rendering."""

from __future__ import annotations

import sys
from ..config import load_settings
from ..dtypes import format_named
from ..errors import InputError
from ..options import TorchOptions, TraceOptions

__all__ = ["keep_list_report"]


def keep_list_report(model: str, given: dict, target_for: str | None, torch_options: TorchOptions,
                     trace: TraceOptions | None, tolerance: float, max_runs: int, output_format: str) -> str:
    """The report text. given holds the flags the user typed (dtype, keep_fp32, rules), over the pyproject."""
    from ..rules.loader import load_rules
    from ..selection import active_rules
    from . import FOR_TARGETS, build_keep_list
    from .render import render_json, render_text

    settings = load_settings({k: v for k, v in given.items() if v not in (None, [])})
    if target_for is None:
        raise InputError(None, f"keep-list needs --for: one of {', '.join(FOR_TARGETS)}")
    try:
        target = format_named(settings.dtype)
    except KeyError as exc:
        raise InputError(None, f"--dtype: {exc.args[0]}") from None
    if not 0 < tolerance < float("inf"):
        raise InputError(None, f"--tolerance must be a positive number, got {tolerance}")
    rules = active_rules(load_rules(settings.rules), settings.select, settings.ignore, settings.preview)
    keep = build_keep_list(model, target, target_for, settings.keep_fp32, rules, torch_options, trace, tolerance,
                           max_runs, progress=_progress if trace is not None and trace.progress else None)
    return render_json(keep) if output_format == "json" else render_text(keep)


def _progress(message: str) -> None:
    """One line per emulation run, on a terminal only (trace.progress is set for a terminal)."""
    sys.stderr.write(f"precaudit: {message}\n")
    sys.stderr.flush()
