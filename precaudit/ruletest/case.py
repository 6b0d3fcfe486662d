"""A fixture case: a model built in code, how to audit it, and exactly which findings must come out (the project's
fixtures/ID_name.py modules list them in CASES; `precaudit test RULES_DIR --fixtures DIR --allow-code` runs them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Case"]


@dataclass
class Case:
    """expect is the exact set of (rule id, node name) findings; an empty set is a twin that must stay clean."""

    name: str
    build: Callable[[Path], Path]  # writes the model into a folder, returns its path
    expect: set[tuple[str, str]]
    dtype: str = "fp16"
    args: tuple[str, ...] = ()
    # Expected values of findings, keyed by rule id: exact values, or ("contains", text) for strings.
    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The exact message of a finding, keyed by (rule id, node name): the words a user reads are part of the rule.
    messages: dict[tuple[str, str], str] = field(default_factory=dict)
    command: str = "check"  # "train": build returns a training factory spec, audited by precaudit train
