"""What sign a value can take, from the ops that made it: can it be exactly zero, can it go negative?

The classes, from safest: positive (> 0 by construction: x + eps, clamp(min > 0), exp, softmax),
nonneg (>= 0 and can be exactly 0: relu, abs, a square, a norm), signed (can be negative: a difference),
unknown (anything else: graph inputs, matmuls). Underflow of exp/softmax/sigmoid to 0 is left to the rules
about those idioms, so that one hazard gives one finding.
"""

from __future__ import annotations

from ..dtypes import round_to_format
from ..ir import Node, Value
from .constants import resolve_scalar

__all__ = ["SignAnalysis"]

_PASS = {"Cast", "Identity", "Reshape", "Expand", "Unsqueeze", "Squeeze", "Flatten", "Transpose", "Gather",
         "Slice", "Tile", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceSum", "Split"}
_POSITIVE = {"Exp", "Softmax", "Sigmoid", "Softplus"}
_NONNEG = {"Relu", "Abs", "ReduceL2", "ReduceSumSquare", "ReduceL1", "ReduceVar", "LpNormalization"}
_SIGNED = {"Sub", "Neg"}
_ORDER = {"positive": 0, "nonneg": 1, "signed": 2, "unknown": 3}


class SignAnalysis:
    """Memoized sign classes of the values of one graph.

    With a resolver, a guard's constant (Max(x, 1e-12), Clip(min=1e-12)) counts as it is after rounding into the
    dtype the guard runs in: 1e-12 is 0.0 in fp16 and guards nothing there.
    """

    def __init__(self, resolver=None) -> None:
        self._memo: dict[int, str] = {}
        self._resolver = resolver

    def of(self, value: Value | None) -> str:
        """The sign class of a value, from the ops upstream of it.

        Walks the producers depth-first with an explicit stack, so a chain of any length costs no Python
        recursion: a node's inputs are classed in order before the node, each value once. A value met again
        while its own class is still being worked out (a loop-carried value) counts as 'unknown' for that
        reader, as the memo says while it is on the path.
        """
        if value is None:
            return "unknown"
        memo = self._memo
        key = id(value)
        if key in memo:
            return memo[key]
        # each frame: [value, its producer, the producer's inputs, the classes of those inputs found so far]
        frame = self._enter(value)
        stack = [frame] if frame is not None else []
        while stack:
            frame = stack[-1]
            node, inputs, ins = frame[1], frame[2], frame[3]
            while len(ins) < len(inputs):
                upstream = inputs[len(ins)]
                known = memo.get(id(upstream))
                if known is None:
                    child = self._enter(upstream)
                    if child is not None:
                        stack.append(child)
                        break
                    known = memo[id(upstream)]
                ins.append(known)
            else:
                stack.pop()
                result = memo[id(frame[0])] = self._of_node(node, ins)
                if stack:
                    stack[-1][3].append(result)
        return memo[key]

    def _enter(self, value: Value) -> list | None:
        """Start on a value not seen yet: class it at once (a constant, a graph input), or return the frame
        that classes it from its producer's inputs. Meanwhile the value counts as 'unknown' (cycles)."""
        key = id(value)
        self._memo[key] = "unknown"  # guards against cycles (loop-carried values)
        const = resolve_scalar(value)
        if const is not None:
            self._memo[key] = "positive" if const.value > 0 else "nonneg" if const.value == 0 else "signed"
            return None
        node = value.producer
        if node is None:
            return None
        return [value, node, [v for v in node.inputs if v is not None], []]

    def _of_node(self, node: Node, ins: list[str]) -> str:
        """A node's output class from its op and the classes of its (present) inputs, in order."""
        op = node.op_type
        if op in _POSITIVE:
            return "positive"
        if op in _NONNEG:
            return "nonneg"
        if op in _SIGNED:
            return "signed"
        if op == "Sqrt":  # the root of a positive value is positive (a Gaussian's std from exp(logvar))
            return "positive" if ins and ins[0] == "positive" else "nonneg"
        if op == "Pow":
            exponent = resolve_scalar(node.input(1))
            if exponent is not None and exponent.value % 2 == 0:
                return "positive" if ins[0] == "positive" else "nonneg"
            return ins[0] if ins and ins[0] in ("positive", "nonneg") else "unknown"
        if op == "Mul":
            if node.input(0) is node.input(1):
                return "nonneg"
            return _worst(ins) if all(c in ("positive", "nonneg") for c in ins) else "unknown"
        if op == "Add":
            if all(c in ("positive", "nonneg") for c in ins):
                return "positive" if "positive" in ins else "nonneg"
            return "unknown"
        if op in ("Max", "Clip"):
            floor = self._floor(node)
            if floor is not None:
                return floor
            return "unknown"
        if op == "Div":
            return _worst(ins) if all(c in ("positive", "nonneg") for c in ins) else "unknown"
        if op == "Reciprocal":
            return ins[0] if ins and ins[0] == "positive" else "unknown"
        if op == "Concat":
            return _worst(ins)
        if op in _PASS and ins:
            return ins[0]
        return "unknown"

    def _floor(self, node: Node) -> str | None:
        """The sign a Max(x, c) or Clip(x, min=c) is guaranteed by its constant floor."""
        if node.op_type == "Clip":
            const = resolve_scalar(node.input(1)) if node.input(1) is not None else None
            value = const.value if const is not None else node.attrs.get("min")
        else:
            consts = [resolve_scalar(v) for v in node.inputs[1:]] + [resolve_scalar(node.input(0))]
            value = max((c.value for c in consts if c is not None), default=None)
        if value is None:
            return None
        dtype = self._resolver.of_node(node) if self._resolver is not None else None
        if dtype is not None:
            value = round_to_format(float(value), dtype.fmt)
        return "positive" if value > 0 else "nonneg" if value == 0 else None


def _worst(classes: list[str]) -> str:
    return max(classes, key=_ORDER.__getitem__) if classes else "unknown"
