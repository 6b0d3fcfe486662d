"""Weights fed to onnxruntime segments: read from the model when a segment runs, widened, clamped and rounded."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np
from onnx import TensorProto, helper

from ..converters import Clamp
from ..ir import Value
from .fallback import as_reference
from .ort_nodes import NARROW_FORMAT, contiguous
from .rounding import round_into

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = ["WeightFeeder"]


class WeightFeeder:
    """Reads a segment's weights as its session takes them, with one-Cast sessions of its own to widen and round."""

    def __init__(self) -> None:
        # a one-Cast session, made when the first float16 weight is fed
        self._widener: ort.InferenceSession | Literal[False] | None = None
        # per narrow type, a Cast-pair session that rounds weights
        self._rounders: dict[int, ort.InferenceSession | Literal[False]] = {}
        self._clamp_changes: dict[int, bool] = {}  # per weight under a --converter clamp: does the clamp change it

    def feeds(self, weights: list[tuple[str, Value]], clamps: list[tuple[str, str, Clamp]],
              rounded: list[tuple[str, str, int, Clamp | None]]) -> dict[str, np.ndarray]:
        """A segment's weights as its session reads them, read from the model now, one at a time: in the
        reference's dtype (float32 for narrow floats), anything else as it is; then their clamped and rounded copies
        (Segment says which). External data is memory-mapped, so a float32 weight is handed over as the file's pages,
        and a float16 one is widened straight from them."""
        feeds = {}
        clamp: Clamp | None
        for name, value in weights:
            data = np.asarray(value.const())
            feeds[name] = self.widen(data) if data.dtype == np.float16 else contiguous(as_reference(data))
            del data  # (its mapping goes with it)
        for name, clamped, clamp in clamps:
            feeds[clamped] = clamp.array(feeds[name])
        for name, source, narrow, clamp in rounded:
            feeds[name] = self.round(clamp.array(feeds[source]) if clamp is not None else feeds[source], narrow)
        return feeds

    def round(self, data: np.ndarray, narrow: int) -> np.ndarray:
        """A float32 weight rounded into a narrow type and back, by onnxruntime's Cast pair (what the session would
        do), into an array precaudit owns."""
        session = self._rounders.get(narrow)
        if session is None:
            session = self._rounders[narrow] = _caster([(TensorProto.FLOAT, narrow), (narrow, TensorProto.FLOAT)])
        out = np.empty(data.shape, np.float32)
        if session is False or data.size == 0:
            np.copyto(out, round_into(data, NARROW_FORMAT[narrow]))
            return out
        binding = session.io_binding()
        binding.bind_cpu_input("x", contiguous(data))
        binding.bind_output("y", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
        session.run_with_iobinding(binding)
        return out

    def widen(self, data: np.ndarray) -> np.ndarray:
        """float16 → float32 (exact) by onnxruntime's Cast, into an array precaudit owns: 5x numpy's astype, and the
        float32 copy is freed with the segment, not kept in onnxruntime's arena for the rest of the run."""
        if self._widener is None:
            self._widener = _caster([(TensorProto.FLOAT16, TensorProto.FLOAT)])
        out = np.empty(data.shape, np.float32)
        if self._widener is False or data.size == 0:
            np.copyto(out, data)
            return out
        binding = self._widener.io_binding()
        binding.bind_cpu_input("x", contiguous(data))
        binding.bind_output("y", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
        self._widener.run_with_iobinding(binding)
        return out

    def changed_by(self, v: Value, clamp: Clamp) -> bool:
        """Whether the clamp changes any of a weight's numbers (read once, a few million at a time)."""
        known = self._clamp_changes.get(id(v))
        if known is None:
            flat = np.asarray(v.const()).reshape(-1)
            known = False
            for start in range(0, flat.size, 1 << 22):
                a = np.abs(flat[start:start + (1 << 22)].astype(np.float32))
                if ((a > 0) & (a < clamp.min_positive)).any() or ((a > clamp.max_finite) & np.isfinite(a)).any():
                    known = True
                    break
            del flat
            self._clamp_changes[id(v)] = known
        return known


def _caster(casts: list[tuple[int, int]]) -> ort.InferenceSession | Literal[False]:
    """A session of Casts x → y (each (from, to)) without an arena: its outputs are precaudit's arrays (the widener
    of float16 weights, the rounders of float32 ones); False where onnxruntime will not build it (numpy does it then)."""
    import onnxruntime as ort

    names = ["x", *(f"c{k}" for k in range(len(casts) - 1)), "y"]
    nodes = [helper.make_node("Cast", [names[k]], [names[k + 1]], to=to) for k, (_, to) in enumerate(casts)]
    graph = helper.make_graph(nodes, "precaudit_cast", [helper.make_tensor_value_info("x", casts[0][0], None)],
                              [helper.make_tensor_value_info("y", casts[-1][1], None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = False
    try:
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception:
        return False
