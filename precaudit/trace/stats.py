"""What traced mode measures: per value, at norm statistics and at the inputs of exp, log, sqrt and division."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..dtypes import Format

__all__ = ["ValueStats", "InputStats", "VarianceStats"]


@dataclass
class ValueStats:
    """One float value over every sample: its range in the float64 reference, and what the emulated run made of it.

    Ranges are taken from the reference because they answer "does this value fit the format?": an
    emulated value that already overflowed only says inf.
    """

    fmt: Format
    elements: int = 0
    absmax: float = 0.0
    min_nonzero: float = math.inf
    nonzero: int = 0
    overflow: int = 0  # |x| that rounds to inf (or NaN): at least half an ulp above the format's max
    underflow: int = 0  # nonzero, but rounds to 0 (|x| at most half the smallest subnormal)
    subnormal: int = 0  # lands among the subnormals
    nonfinite: int = 0  # inf or NaN in the emulated run
    ref_nonfinite: int = 0  # inf or NaN in the reference itself
    max_error: float = 0.0  # largest |emulated - reference| where both are finite
    noise_floor: float = 0.0  # reference values at or below this are rounding noise (see Emulator._noise_floor)

    def add(self, ref: np.ndarray, emu: np.ndarray, noise_floor: float = 0.0) -> None:
        """Count one sample; reference values at or below noise_floor are cancellation noise, not underflow."""
        self.noise_floor = max(self.noise_floor, noise_floor)
        self.elements += ref.size
        if ref.size == 0:
            return
        a = np.abs(ref)
        ref_finite = np.count_nonzero(np.isfinite(a)) if not np.isfinite(a.max()) else a.size
        self.ref_nonfinite += a.size - ref_finite
        if ref_finite < a.size:
            a = np.where(np.isfinite(a), a, 0.0)
        self.absmax = max(self.absmax, float(a.max()))
        # 65519 still rounds to 65504 in fp16: only from max + half an ulp does a value become inf
        self.overflow += int(np.count_nonzero(a >= self.fmt.overflow_threshold))
        zeros = a.size - int(np.count_nonzero(a))
        self.nonzero += a.size - zeros
        small = int(np.count_nonzero(a < self.fmt.smallest_normal)) - zeros
        if small:  # the rare path: only values with tiny entries pay for the finer counts
            noise = int(np.count_nonzero((a > 0) & (a <= noise_floor))) if noise_floor > 0 else 0
            under = int(np.count_nonzero((a > noise_floor) & (a <= self.fmt.smallest_subnormal / 2)))
            self.underflow += under
            self.subnormal += small - under - noise
        if self.nonzero:
            self.min_nonzero = min(self.min_nonzero, float(np.min(a, where=a > 0, initial=math.inf)))
        emu_finite = np.isfinite(emu)
        n_emu_finite = int(np.count_nonzero(emu_finite))
        self.nonfinite += emu.size - n_emu_finite
        if n_emu_finite == emu.size and ref_finite == a.size:
            diff = np.abs(emu - ref)
        else:
            both = emu_finite & np.isfinite(ref)
            diff = np.where(both, np.abs(np.where(both, emu, 0) - np.where(both, ref, 0)), 0)
        self.max_error = max(self.max_error, float(diff.max()))

    def fraction(self, count: int) -> float:
        return count / self.elements if self.elements else 0.0

    @property
    def rel_error(self) -> float:
        return self.max_error / self.absmax if self.absmax > 0 else 0.0


@dataclass
class InputStats:
    """The input an op is sensitive to (exp's argument, log's argument, a divisor) over every sample."""

    elements: int = 0
    max: float = -math.inf  # reference
    min: float = math.inf  # reference
    min_abs: float = math.inf  # reference
    zero: int = 0  # exactly 0.0 in the emulated run
    negative: int = 0  # below 0 in the emulated run
    ref_zero: int = 0
    output_nonfinite: int = 0  # inf/NaN in the op's emulated output

    def add(self, ref: np.ndarray, emu: np.ndarray, emu_out: np.ndarray) -> None:
        self.elements += ref.size
        if ref.size == 0:
            return
        finite = ref[np.isfinite(ref)] if not np.isfinite(ref).all() else ref
        if finite.size:
            self.max = max(self.max, float(finite.max()))
            self.min = min(self.min, float(finite.min()))
            self.min_abs = min(self.min_abs, float(np.abs(finite).min()))
        self.zero += int(np.count_nonzero(emu == 0))
        self.negative += int(np.count_nonzero(emu < 0))
        self.ref_zero += int(np.count_nonzero(ref == 0))
        self.output_nonfinite += emu_out.size - int(np.count_nonzero(np.isfinite(emu_out)))


@dataclass
class VarianceStats:
    """Per-row statistics of a normalization: the variance (or mean square) each row divides by."""

    ref: list[np.ndarray] = field(default_factory=list)  # one array of row variances per sample
    zero_rows: int = 0  # rows whose variance is exactly 0.0 in the emulated run

    def add(self, ref_var: np.ndarray, emu_var: np.ndarray) -> None:
        self.ref.append(np.asarray(ref_var, dtype=np.float64).reshape(-1))
        self.zero_rows += int(np.count_nonzero(np.asarray(emu_var).reshape(-1) == 0))

    def summary(self, eps: float | None) -> dict[str, float | int]:
        rows = np.concatenate(self.ref) if self.ref else np.zeros(0)
        if rows.size == 0:
            return {}
        below = int(np.count_nonzero(rows < eps)) if eps is not None else 0
        return {"rows": int(rows.size), "min_variance": float(rows.min()), "median_variance": float(np.median(rows)),
                "zero_variance_rows": self.zero_rows, "rows_below_eps": below,
                "rows_below_eps_fraction": below / rows.size}
