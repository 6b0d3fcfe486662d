"""Point at the user's Python line from a captured stack trace (torch.export meta, dynamo ONNX metadata)."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

__all__ = ["frames", "in_repository", "user_frame"]

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


def in_repository(file: str) -> bool:
    """Whether a file a model names (the exporter's stack trace) is a file in the repository the audit runs in (the
    working directory's; the working directory outside one): a line of the exporting machine, or of a library there,
    is shown only where the reader can open it."""
    return _in_repository(os.getcwd(), file)


@functools.lru_cache(maxsize=1024)
def _in_repository(cwd: str, file: str) -> bool:
    try:
        here = Path(cwd).resolve()
        # the repository as reports find it (report.locations.repo_root, a layer above): the nearest folder with .git
        root = next((p for p in (here, *here.parents) if (p / ".git").exists()), here)
        resolved = (here / file).resolve()
        return resolved.is_relative_to(root) and resolved.is_file()
    except (OSError, RuntimeError, ValueError):  # a name with a NUL byte, a symlink loop
        return False
