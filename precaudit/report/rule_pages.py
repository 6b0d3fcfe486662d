"""A Markdown page per rule, and the rules index, generated from the rule files (docs/rules/).

The pages are the rules' own text — summary, description, the worked example, message, fix, what `precaudit fix`
does, parameters, references — so they cannot drift from what `precaudit explain` prints. A rule file may come from
a stranger (a user's rule directory), and mkdocs turns these pages into a web site: every string a rule supplies
shows as its author wrote it and makes no markup but its author's `inline code` and *emphasis* (which make only
<code>, <em> and <strong>). No raw HTML or entity, no link or image (a reference is text, whatever its scheme), no
heading, list, quote, rule line, table or code block; names (ops, the rule file's name, parameters) go in inline
code, the example, message and condition in a fence longer than any run of backticks they hold. Page names are the
rule's id and name, which the loader allows only as PA101 and kebab-case.
"""

from __future__ import annotations

from pathlib import Path

from ..rules.loader import Rule
from .markdown import cell, cell_code, code_block, code_span, one_line, prose
from .rule_docs import _repair_words, default_state, fixable, placeholders

__all__ = ["page_name", "rule_page", "rule_pages", "rules_index"]


def page_name(rule: Rule) -> str:
    return f"{rule.id}-{rule.name}.md"


def rule_page(rule: Rule) -> str:
    source = Path(rule.source).name
    applies = f"the op pattern in {code_span(source)}" if rule.pattern is not None else \
        ", ".join(f"`{s}`" for s in rule.sites) + " sites"
    if rule.ops:
        applies += " of " + ", ".join(code_span(op) for op in rule.ops)
    lines = [f"# {rule.id} {rule.name}", "",
             f"**{rule.severity}**, {default_state(rule)} by default · applies to {applies} · "
             f"`precaudit fix`: {cell(fixable(rule))}", "", one_line(rule.summary), ""]
    if rule.description:
        lines += ["## What it checks", "", prose(rule.description), ""]
    if rule.example:
        lines += ["## Example", "", code_block(rule.example), ""]
    lines += ["## Message", "", code_block(placeholders(" ".join(rule.message.split()))), "",
              "## Fix", "", prose(placeholders(rule.fix)), "",
              "## `precaudit fix`", "", prose(_repair_words(rule)), ""]
    lines += ["## Condition", "", code_block(" ".join(rule.condition.text.split()), "python"), ""]
    if rule.params:
        lines += ["## Parameters", "", "Override them in your own rule file (`--rules`).", "",
                  "| name | default |", "|---|---|",
                  *(f"| {cell_code(str(k))} | {cell_code(repr(v))} |" for k, v in rule.params.items()), ""]
    if rule.references:
        lines += ["## References", "", *(f"- {one_line(ref)}" for ref in rule.references), ""]
    lines += [f"*Generated from {code_span(source)} by `precaudit rules --write-pages`.*"]
    return "\n".join(lines) + "\n"


def rules_index(rules: list[Rule]) -> str:
    """The rules table: one row per rule, linking to its page."""
    lines = ["# Rules", "",
             "Every rule is a YAML file in `rules/`; these pages are generated from them "
             "(`precaudit rules --write-pages docs/rules`), with the rule-file JSON Schema editors validate a rule "
             "file against ([rule-schema.json](rule-schema.json)).", "",
             "| id | name | severity | default | fix | summary |", "|---|---|---|---|---|---|"]
    lines += [f"| [{r.id}]({page_name(r)}) | {r.name} | {r.severity} | {default_state(r)} | {cell(fixable(r))} | "
              f"{cell(r.summary)} |" for r in rules]
    return "\n".join(lines) + "\n"


def rule_pages(rules: list[Rule]) -> dict[str, str]:
    """File name -> text, for every page the rules make: index.md, one per rule, and the rule-file JSON Schema."""
    from ..rules.schema import render_schema

    return {"index.md": rules_index(rules), **{page_name(r): rule_page(r) for r in rules},
            "rule-schema.json": render_schema()}
