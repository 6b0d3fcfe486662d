"""What traced mode measures: per value, at norm statistics and at the inputs of exp, log, sqrt and division."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..dtypes import Format

__all__ = ["InputStats", "ValueStats", "VarianceStats"]


@dataclass
class ValueStats:
    """One float value over every sample: its range in the float32 reference, and what the emulated run made of it.

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
    ref_nan: int = 0  # NaN in the reference: a log or sqrt of a negative, 0/0 (the data's or the model's, any dtype)
    max_error: float = 0.0  # largest |emulated - reference| where both are finite
    noise_floor: float = 0.0  # reference values at or below this are rounding noise (see Meter._noise_floor)

    def add(self, ref: np.ndarray, emu: np.ndarray, noise_floor: float = 0.0) -> None:
        """Count one sample; reference values at or below noise_floor are cancellation noise, not underflow."""
        self.merge(self.measure(ref, emu, noise_floor), noise_floor)

    def merge(self, sample: tuple, noise_floor: float = 0.0) -> None:
        """Fold in one sample's counts, as measure() gave them for this format and noise floor."""
        self.noise_floor = max(self.noise_floor, noise_floor)
        (size, ref_nonfinite, absmax, overflow, nonzero, underflow, subnormal, min_nonzero, nonfinite,
         max_error, ref_nan) = sample
        self.elements += size
        if size == 0:
            return
        self.ref_nonfinite += ref_nonfinite
        self.ref_nan += ref_nan
        self.absmax = max(self.absmax, absmax)
        self.overflow += overflow
        self.nonzero += nonzero
        self.underflow += underflow
        self.subnormal += subnormal
        self.min_nonzero = min(self.min_nonzero, min_nonzero)
        self.nonfinite += nonfinite
        self.max_error = max(self.max_error, max_error)

    def measure(self, ref: np.ndarray, emu: np.ndarray, noise_floor: float = 0.0,
                local_floor: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple:
        """One sample's counts: (elements, ref_nonfinite, absmax, overflow, nonzero, underflow, subnormal,
        min_nonzero, nonfinite, max_error, ref_nan).

        The common case costs a few passes (_passes, or _passes_chunked for a large value): |ref| with its max and
        min, and emu - ref with its max and min. The finer counts run only when those bounds cannot rule them out (a
        finite max proves every element finite, a min at or above the smallest normal proves nothing underflows), and
        then on the few values below the smallest normal. Non-finite values fall back to _measure_exact, which counts
        everything on the whole array. local_floor, where given, gives the elements a mask selects their own noise
        floor (an elementwise sum is noise only where it is small against its own two inputs, not the whole tensor's).
        """
        size = ref.size
        if size == 0:
            return (0, 0, 0.0, 0, 0, 0, 0, math.inf, 0, 0.0, 0)
        fmt = self.fmt
        chunked = (size >= 2 * _CHUNK and ref.dtype == emu.dtype and ref.shape == emu.shape
                   and ref.flags.c_contiguous and emu.flags.c_contiguous)
        passes = self._passes_chunked(ref, emu) if chunked else self._passes(ref, emu)
        if passes is None:  # an inf or NaN in either run
            return self._measure_exact(ref, emu, noise_floor, local_floor=local_floor)
        amax, amin, overflow, below, tiny, max_error, a = passes
        underflow = subnormal = 0
        nonzero, min_nonzero = size, amin
        if tiny is not None:  # the finer counts look only at the values below the smallest normal
            zeros = int(np.count_nonzero(tiny == 0)) if amin == 0 else 0
            nonzero = size - zeros
            small = tiny.size - zeros
            if small and noise_floor >= fmt.smallest_normal and local_floor is None:  # noise above the tiny values
                return self._measure_exact(ref, emu, noise_floor, a)
            if small:
                underflow, subnormal = self._tiny_counts(tiny, below, small, noise_floor, local_floor)
            if zeros:
                if small:
                    min_nonzero = float(tiny[tiny > 0].min())
                elif nonzero:
                    a = np.abs(ref) if a is None else a
                    min_nonzero = float(np.min(a, where=a > 0, initial=math.inf))
                else:
                    min_nonzero = math.inf
        return (size, 0, amax, overflow, nonzero, underflow, subnormal, min_nonzero, 0, max_error, 0)

    def _passes(self, ref: np.ndarray, emu: np.ndarray) -> tuple | None:
        """The passes over a whole value: (amax, amin, overflow, below, tiny, max_error, |ref|), where below masks
        and tiny holds the values of |ref| below the smallest normal (None where there are none); None where either
        run holds an inf or a NaN. |ref| and emu - ref go into scratch buffers reused from one call to the next."""
        fmt = self.fmt
        a = np.abs(ref, out=_scratch(ref, 0))
        amax = float(a.max())
        if not math.isfinite(amax):
            return None
        amin = float(a.min())
        overflow = int(np.count_nonzero(a >= fmt.overflow_threshold)) if amax >= fmt.overflow_threshold else 0
        below = tiny = None
        if amin < fmt.smallest_normal:
            below = a < fmt.smallest_normal
            tiny = a[below]
        diff = np.subtract(emu, ref, out=_scratch(ref, 1)) if emu.dtype == ref.dtype else emu - ref
        dmax, dmin = float(diff.max()), float(diff.min())
        if not (math.isfinite(dmax) and math.isfinite(dmin)):  # the emulated run went inf/NaN somewhere
            return None
        return amax, amin, overflow, below, tiny, abs(max(dmax, -dmin)), a

    def _passes_chunked(self, ref: np.ndarray, emu: np.ndarray) -> tuple | None:
        """_passes over a large value _CHUNK elements at a time (|ref| not kept: None in its place).

        Every pass over a chunk reads it from the core's cache: over the whole value, each pass after the first
        read it again from memory. The counts are those of the whole value: maxima, minima and counts combine
        chunk by chunk, and the values below the smallest normal come in the value's order."""
        fmt = self.fmt
        flat_ref, flat_emu = ref.reshape(-1), emu.reshape(-1)
        mask = _scratch(flat_ref, 2, np.bool_)
        a_buffer, diff_buffer = _scratch(flat_ref[:_CHUNK], 0), _scratch(flat_ref[:_CHUNK], 1)
        amax = dmax = -math.inf
        amin = dmin = math.inf
        overflow = 0
        tinies = []
        for start in range(0, flat_ref.size, _CHUNK):
            r = flat_ref[start:start + _CHUNK]
            n = r.size
            a = np.abs(r, out=a_buffer[:n])
            chunk_max = float(a.max())
            if not math.isfinite(chunk_max):
                return None
            chunk_min = float(a.min())
            if chunk_max >= fmt.overflow_threshold:
                overflow += int(np.count_nonzero(a >= fmt.overflow_threshold))
            below = mask[start:start + n]
            if chunk_min < fmt.smallest_normal:
                tinies.append(a[np.less(a, fmt.smallest_normal, out=below)])
            else:
                below[...] = False
            diff = np.subtract(flat_emu[start:start + n], r, out=diff_buffer[:n])
            chunk_dmax, chunk_dmin = float(diff.max()), float(diff.min())
            if not (math.isfinite(chunk_dmax) and math.isfinite(chunk_dmin)):
                return None
            amax, amin = max(amax, chunk_max), min(amin, chunk_min)
            dmax, dmin = max(dmax, chunk_dmax), min(dmin, chunk_dmin)
        if amin >= fmt.smallest_normal:
            return amax, amin, overflow, None, None, abs(max(dmax, -dmin)), None
        return amax, amin, overflow, mask.reshape(ref.shape), np.concatenate(tinies), abs(max(dmax, -dmin)), None

    def _measure_exact(self, ref: np.ndarray, emu: np.ndarray, noise_floor: float, a: np.ndarray | None = None,
                       local_floor: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple:
        """measure() for any array: every count taken in full (non-finite values, zeros, underflow, noise)."""
        fmt = self.fmt
        if a is None:
            a = np.abs(ref)
        ref_finite = np.count_nonzero(np.isfinite(a)) if not np.isfinite(a.max()) else a.size
        ref_nonfinite = a.size - ref_finite
        ref_nan = int(np.count_nonzero(np.isnan(a))) if ref_nonfinite else 0
        if ref_finite < a.size:
            a = np.where(np.isfinite(a), a, 0.0)
        absmax = float(a.max())
        # 65519 still rounds to 65504 in fp16: only from max + half an ulp does a value become inf
        overflow = int(np.count_nonzero(a >= fmt.overflow_threshold))
        zeros = a.size - int(np.count_nonzero(a))
        nonzero = a.size - zeros
        below = a < fmt.smallest_normal
        small = int(np.count_nonzero(below)) - zeros
        underflow = subnormal = 0
        if small:  # the rare path: only values with tiny entries pay for the finer counts
            underflow, subnormal = self._tiny_counts(a[below], below, small, noise_floor, local_floor)
        min_nonzero = float(np.min(a, where=a > 0, initial=math.inf)) if nonzero else math.inf
        emu_finite = np.isfinite(emu)
        n_emu_finite = int(np.count_nonzero(emu_finite))
        nonfinite = emu.size - n_emu_finite
        if n_emu_finite == emu.size and ref_finite == a.size:
            diff = np.abs(emu - ref)
        else:
            both = emu_finite & np.isfinite(ref)
            diff = np.where(both, np.abs(np.where(both, emu, 0) - np.where(both, ref, 0)), 0)
        return (a.size, ref_nonfinite, absmax, overflow, nonzero, underflow, subnormal, min_nonzero, nonfinite,
                float(diff.max()), ref_nan)

    def _tiny_counts(self, tiny: np.ndarray, below: np.ndarray, small: int, noise_floor: float,
                     local_floor: Callable[[np.ndarray], np.ndarray] | None) -> tuple[int, int]:
        """(underflow, subnormal) among the values below the smallest normal (`tiny`, selected by `below`; `small`
        of them nonzero): values at or below the noise floor are cancellation noise and count as neither."""
        floor = noise_floor if local_floor is None else local_floor(below)
        noise = int(np.count_nonzero((tiny > 0) & (tiny <= floor))) if noise_floor > 0 else 0
        underflow = int(np.count_nonzero((tiny > floor) & (tiny <= self.fmt.smallest_subnormal / 2)))
        return underflow, small - underflow - noise

    def fraction(self, count: int) -> float:
        return count / self.elements if self.elements else 0.0

    @property
    def rel_error(self) -> float:
        return self.max_error / self.absmax if self.absmax > 0 else 0.0


# Elements per pass of ValueStats._passes_chunked: a chunk of ref, of emu, of |ref| and of emu - ref (1 MB in float32)
# stays in a core's L2 cache. Measured on BERT-base (2-core machine): the measuring thread's CPU time per sample
# down by about a tenth; smaller chunks pay more in per-call overhead than they save.
_CHUNK = 1 << 16
_SCRATCH: dict[tuple, np.ndarray] = {}


def _scratch(like: np.ndarray, slot: int, dtype: type | None = None) -> np.ndarray:
    """A buffer shaped like `like` (of its dtype, or of `dtype`), reused across calls: allocating arrays per value
    per sample costs more than the passes that fill them. Its contents live until the next call that asks for the
    same slot (one thread measures at a time: the onnxruntime engine's measuring thread, or the numpy engine's)."""
    key = (dtype or like.dtype, slot)
    buffer = _SCRATCH.get(key)
    if buffer is None or buffer.size < like.size:
        buffer = _SCRATCH[key] = np.empty(max(like.size, 1 << 16), dtype=key[0])
    return buffer[:like.size].reshape(like.shape)


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
    ref_negative: int = 0
    output_nonfinite: int = 0  # inf/NaN in the op's emulated output

    def add(self, ref: np.ndarray, emu: np.ndarray, emu_out: np.ndarray) -> None:
        """Fold in one sample; a large input (a softmax's at sequence 512: 3M values a layer) _CHUNK values at a
        time, so that its dozen passes read each chunk from cache (extremes and counts combine chunk by chunk)."""
        self.elements += ref.size
        if ref.size == 0:
            return
        for r, e in _chunks(ref, emu):
            finite = r[np.isfinite(r)] if not np.isfinite(r).all() else r
            if finite.size:
                self.max = max(self.max, float(finite.max()))
                self.min = min(self.min, float(finite.min()))
                self.min_abs = min(self.min_abs, float(np.abs(finite).min()))
            self.zero += int(np.count_nonzero(e == 0))
            self.negative += int(np.count_nonzero(e < 0))
            self.ref_zero += int(np.count_nonzero(r == 0))
            self.ref_negative += int(np.count_nonzero(r < 0))
        for (out,) in _chunks(emu_out):
            self.output_nonfinite += out.size - int(np.count_nonzero(np.isfinite(out)))


def _chunks(*arrays: np.ndarray):
    """Arrays of one shape, _CHUNK elements at a time (flattened) where they are large and contiguous; else whole."""
    first = arrays[0]
    if (first.size >= 2 * _CHUNK and all(isinstance(a, np.ndarray) and a.shape == first.shape
                                         and a.flags.c_contiguous for a in arrays)):
        flat = [a.reshape(-1) for a in arrays]
        for start in range(0, first.size, _CHUNK):
            yield tuple(a[start:start + _CHUNK] for a in flat)
    else:
        yield arrays


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
