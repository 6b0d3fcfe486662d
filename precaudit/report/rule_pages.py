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

import itertools
import re
from pathlib import Path

from ..escape import printable
from ..rules.loader import Rule
from .rule_docs import _repair_words, default_state, fixable, placeholders

__all__ = ["rule_page", "rules_index", "page_name", "rule_pages"]

# Shown as written: a backslash escape for Markdown's own characters (the backslash itself; a backtick that opens
# no code span; [ that could open a link, an image or a reference definition; a table's |), an entity for HTML's.
_MARKUP = str.maketrans({"\\": "\\\\", "`": "\\`", "[": "\\[", "|": "\\|", "&": "&amp;", "<": "&lt;", ">": "&gt;"})
# What makes a line start a block: a heading, a list item, a rule line or setext underline (a line of one of -*_=),
# a fence (~~~, or the author's code span when its fence is three or more backticks).
_BLOCK_START = re.compile(r"#|[-+*](?=\s|$)|\d+\.(?=\s|$)|([-*_=])(?:\s*\1)*\s*$|~~~|```")


def page_name(rule: Rule) -> str:
    return f"{rule.id}-{rule.name}.md"


def _prose(text: str) -> str:
    """Rule text as Markdown that shows it as written, line breaks and blank lines kept (see the module's doc)."""
    lines = [line.strip() for line in text.expandtabs(4).strip().split("\n")]  # indenting would make a code block
    out: list[str] = []
    for filled, group in itertools.groupby(lines, key=bool):  # a code span never crosses a blank line
        block = list(group)
        out += [_line_start(line) for line in _inline("\n".join(block)).split("\n")] if filled else block
    return "\n".join(out)


def _one_line(text: str) -> str:
    """A one-line field (summary, reference) as prose: a line break in it would start a block."""
    return _prose(" ".join(text.split()))


def _inline(text: str) -> str:
    """The text with its code spans, each on one line, and everything around them escaped."""
    pieces, done = [], 0
    for start, end, fence in _code_spans(text):
        pieces += [_escaped(text[done:start]), _code_span(text[start + fence:end - fence].replace("\n", " "))]
        done = end
    return "".join(pieces) + _escaped(text[done:])


def _code_spans(text: str) -> list[tuple[int, int, int]]:
    """(start, end, fence length) of each code span: a run of backticks closed by the next run of the same length
    (as Markdown pairs them), in one pass however many runs never close."""
    runs = [(m.start(), m.end()) for m in re.finditer("`+", text)]
    closer: dict[int, int] = {}
    last: dict[int, int] = {}  # run length -> the nearest run of it after the one looked at
    for i in reversed(range(len(runs))):
        length = runs[i][1] - runs[i][0]
        if length in last:
            closer[i] = last[length]
        last[length] = i
    spans, i = [], 0
    while i < len(runs):
        if i in closer:
            spans.append((runs[i][0], runs[closer[i]][1], runs[i][1] - runs[i][0]))
            i = closer[i]
        i += 1
    return spans


def _escaped(text: str) -> str:
    return "\n".join(printable(line).translate(_MARKUP) for line in text.split("\n"))


def _line_start(line: str) -> str:
    """A line that cannot start a Markdown block."""
    if not _BLOCK_START.match(line):
        return line
    if line.startswith(("~~~", "```")):
        return " " + line  # a fence opens only at the margin
    if line.startswith("="):
        return "&#61;" + line[1:]  # (= has no backslash escape)
    digits = len(line) - len(line.lstrip("0123456789"))
    return f"{line[:digits]}\\{line[digits:]}"


def _code_span(text: str) -> str:
    """Inline code showing the text as written, on one line, that no run of backticks inside can close."""
    shown = printable(text)
    runs = {len(run) for run in re.findall("`+", shown)}
    fence = "`" * next(n for n in itertools.count(1) if n not in runs)
    pad = " " if shown.startswith("`") or shown.endswith("`") else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


def _code(text: str, info: str = "text") -> str:
    """A fenced code block that no run of backticks inside can close."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text.rstrip()}\n{fence}"


def _cell(text: str) -> str:
    """Text for a Markdown table cell: shown as written, on one line, with no column break and no code span (the
    table splits its columns by pairing backticks otherwise than the code spans do)."""
    return printable(" ".join(text.split())).translate(_MARKUP)


def _cell_code(text: str) -> str:
    """A cell's inline code, where no backtick, backslash or | in it can move the cell's bounds; else its text."""
    shown = printable(" ".join(text.split()))
    return f"`{shown}`" if shown and not set("`\\|") & set(shown) else _cell(text)


def rule_page(rule: Rule) -> str:
    source = Path(rule.source).name
    applies = f"the op pattern in {_code_span(source)}" if rule.pattern is not None else \
        ", ".join(f"`{s}`" for s in rule.sites) + " sites"
    if rule.ops:
        applies += " of " + ", ".join(_code_span(op) for op in rule.ops)
    lines = [f"# {rule.id} {rule.name}", "",
             f"**{rule.severity}**, {default_state(rule)} by default · applies to {applies} · "
             f"`precaudit fix`: {_cell(fixable(rule))}", "", _one_line(rule.summary), ""]
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
                  *(f"| {_cell_code(str(k))} | {_cell_code(repr(v))} |" for k, v in rule.params.items()), ""]
    if rule.references:
        lines += ["## References", "", *(f"- {_one_line(ref)}" for ref in rule.references), ""]
    lines += [f"*Generated from {_code_span(source)} by `precaudit rules --write-pages`.*"]
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
