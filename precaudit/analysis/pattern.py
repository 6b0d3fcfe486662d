"""Op-tree patterns that rule files write in YAML, and a matcher that says why a node did not match.

A pattern is a tree of dicts:

    op: Log                       # an op type, or a list of alternatives
    inputs:                       # positional; inputs left out are not looked at
      - op: Softmax
    ---
    op: Div
    inputs:
      - {op: Exp, bind: exp}      # bind: the matched node's name, usable in messages
      - {op: ReduceSum, inputs: [{op: Exp}]}
    ---
    {const: c, value: 1}          # a scalar constant (through Cast/Expand/...), bound as c; value: must equal
    {not: {op: Sub}}              # anything but this
    {any_of: [{op: Relu}, {op: Abs}]}
    _                             # anything

Edges look through Cast and Identity, and two-input Add/Mul/Max/Min match their inputs in either order. When
the node found there does not match, the edge is read canonically (canonical.views): through Reshape / Expand /
Squeeze / Unsqueeze, and a mean written as ReduceSum·(1/n), ReduceSum/n, GlobalAveragePool or
ReduceSumSquare/n matches `op: ReduceMean` (for ReduceSumSquare its input is a Mul(x, x)), as tf2onnx, jax2onnx
and paddle2onnx write them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..ir import Node, Value
from .canonical import views
from .constants import producer_through_casts, resolve_scalar

__all__ = ["Pattern", "PatternError", "compile_pattern", "match_node", "pattern_names", "root_ops"]

_COMMUTATIVE = {"Add", "Mul", "Max", "Min", "Sum"}


class PatternError(ValueError):
    """A pattern that is not well formed; the message names where in the pattern."""


@dataclass(frozen=True)
class OpP:
    ops: tuple[str, ...]
    inputs: tuple[Pattern, ...] = ()
    bind: str | None = None


@dataclass(frozen=True)
class ConstP:
    bind: str | None = None
    value: float | None = None


@dataclass(frozen=True)
class NotP:
    inner: Pattern


@dataclass(frozen=True)
class AnyOfP:
    options: tuple[Pattern, ...]


@dataclass(frozen=True)
class AnyP:
    pass


Pattern = OpP | ConstP | NotP | AnyOfP | AnyP


def compile_pattern(data: Any, where: str = "pattern") -> Pattern:
    """Turn the YAML data into a Pattern, or raise PatternError naming the offending part."""
    if data in ("_", None) or data == {}:
        return AnyP()
    if not isinstance(data, dict):
        raise PatternError(f"{where}: expected a mapping (op/const/not/any_of) or _, got {data!r}")
    keys = set(data)
    if "not" in keys:
        _only(keys, {"not"}, where)
        return NotP(compile_pattern(data["not"], f"{where}.not"))
    if "any_of" in keys:
        _only(keys, {"any_of"}, where)
        options = data["any_of"]
        if not isinstance(options, list) or len(options) < 2:
            raise PatternError(f"{where}.any_of: needs a list of at least two patterns")
        return AnyOfP(tuple(compile_pattern(o, f"{where}.any_of[{i}]") for i, o in enumerate(options)))
    if "const" in keys or "value" in keys:
        _only(keys, {"const", "value"}, where)
        bind = data.get("const")
        value = data.get("value")
        if bind is not None and not (isinstance(bind, str) and bind.isidentifier()):
            raise PatternError(f"{where}.const: must be a name to bind the constant to, got {bind!r}")
        if value is not None and not isinstance(value, (int, float)):
            raise PatternError(f"{where}.value: must be a number, got {value!r}")
        return ConstP(bind, None if value is None else float(value))
    if "op" not in keys:
        raise PatternError(f"{where}: needs one of op, const, value, not, any_of")
    _only(keys, {"op", "inputs", "bind"}, where)
    ops = data["op"] if isinstance(data["op"], list) else [data["op"]]
    if not ops or not all(isinstance(o, str) and o for o in ops):
        raise PatternError(f"{where}.op: must be an op type or a list of op types")
    inputs = data.get("inputs") or []
    if not isinstance(inputs, list):
        raise PatternError(f"{where}.inputs: must be a list of patterns")
    bind = data.get("bind")
    if bind is not None and not (isinstance(bind, str) and bind.isidentifier()):
        raise PatternError(f"{where}.bind: must be a name, got {bind!r}")
    return OpP(tuple(ops), tuple(compile_pattern(p, f"{where}.inputs[{i}]") for i, p in enumerate(inputs)), bind)


def _only(keys: set, allowed: set, where: str) -> None:
    extra = sorted(keys - allowed)
    if extra:
        raise PatternError(f"{where}: '{extra[0]}' cannot be combined with {', '.join(sorted(allowed))}")


def pattern_names(pattern: Pattern) -> set[str]:
    """Every name a pattern binds (constants and nodes), for validating conditions and messages."""
    if isinstance(pattern, OpP):
        names = {pattern.bind} if pattern.bind else set()
        for p in pattern.inputs:
            names |= pattern_names(p)
        return names
    if isinstance(pattern, ConstP):
        return {pattern.bind} if pattern.bind else set()
    if isinstance(pattern, AnyOfP):
        return set().union(*(pattern_names(p) for p in pattern.options))
    return set()  # names inside `not` never bind: that part did not match


def root_ops(pattern: Pattern) -> tuple[str, ...]:
    if not isinstance(pattern, OpP):
        raise PatternError("pattern: the top of a pattern must be an op (the node a finding points at)")
    return pattern.ops


@dataclass
class MatchResult:
    """Bindings when the pattern matched; otherwise the reason it did not."""

    ok: bool
    bindings: dict[str, Any] = field(default_factory=dict)
    reason: str = ""


def match_node(pattern: OpP, node: Node) -> MatchResult:
    """Match a pattern whose top is an op against a node."""
    return _match_op(pattern, node, "the node")


def _match_value(pattern: Pattern, value: Value | None, where: str) -> MatchResult:
    if isinstance(pattern, AnyP):
        return MatchResult(True)
    if isinstance(pattern, ConstP):
        const = resolve_scalar(value)
        if const is None:
            return MatchResult(False, reason=f"{where}: expected a scalar constant, found {_describe(value)}")
        if pattern.value is not None and const.value != pattern.value:
            return MatchResult(False, reason=f"{where}: expected the constant {pattern.value:g}, found {const.value:g}")
        return MatchResult(True, {pattern.bind: const.value} if pattern.bind else {})
    if isinstance(pattern, NotP):
        inner = _match_value(pattern.inner, value, where)
        if inner.ok:
            return MatchResult(False, reason=f"{where}: found {_describe(value)}, which the pattern excludes")
        return MatchResult(True)
    if isinstance(pattern, AnyOfP):
        reasons = []
        for option in pattern.options:
            result = _match_value(option, value, where)
            if result.ok:
                return result
            reasons.append(result.reason)
        return MatchResult(False, reason=" / ".join(reasons))
    producer = producer_through_casts(value)
    if producer is None:
        return MatchResult(False, reason=f"{where}: expected {'|'.join(pattern.ops)}, found {_describe(value)}")
    result = _match_op(pattern, producer, where)
    if result.ok:
        return result
    for view in views(value):  # the same value read canonically; the reason stays the one about the real node
        if view.op_type in pattern.ops:
            other = _match_op(pattern, view, where)
            if other.ok:
                return other
    return result


def _match_op(pattern: OpP, node: Node, where: str) -> MatchResult:
    if node.op_type not in pattern.ops:
        return MatchResult(False, reason=f"{where}: expected {'|'.join(pattern.ops)}, found {node.op_type} '{node.name}'")
    orders = [list(range(len(pattern.inputs)))]
    if node.op_type in _COMMUTATIVE and len(pattern.inputs) == 2 and len(node.inputs) == 2:
        orders.append([1, 0])
    failure = None
    for order in orders:
        bindings = {pattern.bind: node.name} if pattern.bind else {}
        for i, sub in enumerate(pattern.inputs):
            result = _match_value(sub, node.input(order[i]), f"input {order[i]} of {node.op_type} '{node.name}'")
            if not result.ok:
                failure = failure or result
                break
            bindings.update(result.bindings)
        else:
            return MatchResult(True, bindings)
    assert failure is not None  # every order that did not match set it
    return failure


def _describe(value: Value | None) -> str:
    if value is None:
        return "no input"
    producer = producer_through_casts(value)
    if producer is not None:
        return f"{producer.op_type} '{producer.name}'"
    if value.is_const:
        return f"the constant '{value.name}'"
    return f"the graph input '{value.name}'"
