"""Quantized checkpoints: `precaudit scales` reads a safetensors checkpoint's headers and scale tensors (never its
weights) and reports broken scales.

    from precaudit.checkpoint import scan
    report = scan("Llama-3.1-8B-NVFP4/")
    assert report.ok, report.to_text()

scan() raises precaudit.InputError (one line naming the file and the problem) on bad input: a truncated header,
overlapping tensors, an unknown dtype, a tensor name given twice, a shard missing from its index.
"""

from __future__ import annotations

from .report import ScanReport
from .scanner import scan

__all__ = ["ScanReport", "scan"]
