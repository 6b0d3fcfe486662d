"""The README's and docs/training.md's table of what `precaudit train --trace` finds on transformers GPT-2, Llama,
BERT and T5 in the four regimes is what benchmarks/train_sweep.py makes today (about a minute: 16 traced audits)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import train_sweep  # noqa: E402


@pytest.mark.slow
def test_the_published_tables_are_what_the_sweep_finds():
    text, _ = train_sweep.table()
    for page in (ROOT / "README.md", ROOT / "docs" / "training.md"):
        assert train_sweep.replaced(page, text) == page.read_text(), f"{page.name}: rerun benchmarks/train_sweep.py"
    # the rows a reader checks first: autocast is clean, pure fp16's AdamW eps is 0 and its step turns NaN
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in text.splitlines()[2:]}
    assert set(rows) == {"GPT-2", "Llama", "BERT", "T5"}
    for cells in rows.values():
        assert cells[0] == "–" and cells[1] == "–"
        assert cells[3].startswith("PA401") and "PA454" in cells[3]
