"""`precaudit scales CHECKPOINT`: the quantization scales of a published checkpoint, read from its header and its
scale tensors only (precaudit/checkpoint)."""

from __future__ import annotations

from .given import Given, UsageError

__all__ = ["scales"]


def scales(given: Given) -> int:
    from ..checkpoint.command import UsageError as ScalesUsage
    from ..checkpoint.command import run_scales

    try:
        return run_scales(given.checkpoint, given.output_format, given.output, given.manifest, given.jobs,
                          given.resume)
    except ScalesUsage as exc:
        raise UsageError(str(exc)) from None
