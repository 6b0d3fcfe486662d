"""A one-line progress bar on stderr for long traced runs; silent unless the CLI asked for it."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from ..escape import printable

__all__ = ["progress_bar"]

_WIDTH = 30
_EVERY = 0.1  # seconds between redraws: redrawing per node would cost more than small nodes do


def progress_bar(label: str, samples: int) -> tuple[Callable[[int, int], None], Callable[[], None]]:
    """(update, close): update(done, total) per node of the current sample; close() clears the line."""
    label = printable(label)  # a model path is a stranger's text too
    state = {"sample": 0, "last": 0.0, "shown": False}

    def update(done: int, total: int) -> None:
        now = time.monotonic()
        if done == total:
            state["sample"] += 1
        if now - state["last"] < _EVERY and done != total:
            return
        state["last"], state["shown"] = now, True
        part = (min(state["sample"], samples - 1) * total + done) / (samples * total)
        bar = "#" * int(part * _WIDTH)
        sys.stderr.write(f"\rprecaudit: tracing {label} [{bar:<{_WIDTH}}] {part:4.0%}")
        sys.stderr.flush()

    def close() -> None:
        if state["shown"]:
            sys.stderr.write("\r" + " " * (_WIDTH + len(label) + 32) + "\r")
            sys.stderr.flush()

    return update, close
