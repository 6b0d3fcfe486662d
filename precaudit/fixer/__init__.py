"""`precaudit fix`: minimal, local repairs of what the audit found, each checked.

One module per kind of repair — eps.py (raise an eps, move it inside the root, add a missing one, stash_type=1),
softmax.py (LogSoftmax, -Softplus(-x), the max shift), guards.py (clamps), masks.py (mask fills), islands.py (a norm's
statistics in float32) — chosen by planner.py from the audit's findings and applied to the proto by model.py's
Editable. run.py writes the result next to its target under a temporary name, checks it (onnx.checker, a re-audit,
float32 against the original in check.py, the emulated run with --trace) and renames it into place.
"""

from __future__ import annotations

from .plan import EXACT, Check, Plan, Repair, Skipped

__all__ = ["EXACT", "Check", "Plan", "Repair", "Skipped"]
