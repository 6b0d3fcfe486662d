"""`precaudit runtimes`: every runtime model, its versions and each fact with its source; or docs/runtimes.md."""

from __future__ import annotations

from .given import EXIT_CLEAN, Given
from .output import write

__all__ = ["runtimes"]


def runtimes(given: Given) -> int:
    from ..runtime.listing import render_runtimes_json, render_runtimes_text, runtimes_page

    if given.write_page is not None:
        from ..files import write_new

        write_new(given.write_page, runtimes_page(), what="the runtimes page")
        return EXIT_CLEAN
    write(render_runtimes_json() if given.output_format == "json" else render_runtimes_text(), given.output)
    return EXIT_CLEAN
