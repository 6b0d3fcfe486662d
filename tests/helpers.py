"""Run the CLI in-process and read its JSON report, as a user's script would."""

from __future__ import annotations

import json
from pathlib import Path

from precaudit.cli import main


def run_json(models: list[Path | str], *args: str, out_dir: Path) -> tuple[int, dict]:
    """Exit code and parsed JSON report of `precaudit MODELS... ARGS -f json -o FILE`."""
    out = out_dir / "report.json"
    code = main([*map(str, models), *args, "--format", "json", "-o", str(out)])
    return code, json.loads(out.read_text())
