"""A .pt2 from a stranger: while torch.export.load reads it, nothing in it may run code.

torch.export.load (torch 2.13, torch/export/pt2_archive/_package.py and torch/_export/serde/serialize.py)
runs code from the archive on these paths, each closed here without --trust-pickle:
  * torch.load(weights_only=False) for weights and constants whose payload config says use_pickle;
  * torch.load(weights_only=False) as the fallback when the weights-only load of the sample inputs (or a
    legacy weights/constants .pt, or the pre-2.8 archive's state dict) fails: serde's deserialize_torch_artifact;
  * pickle.loads for opaque-object constants (data/constants/opaque_obj_*);
  * sympy.sympify of the symbolic shape expressions in models/*.json, which parses them with eval();
  * data/aotinductor/: compiled shared libraries, which load_pt2 dlopens (closed even with --trust-pickle).
Custom-object constants (custom_obj_*) go through torch's C++ unpickler, which resolves only torch classes.
The guard replaces those functions for the duration of the load: every torch.load is weights-only, plain
pickle refuses, sympify takes only the expressions torch writes (sympy's srepr).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import importlib
import keyword
import pickle
from collections.abc import Iterator
from typing import Any

import sympy
import torch

from ..errors import InputError
from .user_code import safe_str

__all__ = ["archive_guard", "no_compiled_code", "pt2_package"]


_PICKLED = ("holds pickled Python objects; unpickling runs arbitrary code from the file, so precaudit refuses it. "
            "Pass --trust-pickle if you trust where it came from")
_EXPRESSION = ("holds a symbolic shape expression that is not plain arithmetic ({}); torch would evaluate it as "
               "Python code, so precaudit refuses it. Pass --trust-pickle if you trust where it came from")


class _Refused(BaseException):
    """Raised inside torch's loader. A BaseException, so torch's own `except Exception` fallbacks (which retry
    with weights_only=False) cannot swallow it; the guard records it too, in case something catches it anyway."""


@contextlib.contextmanager
def archive_guard(spec: str) -> Iterator[None]:
    """Functions, not classes, are replaced: torch imports modules lazily while loading, and one subclassing a
    replaced pickle.Unpickler would keep the replacement. A module that keeps a reference to a replacement
    gets the real function again once the load is over (`active`)."""
    refused: list[str] = []
    active = True
    real = {"load": torch.load, "loads": pickle.loads, "pickle_load": pickle.load, "sympify": sympy.sympify}

    def refuse(problem: str):
        refused.append(problem)
        raise _Refused(problem)

    def weights_only_load(f, *args: Any, **kwargs: Any):
        if active:
            kwargs["weights_only"] = True
        try:
            return real["load"](f, *args, **kwargs)
        except pickle.UnpicklingError:  # what the weights-only unpickler raises for anything but tensors
            if not active:
                raise
            refuse(_PICKLED)

    def no_pickle(name: str):
        def refused_or_real(*args: Any, **kwargs: Any):
            return refuse(_PICKLED) if active else real[name](*args, **kwargs)
        return refused_or_real

    def srepr_only(expr: Any, *args: Any, **kwargs: Any):
        known = kwargs.get("locals", args[0] if args else None) or {}
        if active and isinstance(expr, str) and not _plain_expression(expr, known):
            refuse(_EXPRESSION.format(safe_str(repr(expr[:80]))))
        return real["sympify"](expr, *args, **kwargs)

    replaced = {(torch, "load"): weights_only_load, (torch.serialization, "load"): weights_only_load,
                (pickle, "loads"): no_pickle("loads"), (pickle, "load"): no_pickle("pickle_load"),
                (sympy, "sympify"): srepr_only}
    try:
        with _replaced(replaced):
            yield
    except BaseException:
        if refused:
            raise InputError(spec, refused[0]) from None
        raise
    finally:
        active = False
    if refused:
        raise InputError(spec, refused[0])


@contextlib.contextmanager
def no_compiled_code() -> Iterator[None]:
    """AOTInductor runners are native code from the file, and precaudit audits the exported program only: skip them."""
    package = pt2_package()
    if not hasattr(package, "_load_aoti"):
        yield
        return
    with _replaced({(package, "_load_aoti"): lambda *_a, **_k: None}):
        yield


def pt2_package():
    return importlib.import_module("torch.export.pt2_archive._package")


@contextlib.contextmanager
def _replaced(attributes: dict[tuple[Any, str], Any]) -> Iterator[None]:
    saved = {key: getattr(*key) for key in attributes}
    try:
        for (owner, name), value in attributes.items():
            setattr(owner, name, value)
        yield
    finally:
        for (owner, name), value in saved.items():
            setattr(owner, name, value)


# The names torch's srepr expressions call (sympy classes, torch's sympy functions arrive in sympify's locals).
# Any other name must mean nothing to sympy's parser, which evaluates with sympy's namespace and Python's
# builtins (__import__, exec, open...): an unknown name becomes a Symbol or an undefined Function.
_SYMPY_NAMES = frozenset(["Add", "Mul", "Pow", "Mod", "Integer", "Rational", "Float", "Symbol", "Dummy", "Max", "Min", "Abs", "floor", "ceiling", "sqrt", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "Equality", "Unequality", "StrictLessThan", "LessThan", "StrictGreaterThan", "GreaterThan", "And", "Or", "Not", "Piecewise", "ExprCondPair", "true", "false", "oo", "zoo", "nan", "pi", "E"])
_NAMED_BY_STRING = ("Symbol", "Dummy", "Float")  # Symbol('s0', integer=True), Float('1.5', precision=53)
_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.BitAnd, ast.BitOr, ast.USub,
              ast.UAdd, ast.Not, ast.Invert, ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_STRUCTURE = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Tuple, ast.Load, ast.keyword,
              *_OPERATORS)


def _plain_expression(text: str, known: dict) -> bool:
    """Only calls of known names on numbers, symbols' names and each other: nothing sympy's eval() could misuse."""
    if not (text.isascii() and text.isprintable()):  # sympify drops newlines before parsing: refuse what differs
        return False
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    named = {id(call.args[0]) for call in ast.walk(tree) if isinstance(call, ast.Call) and call.args
             and isinstance(call.func, ast.Name) and call.func.id in _NAMED_BY_STRING}
    return all(_plain_node(node, known, named) for node in ast.walk(tree))


def _plain_node(node: ast.AST, known: dict, named: set[int]) -> bool:
    if isinstance(node, _STRUCTURE):
        return True
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and all(
            k.arg is not None and isinstance(k.value, ast.Constant) and not isinstance(k.value.value, (str, bytes))
            for k in node.keywords)
    if isinstance(node, ast.Constant):
        value = node.value
        return isinstance(value, (bool, int, float)) or value is None or (isinstance(value, str) and id(node) in named)
    if isinstance(node, ast.Name):
        return _plain_name(node.id, known)
    return False  # attributes, subscripts, lambdas, comprehensions, f-strings, walrus, starred...


def _plain_name(name: str, known: dict) -> bool:
    if name in known or name in _SYMPY_NAMES:
        return True
    if name.startswith("_") or keyword.iskeyword(name) or hasattr(builtins, name):
        return False
    return name not in _sympy_namespace()


@functools.lru_cache(maxsize=1)
def _sympy_namespace() -> frozenset[str]:
    """What `from sympy import *` brings into sympy's parser (parse_expr evaluates in that namespace)."""
    return frozenset(getattr(sympy, "__all__", None) or dir(sympy))
