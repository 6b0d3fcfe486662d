"""GitHub Actions workflow commands: one ::error / ::warning / ::notice annotation per finding."""

from __future__ import annotations

from ..escape import log_line, printable
from .locations import full_message, relative_path, shown
from .outcome import Outcome
from .text import summary_line

__all__ = ["escape_data", "escape_property", "render_github"]

_COMMANDS = {"error": "error", "warning": "warning", "info": "notice"}


def render_github(outcome: Outcome) -> str:
    """Annotations GitHub shows on the pull request, then the summary as a plain log line.

    Each annotation is one line: names are escaped (escape.printable) as in the text report, then the workflow
    command's own escaping keeps a % or a line break from ending or forging a command.
    """
    lines = []
    for f in outcome.result.findings:
        # A PyTorch finding is annotated on its Python line; an ONNX finding on line 1 of the model file.
        path, line = (f.source_file, f.source_line or 1) if f.source_file else (f.model, 1)
        g = shown(f)
        props = {"file": printable(relative_path(path, outcome.root)), "line": str(line),
                 "title": f"{g.rule_id} {g.rule_name}"}
        lines.append(_command(_COMMANDS[f.severity], props, full_message(g)))
    for e in outcome.result.errors:
        props = {"file": printable(relative_path(e.file, outcome.root))} if e.file else {}
        props["title"] = "precaudit could not audit this model"
        lines.append(_command("error", props, printable(e.problem)))
    # the ::commands above are parsed as such, never as the runner's older ##[ syntax: their file= stays the path
    lines.append(log_line(summary_line(outcome.result)))
    return "\n".join(lines) + "\n"


def _command(name: str, props: dict[str, str], message: str) -> str:
    rendered = ",".join(f"{k}={escape_property(v)}" for k, v in props.items())
    return f"::{name} {rendered}::{escape_data(message)}"


def escape_data(text: str) -> str:
    """GitHub's escaping for a command's message: % first, then the line breaks that would end the command."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """Property values also escape the , and : that separate properties."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")
