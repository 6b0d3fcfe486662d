"""One scan: the headers, the layouts, the scale tensors' bytes (and no other tensor's), the checks."""

from __future__ import annotations

import os
import time
from typing import Any

from ..collector import collector_paused
from ..files import open_regular
from ..options import check_path
from .checks import config_findings, sibling_findings, unit_findings, value_findings
from .config import read_config
from .findings import ScaleFinding, ScaleTensor
from .header import TensorInfo
from .layouts import SCALE_ROLES, Part, Unit, find_units
from .report import ScanReport
from .sources import open_checkpoint
from .values import COUNTED, count_all, read_small

__all__ = ["scan"]

READ_BUFFER = 4 << 20


def scan(path: str | os.PathLike[str]) -> ScanReport:
    """Scan a checkpoint (a .safetensors file, a folder of shards, or a model.safetensors.index.json) for broken
    quantization scales. Bad input (a broken header, a shard missing from the index, ...) raises InputError."""
    shown = check_path(path, "path")
    with collector_paused():
        return _scan(shown)


def _scan(shown: str) -> ScanReport:
    started = time.perf_counter()
    checkpoint = open_checkpoint(shown)
    config = read_config(checkpoint.quant.config) if checkpoint.quant else None
    units = find_units(checkpoint.tensors, checkpoint.metadata, config)
    stats, widths, scale_bytes = _read_scales(units)
    findings: list[ScaleFinding] = []
    for st in stats.values():
        findings.extend(value_findings(st))
    for unit in units:
        findings.extend(unit_findings(unit, stats, widths.get(unit.name)))
        if config is not None:
            findings.extend(config_findings(unit, config))
    findings.extend(sibling_findings(units))
    report = ScanReport(
        checkpoint=shown, files=[(s.path, s.size) for s in checkpoint.shards],
        config_file=checkpoint.quant.file if checkpoint.quant else None, index=checkpoint.index,
        method=config.method if config else None, layouts=_layouts(units), tensors=list(stats.values()),
        findings=_unique(findings), notes=list(config.notes) if config else [],
        bytes_read=sum(s.header_bytes for s in checkpoint.shards) + scale_bytes, bytes_total=checkpoint.size)
    report.seconds = time.perf_counter() - started
    return report


def _read_scales(units: list[Unit]) -> tuple[dict[str, ScaleTensor], dict[str, int], int]:
    """Every scale tensor's counts (file by file, in offset order), compressed-tensors' in_features from
    weight_shape, and the bytes read."""
    planned: dict[str, list[tuple[Part, Unit]]] = {}
    shapes: dict[str, list[tuple[Part, Unit]]] = {}
    for unit in units:
        for leaf, part in unit.parts.items():
            if leaf == "weight_shape":
                shapes.setdefault(part.tensor.file, []).append((part, unit))
            elif part.role in SCALE_ROLES:
                planned.setdefault(part.tensor.file, []).append((part, unit))
    stats: dict[str, ScaleTensor] = {}
    widths: dict[str, int] = {}
    read = 0
    buffer = bytearray(READ_BUFFER)
    for file in dict.fromkeys([*planned, *shapes]):
        items = sorted(planned.get(file, []), key=lambda item: item[0].tensor.start)
        counted = [(part.tensor, part.decode) for part, _ in items if part.decode in COUNTED]
        with open_regular(file) as fh:
            _prefetch(fh.fileno(), [t for t, _ in counted])
            counts = iter(count_all(fh, counted, buffer))
            for part, unit in items:
                found = next(counts) if part.decode in COUNTED else None
                stats[part.tensor.name] = ScaleTensor(part.tensor, unit.name, unit.layout, part.role, part.decode,
                                                      found)
            for part, unit in shapes.get(file, []):
                shape = read_small(fh, part.tensor)
                if shape is not None and len(shape) == 2 and shape[1] > 0:
                    widths[unit.name] = shape[1]
                read += part.tensor.nbytes if shape is not None else 0
        read += sum(t.nbytes for t, _ in counted)
    return stats, widths, read


def _prefetch(fd: int, tensors: list[TensorInfo]) -> None:
    """Ask the kernel for the scale tensors' bytes (and only those) ahead of the counting: a cold disk serves the
    scattered tensors while the counts run (the same bytes the scan reads next)."""
    if hasattr(os, "posix_fadvise"):
        for t in tensors:
            if t.nbytes:
                os.posix_fadvise(fd, t.start, t.nbytes, os.POSIX_FADV_WILLNEED)


def _layouts(units: list[Unit]) -> list[dict[str, Any]]:
    """Each layout recognised, how many weights it holds, and from what."""
    found: dict[str, dict[str, Any]] = {}
    for unit in units:
        if unit.layout is not None:
            entry = found.setdefault(unit.layout, {"layout": unit.layout, "family": unit.family, "weights": 0,
                                                   "evidence": unit.evidence})
            entry["weights"] += 1
    return list(found.values())


def _unique(findings: list[ScaleFinding]) -> list[ScaleFinding]:
    """One finding per check, tensor and missing scale (the config and a unit's siblings may both miss one)."""
    seen: set[tuple[str, str, str]] = set()
    kept = []
    for f in findings:
        key = (f.rule, f.tensor, str(f.values.get("missing", f.message)))
        if key not in seen:
            seen.add(key)
            kept.append(f)
    return kept
