"""Where a finding is, in words and in repository-relative paths, as code scanning and annotations need them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..escape import printable
from ..finding import Finding

__all__ = ["full_message", "node_phrase", "relative_path", "repo_root", "shown"]


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
    return dataclasses.replace(f, **changes)


def node_phrase(f: Finding) -> str:
    """The node as reports name it: node '/attn_norm/Add' (Add) in attn_norm."""
    return f"node '{f.node_name}' ({f.op_type})" + (f" in {f.scope}" if f.scope else "")


def full_message(f: Finding) -> str:
    """One self-contained message for viewers that show nothing else: what, where, and the fix."""
    return f"{f.message.rstrip('.')}. At {node_phrase(f)}. Fix: {f.fix}"
