"""A check of a keep-list's snippet run in a child Python: isolated (-I: the user's folder is not on sys.path), its
output captured as text, and stopped after the keep-list's timeout."""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .snippet_run import SnippetCheck

__all__ = ["TIMEOUT", "run_child"]

TIMEOUT = 1800  # seconds: the converters run shape inference, which takes minutes on the largest models


def run_child(argv: list[str], check: SnippetCheck, late: str,
              cwd: str | None = None) -> subprocess.CompletedProcess[str] | None:
    """`python -I ARGV...` run to its end; None, with check.problem saying late (what did not finish) and the
    timeout, where it runs past TIMEOUT. Its exit code is the caller's to read."""
    try:
        return subprocess.run([sys.executable, "-I", *argv], cwd=cwd, capture_output=True, text=True,
                              timeout=TIMEOUT, errors="replace", check=False)
    except subprocess.TimeoutExpired:
        check.problem = f"{late} in {TIMEOUT} s"
        return None
