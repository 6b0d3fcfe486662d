"""Each step's outputs folded into per-value stats, against a noise floor, and the hooks that measure the step."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import InputError
from ..ir import Graph
from .plan import Step
from .stats import ValueStats

__all__ = ["Meter", "reads_inputs"]

_CANCELLING = {"Add", "Sub", "Sum", "ReduceMean", "ReduceSum", "MatMul", "Gemm", "Conv", "Einsum"}
_CARRIES_NOISE = {"Identity", "Cast", "Reshape", "Expand", "Squeeze", "Unsqueeze", "Transpose", "Flatten", "Mul", "Div",
                  "Neg", "Abs", "Concat", "Slice", "Gather", "Split"}
# A sum or difference smaller than this fraction of its inputs is float32 cancellation noise. It is also below
# every narrow format's own rounding error of those inputs (bf16: 4e-3, fp16: 5e-4), so it cannot be a value
# that the format should have kept: calling it an underflow would be wrong.
_NOISE = 1e-5
# Elementwise sums and differences: their noise floor is judged per element, from their inputs.
_LOCAL_FLOOR_OPS = ("Add", "Sub")


def reads_inputs(step: Step) -> bool:
    """Whether measuring a node reads its inputs, not only its outputs: its hooks, or an elementwise noise floor."""
    return bool(step.hooks) or step.node.op_type in _LOCAL_FLOOR_OPS


class Meter:
    """The per-value stats of a run (stats, by value id), merged over its samples."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.stats: dict[int, ValueStats] = {}
        self.samples: dict[int, tuple[float, tuple]] = {}  # this sample's counts per value, for rearranged values

    def measure(self, step: Step, ref_args: list, emu_args: list, ref_outs: list, emu_outs: list) -> None:
        """Fold one node's outputs into the per-value stats and call its hooks.

        An output given as None was not fetched: only a node that rearranges its input's numbers (whose
        sample is its input's) may leave its outputs out.
        """
        floor = self._noise_floor(step)
        local = _local_floor(step, ref_args)
        for (vid, fmt), r, e in zip(step.outputs, ref_outs, emu_outs):
            if fmt is None or (r is not None and r.dtype.kind != "f"):
                continue
            # a rearranged value holds its input's numbers: its input's sample, measured once, counts for both
            known = self.samples.get(step.rearranges) if step.rearranges is not None else None
            if r is None and known is None:
                continue
            if known is None and e is not None and np.shape(e) != np.shape(r):
                raise InputError(self.graph.path, f"traced mode: node '{step.node.name}' ({step.node.op_type}) gives "
                                                  f"shape {np.shape(r)} in the float reference and {np.shape(e)} "
                                                  f"in {fmt.long_name}: the emulated run took another path (a "
                                                  f"shape or a loop count computed from data, as NonZero or a Loop "
                                                  f"condition do)")
            stats = self.stats.get(vid)
            if stats is None:
                stats = self.stats[vid] = ValueStats(fmt)
            value_floor, sample = known if known is not None else (floor, stats.measure(r, e, floor, local))
            stats.merge(sample, value_floor)
            self.samples[vid] = (value_floor, sample)
        for hook in step.hooks:
            hook(ref_args, emu_args, ref_outs, emu_outs)

    def _noise_floor(self, step: Step) -> float:
        """Below this, a sum or difference of the inputs is float32 rounding noise, not a value that underflows.

        The mean of a normalized row is ~1e-8 in the reference: calling that an fp16 underflow would be wrong.
        Only ops that add or subtract can cancel; an exp of -30 is genuinely tiny. Input ranges come from the
        stats already gathered, so this costs no pass over the data.
        """
        known = [self.stats[id(v)] for v in step.inputs if v is not None and id(v) in self.stats]
        if step.node.op_type in _CANCELLING:
            return max((s.absmax for s in known), default=0.0) * _NOISE
        if step.node.op_type in _CARRIES_NOISE:  # noise moved or scaled is still noise
            return max((s.noise_floor for s in known), default=0.0)
        return 0.0


def _local_floor(step: Step, ref_args: list) -> Callable[[np.ndarray], np.ndarray] | None:
    """An elementwise sum or difference, per element: noise only where it is small against its own inputs.

    Adding an eps to a variance of exactly 0 gives the eps, exactly, however large other rows are.
    """
    if step.node.op_type not in _LOCAL_FLOOR_OPS or len(ref_args) != 2 or any(a is None for a in ref_args):
        return None
    a, b = ref_args

    def floor(mask: np.ndarray) -> np.ndarray:  # only where the mask (the tiny outputs) says: a few elements
        pick_a, pick_b = np.broadcast_to(a, mask.shape)[mask], np.broadcast_to(b, mask.shape)[mask]
        return _NOISE * np.maximum(np.abs(pick_a), np.abs(pick_b))
    return floor
