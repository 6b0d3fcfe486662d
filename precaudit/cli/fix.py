"""`precaudit fix MODEL.onnx -o FIXED.onnx`: repair what the audit found, checked before the new model is written."""

from __future__ import annotations

from .given import Given
from .output import note_named_inputs, say_notes, write_stdout

__all__ = ["fix"]


def fix(given: Given) -> int:
    """Repair what the audit found, minimally and locally; write a new model, checked against the original."""
    from ..context import Audit
    from ..errors import InputError
    from ..files import check_output, is_null_device
    from ..fixer.command import fix_report

    output = given.output
    if output is not None and is_null_device(output):
        # the fixed model is written next to -o and checked there before it is kept: /dev/null has no such place
        raise InputError(output, "fix checks the model it writes in the folder of -o before keeping it; for "
                                      "the plan alone, use --dry-run without -o")
    if output is not None:
        check_output(output, what="the fixed model")
    settings = given.settings()
    note_named_inputs([given.model], settings, given.inputs)  # -o never over them
    audit = Audit.of(settings, inputs=given.trace_options(), traced=given.trace)
    say_notes(audit)
    text, code = fix_report(audit, given.model, output, given.dry_run,
                            given.min_eps, given.output_format, given.tolerance, given.data_floor)
    write_stdout(text)
    return code
