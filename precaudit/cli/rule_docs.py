"""`precaudit rules`, `precaudit explain RULE` and `precaudit match RULE MODEL`: the rules, built-in and the user's,
as text, JSON or pages, one rule explained, and why one fires or not on a model, node by node."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .given import EXIT_CLEAN, Given
from .output import say_notes, write_stdout

if TYPE_CHECKING:
    from ..rules.loader import Rule

__all__ = ["explain", "list_rules", "match"]


def list_rules(given: Given) -> int:
    """List every rule: id, name, severity, whether it runs by default, summary; or write their pages."""
    from ..report.rule_docs import render_rule_json, render_rule_table

    all_rules = _rules_for_docs(given.rules)
    if given.write_pages is not None:
        return _write_pages(given.write_pages, all_rules)
    render = render_rule_json if given.output_format == "json" else render_rule_table
    write_stdout(render(all_rules))
    return EXIT_CLEAN


def explain(given: Given) -> int:
    """Explain a rule: what it checks, a worked example in numbers, and the fix."""
    from ..report.rule_docs import render_explanation

    write_stdout(render_explanation(_rule_named(given.rule, given.rules)))
    return EXIT_CLEAN


def match(given: Given) -> int:
    """Show, node by node, why a rule fires or does not: the pattern step that failed, or the condition's values."""
    from ..context import Audit
    from ..escape import printable
    from ..rules.match_trace import trace_rule

    settings = given.settings()
    chosen = _rule_named(given.rule, settings.rules)
    audit = Audit.of(settings, given.torch_options())
    say_notes(audit)
    graph = audit.load(given.model)
    resolver = audit.deployment.resolver(graph)
    on = f", --runtime {audit.deployment.runtime.spelled}" if audit.deployment.runtime else ""
    lines = [f"{chosen.id} {chosen.name} on {printable(given.model)} (--dtype {resolver.target.name}{on})"]
    lines += [f"  {printable(line)}" for line in trace_rule(graph, resolver, chosen, given.node)]
    write_stdout("".join(f"{line}\n" for line in lines))
    return EXIT_CLEAN


def _write_pages(folder: Path, rules: list[Rule]) -> int:
    """The rule pages, into a real folder, over no file the run read (a rule file given as DIR/index.md, or a hard
    link to one): every page is checked before any is written, so a refusal leaves no half-written set."""
    from ..errors import InputError
    from ..escape import printable
    from ..files import check_output, write_new
    from ..report.rule_pages import rule_pages

    if folder.is_symlink():
        raise InputError(str(folder), "--write-pages: is a symlink; precaudit writes pages into a real folder")
    if not folder.is_dir():
        raise InputError(str(folder), "--write-pages: no such folder")
    pages = rule_pages(rules)
    for name in pages:
        check_output(folder / name, what="the rule page")
    for name, text in pages.items():
        write_new(folder / name, text, what="the rule page")
    write_stdout(f"wrote {len(pages)} pages to {printable(str(folder))}\n")
    return EXIT_CLEAN


def _rule_named(rule: str, extra: list[str]) -> Rule:
    """The rule with this id (PA101) or name (eps-underflow); one line and exit 2 if there is none."""
    from ..errors import InputError

    found = [r for r in _rules_for_docs(extra) if r.id == rule.upper() or r.name == rule]
    if not found:
        raise InputError(None, f"unknown rule '{rule}'; `precaudit rules` lists them")
    return found[0]


def _rules_for_docs(extra: list[str]) -> list[Rule]:
    """Built-in rules plus the user's, from --rules or else the pyproject, so org rules are documented too."""
    from ..config import load_settings
    from ..rules.loader import load_rules

    return load_rules(load_settings({"rules": list(extra)} if extra else {}).rules)
