"""`precaudit test RULES_DIR`: run each rule's own examples (its YAML tests:, and with --fixtures DIR --allow-code
its Python fixture cases) and say, rule by rule, whether each holds: 0 all hold, 1 one fails, 2 bad input."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .given import EXIT_CLEAN, EXIT_FINDINGS, Given, UsageError, split
from .output import write_stdout

if TYPE_CHECKING:
    from ..ruletest.run import RuleResult

__all__ = ["rule_test"]


def rule_test(given: Given, run: Callable[[list[str]], int],
              parse: Callable[[str, list[str]], tuple[Given, list[str]]]) -> int:
    """run and parse are the grammar's own (this module may not import it): each example runs through them."""
    from ..ruletest.render import render_json, render_rule_text, render_summary
    from ..ruletest.run import Commands, plan_tests, run_rule

    if given.fixtures is not None and not given.allow_code:
        raise UsageError("--fixtures imports and runs the Python modules of its folder; add --allow-code to allow it")
    commands = Commands(run, parse)
    planned = plan_tests(given.rules_dir, split(given.select), given.fixtures, commands)
    as_json = given.output_format == "json"
    results: list[RuleResult] = []
    for rule, examples in planned:  # a rule's verdict printed as it comes: the project's rules take minutes
        results.append(run_rule(rule, examples, commands))
        if not as_json:
            write_stdout(render_rule_text(results[-1]))
    write_stdout(render_json(results) if as_json else render_summary(results))
    return EXIT_FINDINGS if any(not result.ok for result in results) else EXIT_CLEAN
