"""Where a finding is, in words and in repository-relative paths, as code scanning and annotations need them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..escape import printable
from ..finding import RECORDED, Finding

__all__ = ["full_message", "node_phrase", "recorded", "recorded_phrase", "relative_path", "repo_root", "shown"]


def repo_root(start: Path | None = None) -> Path:
    """The nearest folder holding .git, or the working directory outside a repository."""
    here = (start or Path.cwd()).resolve()
    return next((p for p in (here, *here.parents) if (p / ".git").exists()), here)


def relative_path(path: str, root: Path) -> str:
    """The path relative to the root with forward slashes; a path outside the root stays absolute."""
    resolved = Path(path).resolve()
    try:
        return resolved.relative_to(root).as_posix()
    except ValueError:
        return resolved.as_posix()


def shown(f: Finding) -> Finding:
    """The finding as reports for people print it: every string field and string value escaped (escape.printable).

    Names, scopes, paths, op types and the messages that quote them all come from the model; escaping the copy a
    renderer prints from, rather than field by field, leaves no field for a new line of a report to forget.
    Paths still to be resolved (relative_path) and the fingerprint must come from the raw finding.
    """
    changes: dict[str, Any] = {fld.name: printable(value) for fld in dataclasses.fields(f)
                               if isinstance(value := getattr(f, fld.name), str)}
    changes["values"] = {k: printable(v) if isinstance(v, str) else v for k, v in f.values.items()}
    changes["references"] = [printable(r) for r in f.references]
    changes["related_locations"] = [{k: printable(v) if isinstance(v, str) else v for k, v in loc.items()}
                                    for loc in f.related_locations]
    return dataclasses.replace(f, **changes)


def node_phrase(f: Finding) -> str:
    """The node as reports name it: node '/attn_norm/Add' (Add) in attn_norm."""
    return f"node '{f.node_name}' ({f.op_type})" + (f" in {f.scope}" if f.scope else "")


def recorded(f: Finding) -> list[tuple[str, int | None]]:
    """The Python lines an exporter recorded for an ONNX finding's node, where the file is in this repository: related
    to the finding, which is in the model, at the node."""
    return [(loc["file"], loc["line"]) for loc in f.related_locations if loc["message"] == RECORDED]


def recorded_phrase(f: Finding) -> str:
    """', recorded at src/model.py:9' after the node, or nothing."""
    return "".join(f", recorded at {file}:{line}" for file, line in recorded(f))


def full_message(f: Finding) -> str:
    """One self-contained message for viewers that show nothing else: what, where, and the fix."""
    return f"{f.message.rstrip('.')}. At {node_phrase(f)}{recorded_phrase(f)}. Fix: {f.fix}"
