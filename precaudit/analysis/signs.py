"""What sign a value can take, from the ops that made it: can it be exactly zero, can it go negative?

The classes, from safest: positive (> 0 by construction: x + eps, clamp(min > 0), exp, softmax),
mask (a 0/1 mask and what moves it: every element can be 0), count (a sum or mean of a mask: 0 for a row with
nothing unmasked, an all-padding row), nonneg (>= 0 and can be exactly 0: relu, abs, a square, a norm),
signed (can be negative: a difference), unknown (anything else: graph inputs, matmuls). Underflow of
exp/softmax/sigmoid to 0 is left to the rules about those idioms, so that one hazard gives one finding.

What is a mask, precisely:
- a bool value (a comparison, Not/And/Or/Xor, IsNaN/IsInf, a bool graph input) and anything cast from it;
- a graph input of any numeric type whose name holds the word mask (attention_mask, padding_mask, mask,
  attentionMask, mask.1; not masked_x): HF's int64 attention_mask cast to float is one;
- a mask moved by Cast, Unsqueeze, Expand, Reshape, Transpose, Gather, Slice, ..., multiplied by another mask or
  by a positive number, or subtracted from 1 (the inverted mask).
An integer graph input with another name (input_ids, position_ids) and anything made from shapes (Shape, Range)
is no mask; a Shape or Size itself is positive (dimensions: 0 only in an empty tensor). A count is a
ReduceSum, ReduceMean, ReduceL1, ReduceL2, ReduceSumSquare, ReduceMax, ReduceMin or
CumSum of a mask or a count, and stays one through the same moves, a product with a positive number or another
count, a division by a positive number, and a clamp or Max whose floor is 0 in the dtype it runs in.
"""

from __future__ import annotations

import re

from ..ir import Node, Value
from .constants import resolve_scalar

__all__ = ["SignAnalysis", "is_mask_name"]

_PASS = {"Cast", "Identity", "Reshape", "Expand", "Unsqueeze", "Squeeze", "Flatten", "Transpose", "Gather",
         "Slice", "Tile", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceSum", "Split"}
# Shape and Size count elements: a divisor made from them is a scale (1/sqrt(head_dim) in an exported SDPA, a mean
# over a dim); it is 0 only for an empty tensor, where there is nothing to divide.
_POSITIVE = {"Exp", "Softmax", "Sigmoid", "Softplus", "Shape", "Size"}
_NONNEG = {"Relu", "Abs", "ReduceL2", "ReduceSumSquare", "ReduceL1", "ReduceVar", "LpNormalization"}
_SIGNED = {"Sub", "Neg"}
# ops whose output is bool: a 0/1 mask once cast to a number
_BOOLEAN = {"Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf"}
# a reduction of a mask counts its unmasked elements (or takes their mean, or their max): 0 for an all-padding row
_COUNTING = {"ReduceSum", "ReduceMean", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceMax", "ReduceMin", "CumSum"}
_AT_LEAST_0 = ("positive", "mask", "count", "nonneg")
_ORDER = {"positive": 0, "mask": 1, "count": 2, "nonneg": 3, "signed": 4, "unknown": 5}
# How many of a node's (present) inputs, from the first, _of_node reads the classes of: _ALL, 1, or none (ops not
# listed: their class is fixed, or unknown whatever the inputs). In an acyclic graph only those are classed, so a
# Reshape's shape computation or a MatMul's operands are never walked for a class nobody reads.
_ALL: int = -1
_NEEDS = {**{op: 1 for op in (*_PASS, *_COUNTING, "Sqrt", "Pow", "Reciprocal")},
          **{op: _ALL for op in ("Sub", "Mul", "Add", "Max", "Clip", "Div", "Concat")},
          **{op: 0 for op in (*_BOOLEAN, *_POSITIVE, "Neg")}}
# the word mask in a name: attention_mask, mask, padding_mask, mask.1, attentionMask, masks; not masked_x
_MASK_NAME = re.compile(r"(?:^|[^a-z])masks?(?:[^a-z]|$)|masks?$")


def is_mask_name(name: str) -> bool:
    """Whether a graph input's name says it is a mask (the word mask in it, as a word or at the end)."""
    return _MASK_NAME.search(name.lower()) is not None


class SignAnalysis:
    """Memoized sign classes of the values of one graph.

    With a resolver, a constant that guards (Max(x, 1e-12), Clip(min=1e-12)) or is added as an eps (x + 1e-12)
    counts as it is after rounding into the dtype the node runs in: 1e-12 is 0.0 in fp16 and guards nothing there.
    """

    def __init__(self, resolver=None) -> None:
        self._memo: dict[int, str] = {}
        self._origins: dict[int, str] = {}  # id(value) -> where its mask comes from (mask_origin)
        self._resolver = resolver
        # In a graph without cycles (Graph.acyclic) a value's class depends on its upstream alone, so only the inputs
        # an op's class reads are classed (_NEEDS). Where a cycle may be (an IR built by hand), every input is, in
        # order, as the classes of values met again on the path depend on the order they are met in.
        self._lazy = resolver is not None and resolver.graph.acyclic

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
        # each frame: [value, its producer, the producer's inputs, the classes of those inputs found so far, how
        # many of them (from the first) its class needs]
        frame = self._enter(value)
        stack = [frame] if frame is not None else []
        while stack:
            frame = stack[-1]
            node, inputs, ins, need = frame[1], frame[2], frame[3], frame[4]
            while len(ins) < need:
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
                result = memo[id(frame[0])] = self._of_node(node, inputs, ins)
                if stack:
                    stack[-1][3].append(result)
        return memo[key]

    def mask_origin(self, value: Value | None) -> str:
        """Where the mask behind a mask or count value comes from: a graph input, or the node that made the bool.

        Follows, from the value up, the first input that is itself a mask or a count (their classes are memoized
        already, so this is one step per node on the way).
        """
        path: dict[int, None] = {}  # every value on the way has the same origin: remembered for the next question
        origin = ""
        while value is not None and id(value) not in path:
            if id(value) in self._origins:
                origin = self._origins[id(value)]
                break
            path[id(value)] = None
            if self.of(value) not in ("mask", "count"):
                break
            node = value.producer
            if node is None:
                origin = f"graph input '{value.name}'"
                break
            if node.op_type in _BOOLEAN:
                origin = f"{node.op_type} '{node.name}'"
                break
            value = next((v for v in node.inputs if v is not None and self._memo.get(id(v)) in ("mask", "count")),
                         None)
            if value is None:
                origin = f"{node.op_type} '{node.name}'"
        for key in path:
            self._origins[key] = origin
        return origin

    def _enter(self, value: Value) -> list | None:
        """Start on a value not seen yet: class it at once (a constant, a graph input), or return the frame
        that classes it from its producer's inputs. Meanwhile the value counts as 'unknown' (cycles)."""
        key = id(value)
        self._memo[key] = "unknown"  # guards against cycles (loop-carried values)
        const = resolve_scalar(value)
        if const is not None:
            self._memo[key] = _sign(const.value)
            return None
        node = value.producer
        if node is None:
            if value.is_graph_input and not value.is_const and _mask_input(value):
                self._memo[key] = "mask"
            return None
        inputs = [v for v in node.inputs if v is not None]
        need = _NEEDS.get(node.op_type, 0) if self._lazy else _ALL
        return [value, node, inputs, [], len(inputs) if need == _ALL else min(need, len(inputs))]

    def _of_node(self, node: Node, inputs: list[Value], ins: list[str]) -> str:
        """A node's output class from its op and the classes of its (present) inputs, in order: at least as many
        as _NEEDS says the op reads (an op whose class its inputs do not decide, a MatMul or a Shape, needs none)."""
        op = node.op_type
        if op in _BOOLEAN:
            return "mask"
        if op in _COUNTING and ins and ins[0] in ("mask", "count"):
            return "count"
        if op in _POSITIVE:
            return "positive"
        if op in _NONNEG:
            return "nonneg"
        if op == "Sub" and len(ins) == 2 and ins[1] == "mask" and _const_value(inputs[0]) == 1:
            return "mask"  # 1 - mask: the inverted mask
        if op in _SIGNED:
            return "signed"
        return self._of_arithmetic(node, inputs, ins)

    def _of_arithmetic(self, node: Node, inputs: list[Value], ins: list[str]) -> str:
        """_of_node for the ops whose class follows from their inputs' classes (and constants)."""
        op = node.op_type
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
            return _worst(ins) if all(c in _AT_LEAST_0 for c in ins) else "unknown"
        if op == "Add":
            # an added constant counts as rounded into the node's dtype; one that is 0 there adds nothing
            ins = [c for c in (self._rounded_class(node, v, c) for v, c in zip(inputs, ins)) if c != "zero"] \
                or ["nonneg"]
            if all(c in _AT_LEAST_0 for c in ins):
                return "positive" if "positive" in ins else _worst(ins)
            return "unknown"
        if op in ("Max", "Clip"):
            floor = self._floor(node)
            if floor == "nonneg":  # a floor of 0 leaves a mask or count as it was
                return _worst([c for c in ins if c in ("mask", "count")] or ["nonneg"])
            return floor or "unknown"
        if op == "Div":
            if all(c in _AT_LEAST_0 for c in ins):  # x / count is no count: only the dividend carries it
                return _worst([ins[0], *("nonneg" if c in ("mask", "count") else c for c in ins[1:])])
            return "unknown"
        if op == "Reciprocal":
            return ins[0] if ins and ins[0] == "positive" else "unknown"
        if op == "Concat":
            return _worst(ins)
        if op in _PASS and ins:
            return ins[0]
        return "unknown"

    def _rounded_class(self, node: Node, value: Value, cls: str) -> str:
        """An added constant's class after rounding into the node's dtype ('zero' for 0: x + 1e-9 in fp16 is x + 0)."""
        const = resolve_scalar(value)
        if const is None:
            return cls
        rounded = self._rounded(node, const.value, const.source)
        return "zero" if rounded == 0 else _sign(rounded)

    def _floor(self, node: Node) -> str | None:
        """The sign a Max(x, c) or Clip(x, min=c) is guaranteed by its constant floor."""
        if node.op_type == "Clip":
            const = resolve_scalar(node.input(1)) if node.input(1) is not None else None
            value, source = (const.value, const.source) if const is not None else (node.attrs.get("min"), "attribute")
        else:
            consts = [resolve_scalar(v) for v in node.inputs[1:]] + [resolve_scalar(node.input(0))]
            const = max((c for c in consts if c is not None), key=lambda c: c.value, default=None)
            value, source = (const.value, const.source) if const is not None else (None, "")
        if value is None:
            return None
        value = self._rounded(node, float(value), source)
        return "positive" if value > 0 else "nonneg" if value == 0 else None

    def _rounded(self, node: Node, value: float, source: str) -> float:
        """A constant as the node sees it: clamped the way a --converter clamps it, then rounded into its dtype."""
        dtype = self._resolver.of_node(node) if self._resolver is not None else None
        return dtype.rounded_constant(value, source) if dtype is not None else value


def _mask_input(value: Value) -> bool:
    """A bool graph input, or a numeric one named like a mask."""
    return value.dtype == "bool" or (value.dtype is not None and is_mask_name(value.name))


def _const_value(value: Value) -> float | None:
    const = resolve_scalar(value)
    return const.value if const is not None else None


def _sign(value: float) -> str:
    return "positive" if value > 0 else "nonneg" if value == 0 else "signed"


def _worst(classes: list[str]) -> str:
    return max(classes, key=_ORDER.__getitem__) if classes else "unknown"
