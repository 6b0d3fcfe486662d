"""Constants as the two runs read them, and the budget of weights a run keeps from one sample to the next."""

from __future__ import annotations

import threading

import numpy as np

from ..ir import Value
from .fallback import as_float, as_reference
from .plan import Plan
from .rounding import round_into

__all__ = ["HOLD_BYTES", "SMALL_CONST_BYTES", "ConstStore"]

# Weights a run keeps from one sample to the next (rounded copies, onnxruntime segments with their weights): the
# first ones met, up to this many bytes; the rest are read again, from the file, in every sample. The last sample
# keeps nothing past its last reader, so a one-batch run holds one segment's weights at a time.
HOLD_BYTES = 1 << 30
# Constants this small (eps, axes, shapes, biases) are kept for the whole run whatever the budget.
SMALL_CONST_BYTES = 1 << 20


class ConstStore:
    """Constants as the runs read them, (emulated, reference): small ones for the whole run, large ones until their
    last reader in a sample, or across samples within the hold budget (which onnxruntime's kept segments share)."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.pairs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._held: set[int] = set()  # kept across samples
        self._small: set[int] = set()
        self.held_bytes = 0  # of weights kept across samples: these constants and onnxruntime's kept segments
        self._lock = threading.Lock()
        self.final = False  # the sample running is the last: keep nothing for a next one

    def read(self, value: Value, which: int) -> np.ndarray:
        """A constant as a run reads it: which 0 the emulated copy, 1 the reference's."""
        pair = self.pairs.get(id(value))
        if pair is None:
            pair = self.pairs[id(value)] = self._pair(value)
            nbytes = sum({id(a): a.nbytes for a in pair}.values())
            if nbytes <= SMALL_CONST_BYTES:
                self._small.add(id(value))
                self._held.add(id(value))
            elif self.may_hold(nbytes):
                self._held.add(id(value))
        return pair[which]

    def drop(self, values: list[Value]) -> None:
        """Constants no later step reads, unless kept for the next sample."""
        for value in values:
            if id(value) not in self._held or (self.final and id(value) not in self._small):
                self.pairs.pop(id(value), None)

    def may_hold(self, nbytes: int) -> bool:
        """Whether weights of nbytes may be kept for the next sample (and count them if so). Thread-safe: onnxruntime's
        segments ask from the main thread while their measurements, on a second thread, read constants."""
        with self._lock:
            if self.final or self.held_bytes + nbytes > HOLD_BYTES:
                return False
            self.held_bytes += nbytes
            return True

    def release(self) -> None:
        """Drop every constant kept for later samples but the small ones; the budget starts again."""
        for vid in self._held:
            if vid not in self._small:
                self.pairs.pop(vid, None)
        self._held = set(self._small)
        self.held_bytes = 0

    def _pair(self, value: Value) -> tuple[np.ndarray, np.ndarray]:
        """A constant as the emulated run holds it (clamped where the --converter clamps it, rounded into its
        format) and as the reference does; one array for both where that changes nothing (an fp16 weight held in
        fp16) or where no node reads the converted copy."""
        data = np.asarray(value.const())
        reference = as_reference(data)
        plan = self.plan
        if plan.formats.stored_as_held(value, data) or id(value) in plan.unconverted:
            return reference, reference
        clamp = plan.const_clamps.get(id(value))
        return round_into(clamp.array(data) if clamp is not None else as_float(data, np.float32),
                          plan.held(value)), reference
