"""The user's code (model.py, a factory, forward()) runs under a net: whatever it raises or exits with becomes
one InputError for that model, never an exit of precaudit, a traceback or a silent exit 0."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..errors import InputError

__all__ = ["described", "first_line", "safe_str", "stopped_as_error", "user_code"]


@contextlib.contextmanager
def user_code(file: str, doing: str, failure: str | None = None) -> Iterator[None]:
    """Run the user's code (model.py, a factory, forward()); whatever it raises becomes one InputError.

    BaseException, not just Exception: sys.exit(0) in a factory must not end precaudit with exit 0 and no
    report, and a KeyboardInterrupt or a BaseException subclass must not become a traceback. (A real Ctrl-C
    arriving while the user's code runs is reported the same way; the next model is still audited.)
    failure formats an ordinary exception's message ("{}" is its type and first line).
    """
    try:
        yield
    except InputError:
        raise
    except Exception as exc:
        problem = failure.format(described(exc)) if failure else f"{doing} failed: {described(exc)}"
        raise InputError(file, problem) from None
    except BaseException as exc:
        raise InputError(file, _stopped(doing, exc)) from None


@contextlib.contextmanager
def stopped_as_error(spec: str) -> Iterator[None]:
    """The last net around loading a PyTorch model: an exit or interrupt anywhere in it is an error for the model."""
    try:
        yield
    except Exception:
        raise
    except BaseException as exc:
        raise InputError(spec, _stopped("loading it", exc)) from None


def _stopped(doing: str, exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"{doing} exited (SystemExit {safe_str(exc.code)})"
    if isinstance(exc, KeyboardInterrupt):
        return f"{doing} was interrupted (KeyboardInterrupt)"
    return f"{doing} failed: {described(exc)}"


def described(exc: BaseException) -> str:
    """'Type: first line of the message'; the exception is the user's object, whose __str__ may itself raise."""
    return f"{type(exc).__name__}: {first_line(exc)}"


def safe_str(value: object) -> str:
    """One line of str(value), at most 300 characters; '?' when the user's __str__ raises or exits."""
    try:
        text = str(value)
    except BaseException:
        return "?"
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else ""


def first_line(exc: BaseException) -> str:
    return safe_str(exc) or "no details"
