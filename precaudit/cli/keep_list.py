"""`precaudit keep-list MODEL --for CONVERTER`: the nodes to keep in float32, as that converter's arguments."""

from __future__ import annotations

from .given import Given
from .output import color_ok, note_named_inputs, say_notes, write

__all__ = ["keep_list"]


def keep_list(given: Given) -> int:
    """The nodes to keep in float32, as your converter's arguments; verified by emulation with --trace."""
    from ..context import Audit
    from ..files import check_output
    from ..keeplist.command import keep_list_report

    if given.output is not None:
        check_output(given.output, null_ok=True)
    settings = given.settings()
    note_named_inputs([given.model], settings, given.inputs)  # -o never over them
    torch, trace = given.torch_options(), given.trace_options()
    trace.progress = given.output is None and color_ok(False)
    audit = Audit.of(settings, torch, trace, given.traced())
    say_notes(audit)
    text, code = keep_list_report(audit, given.model, given.target_for, given.tolerance, given.max_runs,
                                  given.output_format, policy=given.policy)
    write(text, given.output)
    return code
