"""The rule condition language: what it computes, and what it refuses to do."""

import pytest

from precaudit.rules.condition import ConditionError, parse_condition
from precaudit.rules.template import render


@pytest.mark.parametrize("text,env,expected", [
    ("has_eps and eps_rounded == 0", {"has_eps": True, "eps_rounded": 0.0}, True),
    ("has_eps and eps_rounded == 0", {"has_eps": False, "eps_rounded": None}, False),
    ("eps >= max_eps", {"eps": None, "max_eps": 0.01}, False),  # a missing fact never fires a rule
    ("not (eps < 1e-6)", {"eps": None}, False),  # ... and neither does its negation
    ("input_op in ['Softmax', 'LogSoftmax']", {"input_op": "Softmax"}, True),
    ("abs(x - 1) < 1e-3 or x > 10 ** 3", {"x": 1.0005}, True),
    ("2 ** 10 ** 9 > 0", {}, True),  # float power overflows to inf instead of hanging
    ("eps / 0 > 1", {"eps": 1.0}, True),
])
def test_evaluate(text, env, expected):
    assert parse_condition(text).evaluate(env) is expected


@pytest.mark.parametrize("text", ["open('x')", "x.__class__", "x[0]", "lambda: 1", "(y := 1)", "f'{x}'", ""])
def test_refused(text):
    with pytest.raises(ConditionError):
        parse_condition(text)


def test_names():
    assert parse_condition("has_eps and abs(eps) < limit").names == {"has_eps", "eps", "limit"}


def test_render_formats_and_never_reaches_attributes():
    assert render("eps {eps:.3g} → {eps_rounded:g} in {dtype}", {"eps": 1e-12, "eps_rounded": 0.0, "dtype": "float16"}) \
        == "eps 1e-12 → 0 in float16"
    assert render("{missing} {eps.__class__}", {"eps": 1.0}) == "none {eps.__class__}"
