"""`precaudit check MODEL ...` (also `precaudit MODEL ...`): audit models against the target dtype."""

from __future__ import annotations

from .given import EXIT_CLEAN, Given
from .output import color_ok, note_named_inputs, say, say_notes, write, write_report, write_stdout

__all__ = ["check"]


def check(given: Given) -> int:
    """Audit models against the target dtype (the default command): 0 clean, 1 findings, 2 errors."""
    from ..context import Audit
    from ..errors import InputError
    from ..files import check_output
    from ..parallel import default_jobs
    from ..pipeline import run_audit

    settings = given.settings()
    if given.show_settings:
        write_stdout(settings.describe())
        return EXIT_CLEAN
    models, output = given.models, given.output
    if not models:
        raise InputError(None, "no model given: precaudit MODEL.onnx [MORE.onnx ...] [options]")
    if given.statistics and settings.format != "text":
        raise InputError(None, f"--statistics prints a table; it cannot be combined with --format {settings.format}")
    note_named_inputs(models, settings, given.inputs)
    # Refuse early what can be known before the run; the write checks again against every file the run read.
    if output is not None:
        check_output(output, null_ok=True)
    baseline = (settings.baseline,) if settings.baseline else ()
    if given.write_baseline is not None:  # rewriting the baseline in place is how it is refreshed
        check_output(given.write_baseline, may_replace=baseline, what="the baseline", null_ok=True)
    torch, trace = given.torch_options(), given.trace_options()
    jobs = min(given.jobs or default_jobs(), len(models))
    # a progress line on a terminal only, and one per worker would interleave
    trace.progress = settings.format == "text" and output is None and color_ok(given.no_color) and jobs == 1
    traced = given.traced()
    if settings.runtime == "all":
        return _matrix(settings, models, torch, trace, traced, output)
    audit = Audit.of(settings, torch, trace, traced)
    say_notes(audit)
    outcome = run_audit(audit, models, given.write_baseline, given.exit_zero, jobs, given.debug)
    for err in outcome.result.errors:
        say(str(err))
    if given.write_baseline is not None:
        from ..escape import printable
        n = outcome.written_to_baseline
        say(f"wrote {n} finding{'s' * (n != 1)} to the baseline {printable(given.write_baseline)}")
    if given.statistics:
        from ..report.text import render_statistics
        write(render_statistics(outcome), output)
    else:
        write_report(outcome, output, given.no_color, group=not given.no_group)
    return outcome.exit_code


def _matrix(settings, models, torch, trace, traced: bool, output) -> int:
    """check --runtime all: the deployment matrix, as text or JSON."""
    from ..errors import InputError
    from ..matrix import deployment_matrix, render_matrix_json, render_matrix_text

    if settings.format not in ("text", "json"):
        raise InputError(None, f"--runtime all prints the deployment matrix as text or json, not {settings.format}")
    matrix = deployment_matrix(settings, models, torch, trace, traced, settings.fail_on)
    for err in matrix.errors:
        say(str(err))
    write(render_matrix_json(matrix) if settings.format == "json" else render_matrix_text(matrix), output)
    return matrix.exit_code
