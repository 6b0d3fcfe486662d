"""Where a command's text goes: stdout, or the file of -o (new, never over a file the run reads); its notes and
errors as single stderr lines."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import Settings
    from ..context import Audit
    from ..report.outcome import Outcome

__all__ = ["color_ok", "note_named_inputs", "say", "say_notes", "write", "write_report", "write_stdout"]


def write(text: str, output: str | None) -> None:
    """The text on stdout, or into the file of -o (its missing folders made; os.devnull: nothing written)."""
    if output is None:
        write_stdout(text)
        return
    from ..files import note_imported, write_new

    note_imported()  # a factory's model.py, and what it imported, are inputs too
    write_new(output, text)


def write_report(outcome: Outcome, output: str | None, no_color: bool, group: bool = True) -> None:
    """An audit's report in its format; the text one in colour on a terminal."""
    from ..report import render

    write(render(outcome, color=output is None and color_ok(no_color), group=group), output)


def write_stdout(text: str) -> None:
    from ..errors import InputError
    try:
        if sys.stdout is None:
            raise OSError("standard output is closed")
        sys.stdout.write(text)
        sys.stdout.flush()
    except (OSError, ValueError) as exc:
        _silence_stdout()  # the interpreter would fail again flushing it at exit, with a second message
        problem = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError("standard output", f"cannot write the report: {problem}") from None


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        sys.stdout = None


def say(message: str) -> None:
    """One line on stderr; a stderr that cannot be written to is not worth a second failure. A CI runner parses
    stderr for workflow commands too: the line starts with `precaudit:`, and log_line breaks any `##[`."""
    from ..escape import log_line
    try:
        sys.stderr.write(log_line(f"precaudit: {message}\n"))
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass


def say_notes(audit: Audit) -> None:
    """A runtime version judged as the nearest modelled one: one warning line on stderr."""
    for note in audit.notes:
        say(f"warning: {note}")


def color_ok(no_color: bool) -> bool:
    return not no_color and "NO_COLOR" not in os.environ and sys.stdout is not None and sys.stdout.isatty()


def note_named_inputs(models: list[str], settings: Settings, inputs: list[str]) -> None:
    """Record every file named on the command line or in the config as read by this run: no output goes over one."""
    from ..files import note_read
    from ..frontends.torch_input import is_torch_input, torch_input_files

    named: list[tuple[str | Path | None, str | None]] = [
        *((i, "an --inputs file") for i in inputs), *((r, "a rules file") for r in settings.rules),
        (settings.baseline, "the baseline"), (settings.config_file, "the configuration")]
    for spec in models:  # model.py:factory reads model.py
        if is_torch_input(spec) and not os.path.lexists(spec):
            named.extend((file, f"the code of {spec}") for file in torch_input_files(spec))
        else:
            named.append((spec, None))
    for item, role in named:
        if not item:
            continue
        path = Path(item)
        for file in (path.glob("*.y*ml") if path.is_dir() else [path]):
            note_read(file, role)
