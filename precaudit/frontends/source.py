"""Point at the user's Python line from a captured stack trace (torch.export meta, dynamo ONNX metadata)."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["user_frame"]

_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_LIBRARY = re.compile(r"[/\\](site-packages|dist-packages|lib/python3\.\d+)[/\\]|^<")


def user_frame(stack_trace: str) -> tuple[str, int] | None:
    """The innermost frame outside installed libraries (frames run outermost first), relative to the cwd."""
    frames = _FRAME.findall(stack_trace or "")
    if not frames:
        return None
    user = [f for f in frames if not _LIBRARY.search(f[0])]
    file, line = (user or frames)[-1]
    return _relative(file), int(line)


def _relative(file: str) -> str:
    """Relative to the working directory when inside it: what editors and CI annotations expect."""
    try:
        return Path(file).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return file
