"""Where a finding is, in words and in repository-relative paths, as code scanning and annotations need them."""

from __future__ import annotations

from pathlib import Path

from ..finding import Finding

__all__ = ["repo_root", "relative_path", "node_phrase", "full_message"]


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


def node_phrase(f: Finding) -> str:
    """The node as reports name it: node '/attn_norm/Add' (Add) in attn_norm."""
    return f"node '{f.node_name}' ({f.op_type})" + (f" in {f.scope}" if f.scope else "")


def full_message(f: Finding) -> str:
    """One self-contained message for viewers that show nothing else: what, where, and the fix."""
    return f"{f.message.rstrip('.')}. At {node_phrase(f)}. Fix: {f.fix}"
