"""A small, safe expression language for rule conditions and message templates.

Conditions are Python-like expressions (`has_eps and eps_rounded == 0`, `eps > max_eps`), parsed with
`ast` and interpreted over a whitelist of node types. Nothing is ever passed to `eval`: no attribute access,
no subscripts, no calls but the few functions listed in _FUNCTIONS.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from typing import Any, Callable, Mapping

__all__ = ["Condition", "ConditionError", "parse_condition", "render", "template_names"]


class ConditionError(ValueError):
    """A condition or template that does not parse, or uses something the language does not offer."""


_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.In: lambda a, b: b is not None and a in b, ast.NotIn: lambda a, b: b is None or a not in b,
    ast.Is: operator.is_, ast.IsNot: operator.is_not,
}
_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    # floats, so a rule like `10 ** 10 ** 9` overflows to inf at once instead of building a huge integer
    ast.Pow: lambda a, b: float(a) ** float(b), ast.Mod: operator.mod,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs, "min": min, "max": max, "log10": math.log10, "sqrt": math.sqrt,
    "isfinite": math.isfinite,
}
_CONSTANTS = {"None": None, "True": True, "False": False, "inf": math.inf}


class Condition:
    """A parsed condition; evaluate() it against a site's facts."""

    def __init__(self, text: str, tree: ast.Expression):
        self.text = text
        self._tree = tree
        self.names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - set(_FUNCTIONS) - set(_CONSTANTS)

    def evaluate(self, env: Mapping[str, Any]) -> bool:
        """True when the condition holds; a comparison with a missing fact (None) is false, and so is its negation."""
        try:
            return bool(_eval(self._tree.body, env))
        except _Undefined:
            return False

    def __repr__(self) -> str:
        return f"Condition({self.text!r})"


class _Undefined(Exception):
    """Raised inside evaluation when an operand is None; the whole condition is then false."""


def parse_condition(text: str) -> Condition:
    """Parse and validate a condition, or raise ConditionError saying what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ConditionError("condition must be a non-empty string")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ConditionError(f"condition does not parse at column {exc.offset}: {text.strip()!r}") from None
    for node in ast.walk(tree):
        _check_node(node)
    return Condition(text.strip(), tree)


_ALLOWED = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd,
            ast.Compare, ast.BinOp, ast.Name, ast.Load, ast.Constant, ast.Call, ast.List, ast.Tuple,
            ast.IfExp, *_COMPARE, *_BINARY)


def _check_node(node: ast.AST) -> None:
    if not isinstance(node, _ALLOWED):
        raise ConditionError(f"'{type(node).__name__}' is not allowed in a condition")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
            raise ConditionError(f"only these functions may be called: {', '.join(sorted(_FUNCTIONS))}")
        if node.keywords:
            raise ConditionError("keyword arguments are not allowed in a condition")
    if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, str, bool, type(None))):
        raise ConditionError(f"constant {node.value!r} is not allowed in a condition")


def _eval(node: ast.AST, env: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        return env.get(node.id)
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_truthy(v, env) for v in node.values)
        return any(_truthy(v, env) for v in node.values)
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, env)
        if isinstance(node.op, ast.Not):
            return not value
        _require(value)
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, right_node in zip(node.ops, node.comparators):
            right = _eval(right_node, env)
            if not isinstance(op, (ast.Is, ast.IsNot, ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                _require(left, right)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, env), _eval(node.right, env)
        _require(left, right)
        try:
            return _BINARY[type(node.op)](left, right)
        except (ZeroDivisionError, OverflowError):
            return math.inf
    if isinstance(node, ast.Call):
        args = [_eval(a, env) for a in node.args]
        _require(*args)
        return _FUNCTIONS[node.func.id](*args)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_eval(e, env) for e in node.elts]
    if isinstance(node, ast.IfExp):
        return _eval(node.body, env) if _eval(node.test, env) else _eval(node.orelse, env)
    raise ConditionError(f"'{type(node).__name__}' is not allowed in a condition")  # unreachable after parse


def _truthy(node: ast.AST, env: Mapping[str, Any]) -> bool:
    try:
        return bool(_eval(node, env))
    except _Undefined:
        return False


def _require(*values: Any) -> None:
    if any(v is None for v in values):
        raise _Undefined()


_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::([^{}]*))?\}")


def template_names(template: str) -> set[str]:
    """The fact names a message template refers to."""
    return {m.group(1) for m in _FIELD.finditer(template)}


def render(template: str, env: Mapping[str, Any]) -> str:
    """Fill {name} and {name:spec} fields from env; only plain names, so no attribute or index tricks."""

    def field(match: re.Match) -> str:
        value = env.get(match.group(1))
        spec = match.group(2) or ""
        if value is None:
            return "none"
        try:
            return format(value, spec)
        except (TypeError, ValueError):
            return str(value)

    return _FIELD.sub(field, template)
