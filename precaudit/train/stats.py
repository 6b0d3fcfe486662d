"""What one traced training step measures per parameter: its gradient in the regime against the float32 step's
(elements lost to 0, the direction), at the loss scale the run trains with and at the largest one that keeps the
backward finite; its updates that did not land; and the loss-scale window the gradients allow.

Each statistic reads every element once or twice: these run over every weight of the model, several gradients of
each, and a pass that allocates a copy costs more there than the arithmetic does. What a pass must write (a mask,
the scaled gradient) goes into a Scratch tensor reused from parameter to parameter: fresh pages as large as a
gradient cost more to touch than to compute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["KEEP_FRACTION", "NOISE_CHECK_COSINE", "REF_NOISE_COSINE", "UNDERFLOW_COSINE", "Agreement", "ParamStats",
           "Scratch", "above_noise", "lost_share", "subnormal_share", "top_scale", "window"]

KEEP_FRACTION = 0.999  # the loss-scale window's bottom keeps this share of the reference's nonzero gradient elements
NOISE_CHECK_COSINE = 0.999  # a regime gradient this far from float32's has float32's checked against float64
REF_NOISE_COSINE = 0.9  # float32's gradient this far from float64's is rounding noise
# a gradient this far from the one a higher loss scale gives has lost its direction to underflow (PA455's cosine:
# more than 8 degrees); the loss-scale findings name the parameters past it
UNDERFLOW_COSINE = 0.99


@dataclass
class ParamStats:
    name: str
    elements: int
    weights_dtype: str
    ref_nonzero: int  # elements of the reference's gradient that are not 0
    underflow_unscaled: float  # of those, the share the regime's gradient has as 0 with no loss scaling
    underflow_scaled: float  # ... at the loss scale the run trains with (the same as unscaled without a scaler)
    subnormal_scaled: float  # ... the share whose scaled gradient is subnormal in the low dtype
    cosine: float | None  # of the regime's gradient (as it trains: unscaled back) against the reference's
    rel_error: float | None
    ref_changed: int  # element updates the reference's steps made (an element moved at two steps counts twice)
    absorbed: int  # of those, the updates the regime's step at the same step left bit-identical
    lr: float
    absmedian: float  # the median |weight|, for the message
    grad_absmax: float = 0.0  # the reference gradient's largest |element| (the HTML report's chart)
    grad_min_nonzero: float | None = None  # ... and its smallest nonzero one (None: all 0)
    # where the regime's gradient points elsewhere (cosine < NOISE_CHECK_COSINE): float32's own gradient against
    # a float64 run's; low, float32's gradient is rounding noise too (a key bias under softmax's shift
    # invariance has an exact gradient of 0), and no comparison with it means anything
    ref_cosine_f64: float | None = None
    # float16 regimes, where a larger loss scale than the run's keeps the backward finite and the run's gradient
    # was in doubt: the gradient at that scale (the least underflow there is) against float32's, and the run's
    # against it — what underflow at the run's scale cost. Without that run: the run's own numbers
    cosine_best: float | None = None
    rel_error_best: float | None = None
    underflow_best: float = 0.0  # of the elements above float32's noise (above_noise), the share 0 there
    underflow_cosine: float | None = None

    @property
    def ref_noise(self) -> bool:
        return self.ref_cosine_f64 is not None and self.ref_cosine_f64 < REF_NOISE_COSINE

    @property
    def lost_elements(self) -> int:
        """The reference's nonzero elements that are 0 at the run's loss scale."""
        return round(self.underflow_scaled * self.ref_nonzero)

    def underflows(self) -> bool:
        """Whether underflow at the run's scale costs this gradient elements or its direction."""
        return self.underflow_scaled > 1 - KEEP_FRACTION or (
            self.underflow_cosine is not None and self.underflow_cosine < UNDERFLOW_COSINE)


class Scratch:
    """Tensors the statistics write into, one per purpose, grown to the largest gradient and reused for the rest."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def like(self, purpose: str, t: torch.Tensor, dtype: torch.dtype = torch.bool) -> torch.Tensor:
        """A tensor of t's shape in dtype (contiguous; its values are whatever the last use left)."""
        n = t.numel()
        held = self._held.get((purpose, dtype))
        if held is None or held.numel() < n:
            held = self._held[(purpose, dtype)] = torch.empty(n, dtype=dtype, device=t.device)
        return held[:n].view(t.shape)


class Agreement:
    """One gradient compared with others: each vector divided by its largest |element| once (squares of gradients
    below 1e-19 underflow float32), its norm kept, so each comparison is one dot product. out: a float32 tensor of
    g's size to hold the unit vector (it is this Agreement's until its last comparison)."""

    def __init__(self, g: torch.Tensor, out: torch.Tensor | None = None):
        self.scale, self.unit, self.norm = _unit(g, out)

    def against(self, other: Agreement) -> tuple[float | None, float | None]:
        """The cosine of other against this, and |other - this| / |this|; None where this is 0 or either is not
        finite. The relative error from the norms and the dot product: |b - a|^2 = |b|^2 + |a|^2 - 2 a.b."""
        if not (self.scale > 0 and math.isfinite(self.scale) and math.isfinite(other.scale)):
            return None, None
        if other.scale == 0:
            return 0.0, 1.0
        dot = float(torch.dot(self.unit, other.unit))
        cosine = min(1.0, max(-1.0, dot / (self.norm * other.norm)))
        ratio = other.scale / self.scale  # other = ratio * other.unit in self's units
        square = (ratio * other.norm) ** 2 + self.norm ** 2 - 2 * ratio * dot
        return cosine, math.sqrt(max(square, 0.0)) / self.norm


def _unit(g: torch.Tensor, out: torch.Tensor | None) -> tuple[float, torch.Tensor, float]:
    flat = g.detach().flatten()
    flat = flat if flat.dtype == torch.float32 else flat.float()
    if not flat.numel():
        return 0.0, flat, 0.0
    low, high = torch.aminmax(flat)
    scale = max(-float(low), float(high))
    if not (scale > 0 and math.isfinite(scale)):
        return scale, flat, 0.0
    unit = flat / scale if out is None else torch.div(flat, scale, out=out.view(-1))
    return scale, unit, float(torch.linalg.vector_norm(unit))


def lost_share(nonzero: torch.Tensor | None, grad: torch.Tensor | None, total: int,
               scratch: Scratch | None = None) -> float:
    """Of the reference's nonzero elements (the mask; None: every element), the share this gradient has as 0."""
    if not total or grad is None:
        return 0.0
    if nonzero is None:  # count_nonzero's own test is != 0: a NaN counts as nonzero, -0.0 as 0, as == 0 has them
        return (grad.numel() - int(torch.count_nonzero(grad))) / total
    zero = grad == 0 if scratch is None else torch.eq(grad, 0, out=scratch.like("zero", grad))
    return int(torch.count_nonzero(zero.logical_and_(nonzero))) / total


def above_noise(g_ref: torch.Tensor) -> torch.Tensor:
    """The reference's gradient elements above float32's own rounding noise: at least 2^-23 (float32's epsilon) of
    the gradient's largest |element|. Smaller ones float32 cannot tell from 0 (an attention key's bias, whose exact
    gradient is 0, has elements of 1e-12 beside others of 1e-3): no loss scale is needed to keep them."""
    magnitude = g_ref.abs()
    return magnitude >= float(magnitude.max()) * 2.0 ** -23


def subnormal_share(nonzero: torch.Tensor | None, grad: torch.Tensor | None, scale: float, total: int, low,
                    scratch: Scratch) -> float:
    """Of the reference's nonzero elements (None: every element), the share whose gradient, times the scale, is
    subnormal in low."""
    if grad is None or not total:
        return 0.0
    held = torch.mul(grad, scale, out=scratch.like("held", grad, grad.dtype)).abs_()
    tiny = torch.lt(held, low.smallest_normal, out=scratch.like("tiny", grad))
    tiny.logical_and_(torch.gt(held, 0, out=scratch.like("zero", grad)))
    if nonzero is not None:
        tiny.logical_and_(nonzero)
    return int(torch.count_nonzero(tiny)) / total


def top_scale(backward_max: float, low) -> float | None:
    """The largest power of two a loss scale can take before the backward's largest value (measured unscaled, in
    the low dtype) overflows it; None when nothing was measured."""
    if not (backward_max > 0 and math.isfinite(backward_max)):
        return None
    largest = 2.0 ** math.floor(math.log2(low.overflow_threshold / backward_max))
    if largest * backward_max >= low.overflow_threshold:
        largest /= 2
    return largest


def window(ref_grads: dict[str, torch.Tensor | None], backward_max: float, low) -> tuple[float | None, float | None]:
    """The powers of two a loss scale can take: the smallest that keeps KEEP_FRACTION of the reference's nonzero
    gradient elements from rounding to 0 in the low dtype (an estimate: it assumes each element is rounded there
    as it is), and top_scale."""
    # frexp: |g| = m * 2**e with m in [0.5, 1); g * 2**k is nonzero in the low dtype when e + k >= log2 of its
    # smallest subnormal (g * 2**k > half of it; the exact tie rounds to 0)
    floor = round(math.log2(low.smallest_subnormal))
    counts: dict[int, int] = {}
    total = 0
    scratch = Scratch()
    for g in ref_grads.values():
        if g is None or not g.numel():
            continue
        # frexp's exponent read off float32's bits (five times faster than frexp): biased exponent b is 2**(b-127)
        # for a normal number, so frexp's e = b - 126; b = 0 holds the zeros and float32's subnormals, which no
        # loss scale below 2**100 lifts: counted at the lowest exponent
        bits = g.float().view(torch.int32)
        exponent = torch.bitwise_right_shift(bits, 23, out=scratch.like("bits", bits, torch.int32)).bitwise_and_(0xFF)
        biased = torch.bincount(exponent.flatten(), minlength=256).tolist()
        zeros = g.numel() - int(torch.count_nonzero(g))
        biased[0] -= zeros
        for b, c in enumerate(biased):
            if c:
                e = b - 126 if b else -149
                counts[e] = counts.get(e, 0) + c
        total += g.numel() - zeros
    smallest = None
    if total:
        allowed = (1 - KEEP_FRACTION) * total
        lost = 0
        for e in sorted(counts):  # the scale must lift every exponent above what may be lost
            if lost + counts[e] > allowed:
                smallest = 2.0 ** (floor - e)
                break
            lost += counts[e]
    return smallest, top_scale(backward_max, low)
