"""Markdown that shows a stranger's text as written: a rule's prose on the docs site and in SARIF's help.

Every string a rule supplies makes no markup but its author's `inline code` and *emphasis* (which make only
<code>, <em> and <strong>): no raw HTML or entity, no link or image, no heading, list, quote, rule line, table or
code block. Names go in inline code; code in a fence longer than any run of backticks it holds.
"""

from __future__ import annotations

import itertools
import re

from ..escape import printable

__all__ = ["cell", "cell_code", "code_block", "code_span", "link_or_text", "one_line", "prose"]

# Shown as written: a backslash escape for Markdown's own characters (the backslash itself; a backtick that opens
# no code span; [ that could open a link, an image or a reference definition; a table's |), an entity for HTML's.
_MARKUP = str.maketrans({"\\": "\\\\", "`": "\\`", "[": "\\[", "|": "\\|", "&": "&amp;", "<": "&lt;", ">": "&gt;"})
# What makes a line start a block: a heading, a list item, a rule line or setext underline (a line of one of -*_=),
# a fence (~~~, or the author's code span when its fence is three or more backticks).
_BLOCK_START = re.compile(r"#|[-+*](?=\s|$)|\d+\.(?=\s|$)|([-*_=])(?:\s*\1)*\s*$|~~~|```")


def prose(text: str) -> str:
    """Rule text as Markdown that shows it as written, line breaks and blank lines kept (see the module's doc)."""
    lines = [line.strip() for line in text.expandtabs(4).strip().split("\n")]  # indenting would make a code block
    out: list[str] = []
    for filled, group in itertools.groupby(lines, key=bool):  # a code span never crosses a blank line
        block = list(group)
        out += [_line_start(line) for line in _inline("\n".join(block)).split("\n")] if filled else block
    return "\n".join(out)


def one_line(text: str) -> str:
    """A one-line field (summary, reference) as prose: a line break in it would start a block."""
    return prose(" ".join(text.split()))


def _inline(text: str) -> str:
    """The text with its code spans, each on one line, and everything around them escaped."""
    pieces, done = [], 0
    for start, end, fence in _code_spans(text):
        pieces += [_escaped(text[done:start]), code_span(text[start + fence:end - fence].replace("\n", " "))]
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


def code_span(text: str) -> str:
    """Inline code showing the text as written, on one line, that no run of backticks inside can close."""
    shown = printable(text)
    runs = {len(run) for run in re.findall("`+", shown)}
    fence = "`" * next(n for n in itertools.count(1) if n not in runs)
    pad = " " if shown.startswith("`") or shown.endswith("`") else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


def code_block(text: str, info: str = "text") -> str:
    """A fenced code block that no run of backticks inside can close."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text.rstrip()}\n{fence}"


def cell(text: str) -> str:
    """Text for a Markdown table cell: shown as written, on one line, with no column break and no code span (the
    table splits its columns by pairing backticks otherwise than the code spans do)."""
    return printable(" ".join(text.split())).translate(_MARKUP)


def cell_code(text: str) -> str:
    """A cell's inline code, where no backtick, backslash or | in it can move the cell's bounds; else its text."""
    shown = printable(" ".join(text.split()))
    return f"`{shown}`" if shown and not set("`\\|") & set(shown) else cell(text)


def link_or_text(url: str) -> str:
    """An http(s) URL as an autolink; anything else (javascript:, data:, a URL an autolink cannot hold) as text."""
    if re.fullmatch(r"https?://[^\s<>`\\]+", url) and url.isprintable():
        return f"<{url}>"
    return one_line(url)
