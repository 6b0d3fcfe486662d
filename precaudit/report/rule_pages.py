"""A Markdown page per rule, and the rules index, generated from the rule files (docs/rules/).

The pages are the rules' own text — summary, description, the worked example, message, fix, what `precaudit fix`
does, parameters, references — so they cannot drift from what `precaudit explain` prints. A rule file may come from
a stranger (a user's rule directory): prose is HTML-escaped (Markdown passes raw HTML through) and code goes in a
fence longer than any run of backticks it holds.
"""

from __future__ import annotations

import html
import re

from ..rules.loader import Rule
from .rule_docs import _repair_words, default_state, fixable, placeholders

__all__ = ["rule_page", "rules_index", "page_name", "rule_pages"]


def page_name(rule: Rule) -> str:
    return f"{rule.id}-{rule.name}.md"


def _prose(text: str) -> str:
    """Text as Markdown prose: no raw HTML (escaped), line breaks kept as written."""
    return html.escape(text.strip(), quote=False)


def _code(text: str, info: str = "text") -> str:
    """A fenced code block that no run of backticks inside can close."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text.rstrip()}\n{fence}"


def _cell(text: str) -> str:
    """Text for a Markdown table cell: escaped, on one line, with no column break."""
    return _prose(" ".join(text.split())).replace("|", "\\|")


def rule_page(rule: Rule) -> str:
    applies = f"the op pattern in `{rule.source.rsplit('/', 1)[-1]}`" if rule.pattern is not None else \
        ", ".join(f"`{s}`" for s in rule.sites) + " sites"
    if rule.ops:
        applies += " of " + ", ".join(f"`{op}`" for op in rule.ops)
    lines = [f"# {rule.id} {rule.name}", "",
             f"**{rule.severity}**, {default_state(rule)} by default · applies to {applies} · "
             f"`precaudit fix`: {_cell(fixable(rule))}", "", _prose(rule.summary), ""]
    if rule.description:
        lines += ["## What it checks", "", _prose(rule.description), ""]
    if rule.example:
        lines += ["## Example", "", _code(rule.example), ""]
    lines += ["## Message", "", _code(placeholders(" ".join(rule.message.split()))), "",
              "## Fix", "", _prose(placeholders(rule.fix)), "",
              "## `precaudit fix`", "", _prose(_repair_words(rule)), ""]
    lines += ["## Condition", "", _code(" ".join(rule.condition.text.split()), "python"), ""]
    if rule.params:
        lines += ["## Parameters", "", "Override them in your own rule file (`--rules`).", "",
                  "| name | default |", "|---|---|",
                  *(f"| `{_cell(str(k))}` | `{_cell(repr(v))}` |" for k, v in rule.params.items()), ""]
    if rule.references:
        lines += ["## References", "", *(f"- {_prose(ref)}" for ref in rule.references), ""]
    lines += [f"*Generated from `{rule.source.rsplit('/', 1)[-1]}` by `precaudit rules --write-pages`.*"]
    return "\n".join(lines) + "\n"


def rules_index(rules: list[Rule]) -> str:
    """The rules table: one row per rule, linking to its page."""
    lines = ["# Rules", "",
             "Every rule is a YAML file in `rules/`; these pages are generated from them "
             "(`precaudit rules --write-pages docs/rules`), with the rule-file JSON Schema editors validate a rule "
             "file against ([rule-schema.json](rule-schema.json)).", "",
             "| id | name | severity | default | fix | summary |", "|---|---|---|---|---|---|"]
    lines += [f"| [{r.id}]({page_name(r)}) | {r.name} | {r.severity} | {default_state(r)} | {_cell(fixable(r))} | "
              f"{_cell(r.summary)} |" for r in rules]
    return "\n".join(lines) + "\n"


def rule_pages(rules: list[Rule]) -> dict[str, str]:
    """File name -> text, for every page the rules make: index.md, one per rule, and the rule-file JSON Schema."""
    from ..rules.schema import render_schema

    return {"index.md": rules_index(rules), **{page_name(r): rule_page(r) for r in rules},
            "rule-schema.json": render_schema()}
