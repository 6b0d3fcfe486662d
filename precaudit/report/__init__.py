"""The reporters: each renders an audit's Outcome in one format. A new format is its module and one entry in
RENDERERS (the module loads only when its format is asked for)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .outcome import Outcome

__all__ = ["RENDERERS", "render"]

# format -> (module in this package, its function of the Outcome); text's takes color and group too
RENDERERS: dict[str, tuple[str, str]] = {
    "text": ("text", "render_text"),
    "concise": ("text", "render_concise"),
    "json": ("json", "render_json"),
    "sarif": ("sarif", "render_sarif"),
    "github": ("github", "render_github"),
    "junit": ("junit", "render_junit"),
    "html": ("html", "render_html"),
}


def render(outcome: Outcome, fmt: str | None = None, color: bool = False, group: bool = True) -> str:
    """The outcome in fmt (default: the format its settings name)."""
    fmt = fmt or outcome.settings["format"]
    module, function = RENDERERS[fmt]
    renderer = getattr(importlib.import_module(f"{__name__}.{module}"), function)
    return renderer(outcome, color=color, group=group) if fmt == "text" else renderer(outcome)
