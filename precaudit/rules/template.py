"""Message templates of rules: `{name}` and `{name:spec}` fields filled from a site's facts.

A rule file may come from a pull request: a template holds only plain fields, at most MAX_FIELDS of them, with a
format spec whose width is at most MAX_WIDTH and precision at most MAX_PRECISION, checked when the rule is
loaded; render leaves a field check_template would refuse as written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from .condition import MAX_INT_BITS, ConditionError, short

__all__ = ["MAX_FIELDS", "MAX_PRECISION", "MAX_TEMPLATE_CHARS", "MAX_WIDTH", "check_template", "render"]

MAX_TEMPLATE_CHARS = 4000   # a message or fix (the longest shipped one has 334 characters)
MAX_FIELDS = 64             # {fields} in one message or fix
MAX_WIDTH = 100             # the width of a field's format spec, {eps:>12.3g}
MAX_PRECISION = 50          # and its precision

_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::([^{}]*))?\}")
# [[fill]align][sign][z][#][0][width][grouping][.precision][type], as format() reads it
_SPEC = re.compile(r"(?:[^{}]?[<>=^])?[-+ ]?z?#?0?(?P<width>[0-9]*)[_,]?(?:\.(?P<precision>[0-9]+))?"
                   r"[bcdeEfFgGnosxX%]?")


def check_template(template: str, what: str = "message") -> set[str]:
    """Validate a message template and return the names it refers to; ConditionError says what is wrong.

    Only `{name}` and `{name:spec}` fields: no attribute or index access (`{eps.__class__}`, `{x[0]}`), no
    nested fields (`{eps:{width}}`), no stray braces, and a spec with a bounded width and precision.
    """
    if len(template) > MAX_TEMPLATE_CHARS:
        raise ConditionError(f"{what} is {len(template)} characters long; at most {MAX_TEMPLATE_CHARS} are allowed")
    names: set[str] = set()
    fields = 0
    pos = 0
    while True:
        opening = template.find("{", pos)
        closing = template.find("}", pos)
        if closing != -1 and (opening == -1 or closing < opening):
            raise ConditionError(f"{what} has a '}}' that closes no field (at character {closing + 1})")
        if opening == -1:
            break
        match = _FIELD.match(template, opening)
        if match is None:
            raise ConditionError(f"{what}: {_describe_bad_field(template, opening)}")
        spec = match.group(2)
        if spec is not None:
            _check_spec(match.group(1), spec, what)
        fields += 1
        if fields > MAX_FIELDS:
            raise ConditionError(f"{what} has more than {MAX_FIELDS} fields")
        names.add(match.group(1))
        pos = match.end()
    return names


def _describe_bad_field(template: str, opening: int) -> str:
    end = template.find("}", opening)
    shown = short(template[opening:end + 1] if end != -1 else template[opening:opening + 40])
    inner = template[opening + 1:end] if end != -1 else template[opening + 1:]
    if end == -1:
        return f"'{{' at character {opening + 1} opens a field that never closes"
    name = re.match(r"[A-Za-z_][A-Za-z0-9_]*", inner)
    after = inner[name.end():name.end() + 1] if name else ""
    if "{" in inner:
        return f"nested fields are not allowed: {shown}; a field is {{name}} or {{name:spec}}"
    if after in (".", "["):
        return f"field {shown} reaches into a value; a field is a plain fact name, {{name}} or {{name:spec}}"
    if after == "!":
        return f"field {shown} uses a conversion (!r, !s); a field is {{name}} or {{name:spec}}"
    return f"{shown} is not a field; a field is {{name}} or {{name:spec}} (and braces cannot be written literally)"


def _check_spec(name: str, spec: str, what: str) -> None:
    match = _SPEC.fullmatch(spec)
    if match is None:
        raise ConditionError(f"{what}: {short('{' + name + ':' + spec + '}')} has a format spec Python does not read")
    width, precision = match.group("width"), match.group("precision")
    if width and (len(width) > 3 or int(width) > MAX_WIDTH):
        raise ConditionError(f"{what}: the width of {short('{' + name + ':' + spec + '}')} is more than {MAX_WIDTH}")
    if precision and (len(precision) > 3 or int(precision) > MAX_PRECISION):
        raise ConditionError(f"{what}: the precision of {short('{' + name + ':' + spec + '}')} is more than "
                             f"{MAX_PRECISION}")


@lru_cache(maxsize=1024)
def _spec_ok(spec: str) -> bool:
    try:
        _check_spec("x", spec, "")
    except ConditionError:
        return False
    return True


def render(template: str, env: Mapping[str, Any]) -> str:
    """Fill {name} and {name:spec} fields from env; only plain names, so no attribute or index tricks.

    A field check_template would refuse (an unbounded spec) is left as written.
    """

    def field(match: re.Match) -> str:
        spec = match.group(2) or ""
        if spec and not _spec_ok(spec):
            return match.group(0)
        value = env.get(match.group(1))
        if value is None:
            return "none"
        try:
            return format(value, spec)
        except (TypeError, ValueError, OverflowError):
            return _text(value)

    return _FIELD.sub(field, template)


def _text(value: Any) -> str:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        return f"{'-' if value < 0 else ''}(an integer of {value.bit_length()} bits)"
    try:
        return str(value)
    except (TypeError, ValueError, OverflowError):
        return f"({type(value).__name__})"
