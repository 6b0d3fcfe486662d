"""A small, safe expression language for rule conditions.

Conditions are Python-like expressions (`has_eps and eps_rounded == 0`, `eps > max_eps`), parsed with
`ast` and interpreted over a whitelist of node types. Nothing is ever passed to `eval`: no attribute access,
no subscripts, no calls but the few functions listed in _FUNCTIONS.

A rule file may come from a pull request, and a condition runs once per site (thousands of them), so every
cost is bounded, and as much as possible when the rule is loaded rather than while it runs:

- the source is at most MAX_CONDITION_CHARS long and nests brackets at most MAX_DEPTH deep, checked before
  `ast.parse` sees it; the tree is at most MAX_DEPTH deep and has at most MAX_NODES expressions;
- a string or list made by `*` has at most MAX_SEQUENCE items; `%` never formats a string; `**` computes in
  floats; an integer wider than MAX_INT_BITS is computed as a float (so it overflows to inf instead of growing);
- every part of a condition that uses no fact (`'x' * 3000000000`) is computed once at load time, so what it
  would refuse at run time it refuses with the rule's file and line.

Message templates are template.py's.
"""

from __future__ import annotations

import ast
import math
import numbers
import operator
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "MAX_CONDITION_CHARS",
    "MAX_DEPTH",
    "MAX_INT_BITS",
    "MAX_NODES",
    "MAX_SEQUENCE",
    "Condition",
    "ConditionError",
    "kind_of",
    "parse_condition",
    "short",
]

MAX_CONDITION_CHARS = 2000  # the longest shipped condition has 253
MAX_DEPTH = 50              # nesting of brackets and of the expression tree (the shipped rules reach 8)
MAX_NODES = 250             # expressions in one condition (the shipped rules have at most 33)
MAX_SEQUENCE = 1000         # items of a list, or characters of a string, that `*` may make
MAX_INT_BITS = 1024         # wider integers are computed as floats: they overflow to inf like any float


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
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**", ast.Mod: "%"}


def _log10(x: float) -> float:
    if math.isnan(x) or x < 0:
        return math.nan
    return -math.inf if x == 0 else math.log10(x)


def _sqrt(x: float) -> float:
    return math.nan if math.isnan(x) or x < 0 else math.sqrt(x)


def _extreme(pick: Callable[..., Any]) -> Callable[..., Any]:
    def extreme(*args: Any) -> Any:
        if len(args) == 1:  # min([a, b, c]): over the list
            if not isinstance(args[0], list):
                raise ConditionError(f"{pick.__name__}() of one value needs a list, got {kind_of(args[0])}")
            if not args[0]:
                raise ConditionError(f"{pick.__name__}() of an empty list")
            args = tuple(args[0])
        return pick(args)
    return extreme


# name: (function, fewest arguments, most arguments (None: any), whether every argument must be a number)
_FUNCTIONS: dict[str, tuple[Callable[..., Any], int, int | None, bool]] = {
    "abs": (abs, 1, 1, True), "log10": (_log10, 1, 1, True), "sqrt": (_sqrt, 1, 1, True),
    "isfinite": (math.isfinite, 1, 1, True), "min": (_extreme(min), 1, None, False),
    "max": (_extreme(max), 1, None, False),
}
_CONSTANTS = {"None": None, "True": True, "False": False, "inf": math.inf}


class Condition:
    """A parsed condition; evaluate() it against a site's facts."""

    def __init__(self, text: str, tree: ast.Expression):
        self.text = text
        self._tree = tree
        self._run = _compile(tree.body)
        self.names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - set(_FUNCTIONS) - set(_CONSTANTS)

    def evaluate(self, env: Mapping[str, Any]) -> bool:
        """True when the condition holds; a comparison with a missing fact (None) is false, and so is its negation.

        A condition that cannot be computed with these facts (`eps < 'x'`, `'x' * n` with a huge n) raises
        ConditionError saying why.
        """
        try:
            return bool(self._run(env))
        except _Undefined:
            return False
        except (TypeError, ValueError, ArithmeticError, RecursionError, MemoryError) as exc:
            raise ConditionError(f"cannot be computed: {_first_line(exc)}") from None

    def __getstate__(self) -> dict:  # -j sends rules to worker processes: closures do not pickle, the tree does
        return {"text": self.text, "tree": self._tree}

    def __setstate__(self, state: dict) -> None:
        type(self).__init__(self, state["text"], state["tree"])

    def __repr__(self) -> str:
        return f"Condition({self.text!r})"


class _Undefined(Exception):
    """Raised inside evaluation when an operand is None; the whole condition is then false."""


def parse_condition(text: str) -> Condition:
    """Parse and validate a condition, or raise ConditionError saying what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ConditionError("condition must be a non-empty string")
    text = text.strip()
    if len(text) > MAX_CONDITION_CHARS:
        raise ConditionError(f"condition is {len(text)} characters long; at most {MAX_CONDITION_CHARS} are allowed")
    if _bracket_depth(text) > MAX_DEPTH:
        raise ConditionError(f"condition nests brackets more than {MAX_DEPTH} deep")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ConditionError(f"condition does not parse at column {exc.offset}: {short(text)}") from None
    except (ValueError, RecursionError, MemoryError, OverflowError) as exc:
        raise ConditionError(f"condition does not parse: {_first_line(exc)}") from None
    _check_shape(tree)
    for node in ast.walk(tree):
        _check_node(node)
    _fold_constants(tree.body)
    return Condition(text, tree)


def _bracket_depth(text: str) -> int:
    """How deep (, [ and { nest outside string literals: a cheap look before the parser recurses."""
    depth = deepest = 0
    quote = None
    escaped = False
    for char in text:
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth -= 1
    return deepest


def _check_shape(tree: ast.Expression) -> None:
    """At most MAX_DEPTH deep and MAX_NODES expressions, measured without recursion."""
    stack = [(tree.body, 1)]
    count = 0
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ConditionError(f"condition nests more than {MAX_DEPTH} deep")
        count += 1
        if count > MAX_NODES:
            raise ConditionError(f"condition has more than {MAX_NODES} terms")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node) if isinstance(child, ast.expr))


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
        _, fewest, most, _ = _FUNCTIONS[node.func.id]
        if len(node.args) < fewest or (most is not None and len(node.args) > most):
            wanted = f"{fewest} argument" if fewest == most else f"at least {fewest} argument"
            raise ConditionError(f"{node.func.id}() takes {wanted}{'s' * (fewest != 1)}, got {len(node.args)}")
    if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, str, bool, type(None))):
        raise ConditionError(f"constant {short(node.value)} is not allowed in a condition")


def _fold_constants(node: ast.AST) -> None:
    """Compute, once, each largest part that uses no fact: what it would refuse per site, refuse it now."""
    if not any(isinstance(n, ast.Name) and n.id not in _CONSTANTS and n.id not in _FUNCTIONS for n in ast.walk(node)):
        if isinstance(node, (ast.Constant, ast.Name)):
            return
        try:
            _compile(node)({})
        except _Undefined:
            pass
        except ConditionError as exc:
            raise ConditionError(f"condition {short(ast.unparse(node))}: {exc}") from None
        except (TypeError, ValueError, ArithmeticError, RecursionError, MemoryError) as exc:
            raise ConditionError(f"condition {short(ast.unparse(node))} cannot be computed: {_first_line(exc)}") \
                from None
        return
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.expr):
            _fold_constants(child)


_Run = Callable[[Mapping[str, Any]], Any]


def _compile(node: ast.AST) -> _Run:
    """The expression as nested closures, built once per condition: a rule runs at thousands of sites, and a
    closure call costs a fraction of walking the tree again. Same semantics as reading the tree node by node:
    a None operand (a missing fact) makes the enclosing and/or term, and so a comparison, false."""
    compiler = _COMPILERS.get(type(node))
    if compiler is None:
        raise ConditionError(f"'{type(node).__name__}' is not allowed in a condition")  # unreachable after parse
    return compiler(node)


def _compile_constant(node: ast.Constant) -> _Run:
    constant = node.value
    return lambda env: constant


def _compile_name(node: ast.Name) -> _Run:
    name = node.id
    if name in _CONSTANTS:
        constant = _CONSTANTS[name]
        return lambda env: constant
    return lambda env: env.get(name)


def _compile_boolean(node: ast.BoolOp) -> _Run:
    terms = [_compile(v) for v in node.values]
    want = not isinstance(node.op, ast.And)  # and: stops at the first false term; or: at the first true one

    def boolean(env: Mapping[str, Any]) -> bool:
        for term in terms:
            try:
                if bool(term(env)) is want:
                    return want
            except _Undefined:
                if not want:
                    return False
        return not want
    return boolean


def _compile_unary(node: ast.UnaryOp) -> _Run:
    operand = _compile(node.operand)
    if isinstance(node.op, ast.Not):
        return lambda env: not operand(env)
    negate = isinstance(node.op, ast.USub)

    def signed(env: Mapping[str, Any]) -> Any:
        value = operand(env)
        _require(value)
        value = _number(value, "-" if negate else "+")
        return -value if negate else +value
    return signed


def _compile_compare(node: ast.Compare) -> _Run:
    first = _compile(node.left)
    steps = [(_COMPARE[type(op)], not isinstance(op, (ast.Is, ast.IsNot, ast.Eq, ast.NotEq, ast.In, ast.NotIn)),
              _compile(right)) for op, right in zip(node.ops, node.comparators)]

    def compare(env: Mapping[str, Any]) -> bool:
        left = first(env)
        for test, ordered, operand in steps:
            right = operand(env)
            if ordered and (left is None or right is None):
                raise _Undefined()
            if not test(left, right):
                return False
            left = right
        return True
    return compare


def _compile_binary(node: ast.BinOp) -> _Run:
    left_of, right_of, op = _compile(node.left), _compile(node.right), type(node.op)

    def binary(env: Mapping[str, Any]) -> Any:
        left, right = left_of(env), right_of(env)
        _require(left, right)
        return _binary(op, left, right)
    return binary


def _compile_call(node: ast.Call) -> _Run:
    assert isinstance(node.func, ast.Name)  # _check_node allows calls of the named functions only
    arguments = [_compile(a) for a in node.args]
    function, _, _, numeric = _FUNCTIONS[node.func.id]
    where = f"{node.func.id}()"

    def call(env: Mapping[str, Any]) -> Any:
        args = [a(env) for a in arguments]
        _require(*args)
        if numeric:
            args = [_number(a, where) for a in args]
        return function(*args)
    return call


def _compile_sequence(node: ast.List | ast.Tuple) -> _Run:
    items = [_compile(e) for e in node.elts]
    return lambda env: [item(env) for item in items]


def _compile_choice(node: ast.IfExp) -> _Run:
    test, body, orelse = _compile(node.test), _compile(node.body), _compile(node.orelse)
    return lambda env: body(env) if test(env) else orelse(env)


# what _check_node allows, each compiled by its own function (ast.parse makes these exact types)
_COMPILERS: dict[type, Callable[[Any], _Run]] = {
    ast.Constant: _compile_constant, ast.Name: _compile_name, ast.BoolOp: _compile_boolean,
    ast.UnaryOp: _compile_unary, ast.Compare: _compile_compare, ast.BinOp: _compile_binary, ast.Call: _compile_call,
    ast.List: _compile_sequence, ast.Tuple: _compile_sequence, ast.IfExp: _compile_choice,
}


def _binary(op: type[ast.operator], left: Any, right: Any) -> Any:
    """One arithmetic operator, with every size bounded: no operand or result can grow without limit."""
    symbol = _SYMBOL[op]
    if _is_number(left) and _is_number(right):
        left, right = _narrow(left), _narrow(right)
        try:
            result = _BINARY[op](left, right)
        except (ZeroDivisionError, OverflowError):
            return math.inf
        return math.nan if isinstance(result, complex) else result  # (-8) ** (1/3)
    if op is ast.Mod and isinstance(left, str):
        raise ConditionError("string formatting with % is not allowed in a condition")
    if op is ast.Add and type(left) is type(right) and isinstance(left, (str, list)):
        return left + right  # no longer than its operands together, which are bounded in turn
    if op is ast.Mult and ((isinstance(left, (str, list)) and _is_int(right)) or (_is_int(left) and
                           isinstance(right, (str, list)))):
        sequence, count = (left, right) if isinstance(left, (str, list)) else (right, left)
        if count > 0 and len(sequence) * count > MAX_SEQUENCE:  # (len * count: count is at most MAX_INT_BITS wide)
            raise ConditionError(f"repeating {kind_of(sequence)} of length {len(sequence)} with * makes more "
                                 f"than {MAX_SEQUENCE} items")
        return sequence * count
    raise ConditionError(f"cannot compute {kind_of(left)} {symbol} {kind_of(right)}")


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real)  # Python's and numpy's ints and floats, and booleans


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral)


def _narrow(value: int | float) -> int | float:
    """An integer wider than MAX_INT_BITS as a float: ±inf (so arithmetic on it costs what a float costs)."""
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        return math.inf if value > 0 else -math.inf
    return value


def _number(value: Any, where: str) -> int | float:
    if not _is_number(value):
        raise ConditionError(f"{where} needs a number, got {kind_of(value)}")
    return _narrow(value)


def kind_of(value: Any) -> str:
    """What a value is, in the words of an error message about a rule file (YAML or condition values)."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, numbers.Real):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def _require(*values: Any) -> None:
    if any(v is None for v in values):
        raise _Undefined()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return short(text.splitlines()[0] if text else type(exc).__name__, quote=False)


def short(value: Any, quote: bool = True, limit: int = 80) -> str:
    """The value as an error message shows it: its repr (or its text), cut at limit characters."""
    text = repr(value) if quote else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
