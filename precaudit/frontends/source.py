"""Point at the user's Python line from a captured stack trace (torch.export meta, dynamo ONNX metadata)."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["frames", "user_frame"]

_FRAME = re.compile(r'File "([^"]+)", line (\d+)(?:, in (\S+))?')
_LIBRARY = re.compile(r"[/\\](site-packages|dist-packages|lib/python3\.\d+)[/\\]|^<")
_TORCH = re.compile(r"[/\\](site-packages|dist-packages)[/\\]torch[/\\]|^<")


def user_frame(stack_trace: str) -> tuple[str, int] | None:
    """The innermost frame outside installed libraries (frames run outermost first), relative to the cwd."""
    return frames(stack_trace)[0]


def frames(stack_trace: str) -> tuple[tuple[str, int] | None, tuple[str, int] | None]:
    """Where an op was written, and the call site that led there when that is elsewhere.

    The innermost frame outside installed libraries, as a rule. When that frame only calls into a library
    module (a transformers model built by the script: every op's innermost user frame is the same call), the op
    is placed in the innermost forward() of that library outside torch itself — T5LayerNorm.forward in
    modeling_t5.py, the line that calls self.wo(...) for a Linear — and the user's call is the call site.
    """
    found = _FRAME.findall(stack_trace or "")
    if not found:
        return None, None
    user = [i for i, (file, _, _) in enumerate(found) if not _LIBRARY.search(file)]
    if not user:
        file, line, _ = found[-1]
        return (_relative(file), int(line)), None
    call = found[user[-1]]
    inside = [f for f in found[user[-1] + 1:] if f[2] == "forward" and not _TORCH.search(f[0])]
    if inside:
        file, line, _ = inside[-1]
        return (_relative(file), int(line)), (_relative(call[0]), int(call[1]))
    return (_relative(call[0]), int(call[1])), None


def _relative(file: str) -> str:
    """Relative to the working directory when inside it: what editors and CI annotations expect."""
    try:
        return Path(file).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return file
