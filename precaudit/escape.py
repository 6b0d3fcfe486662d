"""One escaping rule for every string a model (or a typed path) puts into a report a person or a CI log reads.

A node, initializer or value name, an op type, a module scope, a stack trace's file path, an exporter name and
an exception's text all come from the model file, and so can hold anything: a newline that starts a forged
finding line, a terminal escape that clears the screen, a \\x01 that makes XML invalid, a right-to-left
override that shows text in another order than it reads ("Trojan Source"), a lone surrogate that no UTF-8
stream can encode. `printable` writes each such character as a visible escape; every other character,
including any non-ASCII letter and the backslash itself, stays as it is.

The backslash is deliberately not escaped: Windows paths keep their single backslashes, and escaping is
idempotent (printable(printable(s)) == printable(s)), so a name a loader already escaped is not escaped twice.
The price is that a name holding the four characters `\\x1b` prints like one holding an ESC; both print as
harmless visible text, and the JSON and SARIF reports carry the exact name for anyone who needs to tell.
"""

from __future__ import annotations

import re

__all__ = ["ESCAPED", "encodable", "exact_regex", "log_line", "printable"]

_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape_of(code: int) -> str:
    char = chr(code)
    if char in _SHORT:
        return _SHORT[char]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_SURROGATES = range(0xD800, 0xE000)

ESCAPED: frozenset[int] = frozenset([
    *range(0x00, 0x20),        # C0 controls: line breaks, ESC, BEL, NUL, ... (XML 1.0 cannot carry most of them)
    0x7F,                      # DEL
    *range(0x80, 0xA0),        # C1 controls: NEL (a line break), CSI (0x9b, an 8-bit ESC [), ...
    0x2028, 0x2029,            # Unicode line and paragraph separators
    0x061C, 0x200E, 0x200F,    # bidi marks: ALM, LRM, RLM
    *range(0x202A, 0x202F),    # bidi embeddings and overrides: LRE, RLE, PDF, LRO, RLO
    *range(0x2066, 0x206A),    # bidi isolates: LRI, RLI, FSI, PDI
    *_SURROGATES,              # lone surrogates (a path with undecodable bytes): no UTF-8 file can hold them
    0xFFFE, 0xFFFF,            # noncharacters XML 1.0 forbids
])
"""The code points printable escapes: the Unicode Bidi_Control set, every control and line break, surrogates."""

_TABLE = {code: _escape_of(code) for code in ESCAPED}
_SURROGATE_TABLE = {code: _escape_of(code) for code in _SURROGATES}


def printable(text: str) -> str:
    """The text with every character in ESCAPED written as a visible \\n, \\r, \\t, \\xNN or \\uNNNN escape.

    The result is one line, shows in reading order, holds no terminal escape, encodes to UTF-8 and is legal in
    XML 1.0 text and attributes.
    """
    if text.isascii() and text.isprintable():  # most names: no character of ESCAPED, checked in C
        return text
    return text.translate(_TABLE)


def log_line(line: str) -> str:
    """A line for a CI log, with no `##[` left in it.

    GitHub's runner still reads its older workflow-command syntax, `##[command]data`, anywhere in any line of a
    step's stdout or stderr that is no `::command` line, and acts on it: an error annotation, add-mask, set-output.
    The [ is written \\x5b, the visible escape printable uses, so a file named `##[error]x.onnx` stays readable.
    """
    return line.replace("##[", "##\\x5b")


def encodable(text: str) -> str:
    """The text with only its lone surrogates escaped (as printable does): for JSON, which carries names raw.

    json.dumps would write a lone surrogate as \\udcxx, which Python reads back but strict parsers (and I-JSON,
    RFC 7493) reject; a path from a file system that is not UTF-8 is the usual source.
    """
    if text.isascii():  # most strings: no surrogate, checked in C
        return text
    return text.translate(_SURROGATE_TABLE)


def exact_regex(name: str) -> str:
    """A regex that re.match (anchored at the start only) and re.search accept for exactly this name, as the
    converters' nodes_to_exclude take them (modelopt, torch_tensorrt). Characters that
    cannot print (a control character in a name) are written as regex escapes, which match them."""
    # escaped character by character: re.escape first would put a backslash before a control character, and its
    # \xNN form after that backslash would match a literal backslash and "xNN" instead. \Z, not $: $ also matches
    # before a trailing newline, so "^a$" accepts the node "a\n" too
    escaped = "".join((f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}") if ord(c) in ESCAPED
                      else re.escape(c) for c in name)
    return f"^{escaped}\\Z"
