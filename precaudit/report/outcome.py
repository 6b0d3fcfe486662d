"""What every report renders: the findings that count after selection, ignores and the baseline, and the run's context."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..baseline import BaselineMatch
from ..result import AuditResult
from ..rules.loader import Rule

__all__ = ["Outcome"]


@dataclass
class Outcome:
    """One run, ready to render in any format."""

    result: AuditResult            # findings here are the ones that count (not ignored, not in the baseline)
    settings: dict                 # the settings as the JSON report prints them
    exit_code: int
    rules: list[Rule]              # the rules that ran
    root: Path                     # the repository root: SARIF and annotations need paths relative to it
    ignored: int = 0               # findings dropped by per-model or per-node ignores
    baseline: BaselineMatch | None = None
    written_to_baseline: int = 0   # --write-baseline: how many findings the baseline now holds
