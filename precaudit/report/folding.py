"""Fold names that differ only in their numbers: encoder.block.{0..23}.layer.{0,1}.layer_norm for 48 scopes.

A digit run inside a name (block.3, Constant_12, float16) is an *index*; a number standing on its own in prose
(1e-06, 255.9, stash_type=1, 12.5%) is a *quantity*. Names fold their indices into brace sets; messages keep
their quantities, or show a measured one's range where a group's findings differ in it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

__all__ = ["Shape", "fold_names", "fold_set", "fold_texts", "shape_of"]

# A quantity: a numeric literal not glued to a name (not after a letter, digit, _, ., -, + or a quote, and not
# before one); a value named '17' (old TorchScript exports number their values) is a name.
_QUANTITY = r"(?<![\w.+\-'])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w']|\.\w)"
# scanning left to right, a quantity wins where one starts; split keeps both groups (one of them None)
_PARTS_SPLIT = re.compile(rf"({_QUANTITY})|(\d+)")
_DIGITS_SPLIT = re.compile(r"(\d+)")
_INDEX, _NUMBER = "\0i", "\0n"  # markers in a shape; reports fold escaped text (escape.printable), which has no NUL

_MAX_ITEMS = 8  # a brace set longer than this shows its first items and how many more
_MAX_PATTERNS = 4  # a folded list longer than this shows its first patterns and how many more

Shape = tuple[str, ...]


def _split(text: str, name: bool = False) -> tuple[list[str], list[str], list[str]]:
    """(literal pieces, variable parts, their kinds): pieces[i] precedes parts[i], an index or a quantity.

    In a name (name=True) every digit run is an index: a node named 12 is no quantity. One re.split does the
    scan in C (a report of thousands of findings splits every message, reason and fix).
    """
    if name:
        chunks = _DIGITS_SPLIT.split(text)  # piece, digits, piece, ...
        parts = chunks[1::2]
        return chunks[0::2], parts, [_INDEX] * len(parts)
    chunks = _PARTS_SPLIT.split(text)  # piece, quantity or None, index or None, piece, ...
    quantities, indices = chunks[1::3], chunks[2::3]
    parts = [q if q is not None else i for q, i in zip(quantities, indices)]
    kinds = [_INDEX if q is None else _NUMBER for q in quantities]
    return chunks[0::3], parts, kinds


def shape_of(text: str, quantities: bool = True) -> Shape:
    """The text with every index replaced by a marker; quantities too unless quantities=False keeps them exact.

    Two texts with one shape differ at most in those numbers: the names they quote are the same names but for
    their indices (and, with quantities, the measured numbers are in the same places).
    """
    pieces, parts, kinds = _split(text)
    out: list[str] = [pieces[0]]
    for part, kind, piece in zip(parts, kinds, pieces[1:]):
        out += [kind if kind == _INDEX or quantities else part, piece]
    return tuple(out)


def fold_set(values: Iterable[str]) -> str:
    """Digit strings as one brace set: {0..23}, {0,1}, {0..5,7,9..11}, {00..23} (same width, zero-padded).

    A single value stays bare. Runs of three or more consecutive numbers become a range; strings with leading
    zeros of differing widths (01, 1) are listed as written, since no range spells them.
    """
    distinct = sorted(set(values), key=lambda v: (len(v), v))
    if len(distinct) == 1:
        return distinct[0]
    widths = {len(v) for v in distinct}
    padded = any(len(v) > 1 and v.startswith("0") for v in distinct)
    if padded and len(widths) > 1:
        items = distinct
    else:
        width = widths.pop() if padded else 0
        items = _ranges(sorted(int(v) for v in distinct), width)
    if len(items) > _MAX_ITEMS:
        items = [*items[:_MAX_ITEMS - 2], f"… {len(items) - (_MAX_ITEMS - 2)} more"]
    return "{" + ",".join(items) + "}"


def _ranges(numbers: list[int], width: int) -> list[str]:
    items, i = [], 0
    while i < len(numbers):
        j = i
        while j + 1 < len(numbers) and numbers[j + 1] == numbers[j] + 1:
            j += 1
        first, last = f"{numbers[i]:0{width}d}", f"{numbers[j]:0{width}d}"
        items += [f"{first}..{last}"] if j - i >= 2 else [first] if i == j else [first, last]
        i = j + 1
    return items


def fold_names(names: Iterable[str], limit: int | None = _MAX_PATTERNS) -> list[str]:
    """The fewest patterns that spell exactly these names, in order of first appearance.

    Names of one shape become brace patterns; several varying indices fold together only where every
    combination exists (block.{0..23}.layer.{0,1} means all 48), otherwise into several patterns. With a limit,
    a longer list ends with "… and N more".
    """
    by_shape: dict[Shape, dict[tuple[str, ...], None]] = {}
    for name in dict.fromkeys(names):
        pieces, parts, _ = _split(name, name=True)
        shape = (pieces[0], *(x for piece in pieces[1:] for x in (_INDEX, piece)))
        by_shape.setdefault(shape, {})[tuple(parts)] = None
    patterns = []
    for shape, indices in by_shape.items():
        for merged in _merge(list(indices)):
            patterns.append(_render(shape, [fold_set(s) for s in merged]))
    if limit is not None and len(patterns) > limit:
        patterns = [*patterns[:limit], f"… and {len(patterns) - limit} more"]
    return patterns


def _merge(tuples: list[tuple[str, ...]]) -> list[tuple[frozenset[str], ...]]:
    """Merge index tuples into products of sets, exactly: an item stands for every combination of its sets.

    Two items merge at one position when they agree at every other; positions with more distinct values go
    first (the layer index before a sub-layer's), and passes repeat until nothing merges.
    """
    items = [tuple(frozenset([v]) for v in t) for t in tuples]
    if not items or not items[0]:
        return items[:1]
    order = sorted(range(len(items[0])), key=lambda p: -len({t[p] for t in tuples}))
    changed = True
    while changed:
        changed = False
        for p in order:
            merged: dict[tuple, set[str]] = {}
            for item in items:
                merged.setdefault(item[:p] + item[p + 1:], set()).update(item[p])
            if len(merged) < len(items):
                changed = True
                items = [(*rest[:p], frozenset(values), *rest[p:]) for rest, values in merged.items()]
    return items


def _render(shape: Shape, folded: Sequence[str]) -> str:
    """The shape with its markers filled in from folded, in order."""
    out, it = [], iter(folded)
    for piece in shape:
        out.append(next(it) if piece in (_INDEX, _NUMBER) else piece)
    return "".join(out)


def fold_texts(texts: Sequence[str]) -> str:
    """Texts of one shape (shape_of) as one: indices folded, and a quantity that differs shown as "lo to hi".

    Indices fold exactly where one pattern spells them all; otherwise each index position folds on its own
    (block.{0,3}.layer.{0,1} then stands for the names it was folded from, not for all four).
    """
    split = [_split(t) for t in texts]
    pieces, _, kinds = split[0]
    columns = list(zip(*(parts for _, parts, _ in split))) if kinds else []
    index_cols = [i for i, k in enumerate(kinds) if k == _INDEX]
    exact = _merge(list(dict.fromkeys(tuple(parts[i] for i in index_cols) for _, parts, _ in split)))
    folded_index = [fold_set(s) for s in exact[0]] if len(exact) == 1 else \
        [fold_set(columns[i]) for i in index_cols]
    index_iter = iter(folded_index)
    out = [pieces[0]]
    for i, kind in enumerate(kinds):
        out.append(next(index_iter) if kind == _INDEX else _span(columns[i]))
        out.append(pieces[i + 1])
    return "".join(out)


def _span(quantities: Sequence[str]) -> str:
    """One quantity, or the smallest and largest of several as written: "2.5e+03 to 7.1e+04"."""
    distinct = set(quantities)
    if len(distinct) == 1:
        return quantities[0]
    ordered = sorted(distinct, key=float)
    return f"{ordered[0]} to {ordered[-1]}"
