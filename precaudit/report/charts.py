"""Inline SVG charts for the HTML report: the headroom chart, the norms' variance against eps, the dtype strip.

Every chart is plain SVG written here, with a <title> per mark for its tooltip (no script needed), and every name
escaped (html.escape of escape.printable). More points than pixels are aggregated along module scopes first.
"""

from __future__ import annotations

import html
import math
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..dtypes import FORMATS, Format
from ..escape import printable
from ..finding import Finding, severity_rank
from ..trace.profile import NormPoint, TraceProfile, ValuePoint
from .dtype_map import NodeDtype

__all__ = [
    "DTYPE_COLORS",
    "MAX_POINTS",
    "Buckets",
    "bucket_by_scope",
    "dtype_strip",
    "esc",
    "headroom_chart",
    "num",
    "variance_chart",
]

MAX_POINTS = 1500  # more points than this (about the chart's width in pixels) are aggregated
_W, _LEFT, _RIGHT = 1200, 64, 190  # viewBox width, room for the y labels and for the limit lines' labels
_PLOT_W = _W - _LEFT - _RIGHT
DTYPE_COLORS = {"fp16": "#4e79a7", "bf16": "#8c6bb1", "fp8-e4m3": "#e15759", "fp8-e5m2": "#ff9d9a",
                "fp32": "#59a14f", "fp64": "#2d6a2d", None: "#d9d9d9"}


def esc(text: object) -> str:
    """A string from a model or a path, safe in HTML text and attributes, one visible line (escape.printable)."""
    return html.escape(printable(str(text)), quote=True)


def num(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:.{digits}g}"


@dataclass
class Buckets:
    """Consecutive runs of points, one mark each; `how` says how they were aggregated (None: one per point)."""

    runs: list[range]
    how: str | None = None
    labels: list[str] = field(default_factory=list)  # the scope each run stands for, when aggregated by scope

    def __post_init__(self) -> None:
        self._stops = [r.stop for r in self.runs]

    def index_of(self, point: int) -> int:
        """The run holding this point index."""
        return bisect_left(self._stops, point + 1)


def bucket_by_scope(scopes: Sequence[str | None], limit: int = MAX_POINTS) -> Buckets:
    """One run per point while they fit; else runs of the deepest module-scope prefix that fits, else equal chunks."""
    n = len(scopes)
    if n <= limit:
        return Buckets([range(i, i + 1) for i in range(n)])
    parts = [s.split(".") if s else [] for s in scopes]
    for depth in range(max(map(len, parts), default=0), 0, -1):
        runs, labels = _runs([tuple(p[:depth]) for p in parts])
        if len(runs) <= limit:
            example = next((".".join(k) for k in labels if len(k) == depth), "")
            return Buckets(runs, f"by module scope, {depth} level{'s' * (depth != 1)} deep (as {example})",
                           [".".join(k) or "(no scope)" for k in labels])
    size = math.ceil(n / limit)
    return Buckets([range(i, min(i + size, n)) for i in range(0, n, size)], f"{size} consecutive points per mark")


def _runs(keys: Sequence[tuple]) -> tuple[list[range], list[tuple]]:
    runs, labels, start = [], [], 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or keys[i] != keys[start]:
            runs.append(range(start, i))
            labels.append(keys[start])
            start = i
    return runs, labels


def _carried(keys: list[tuple | None]) -> list[tuple]:
    """A point scoped above the level (None: the model's shape plumbing between layers) stays in the run before it."""
    out, last = [], ()
    for key in keys:
        last = key if key is not None else last
        out.append(last)
    return out


class _LogAxis:
    """y = log2(v), from lo (bottom) to hi (top) over the plot's height."""

    def __init__(self, lo: float, hi: float, top: float, height: float):
        self.lo, self.hi, self.top, self.height = lo, hi, top, height

    def y(self, v: float) -> float:
        e = math.log2(v) if v > 0 else self.lo
        e = min(max(e, self.lo), self.hi)
        return self.top + (self.hi - e) / (self.hi - self.lo) * self.height

    def ticks(self, most: int = 12) -> list[str]:
        span = self.hi - self.lo
        step = next((s for s in (1, 2, 4, 5, 8, 10, 16, 20, 32, 50, 64) if span / s <= most), 128)
        out = []
        for e in range(math.ceil(self.lo / step) * step, math.floor(self.hi) + 1, step):
            y = self.y(2.0 ** e)
            out.append(f'<line class="grid" x1="{_LEFT}" x2="{_LEFT + _PLOT_W}" y1="{y:.1f}" y2="{y:.1f}"/>'
                       f'<text class="tick" x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">2'
                       f'<tspan dy="-6" font-size="9">{e}</tspan></text>')
        return out


def _range_of(values: Iterable[float | None], fmt: Format) -> tuple[float, float]:
    """log2 bounds: the format's subnormals to above its max, widened to the data (within reason)."""
    logs = [math.log2(v) for v in values if v and v > 0 and math.isfinite(v)]
    lo = math.log2(fmt.smallest_subnormal) - 3
    hi = math.log2(fmt.max) + 3
    if logs:
        lo = max(min(lo, min(logs) - 1), lo - 40)
        hi = min(max(hi, max(logs) + 1), hi + 40)
    return math.floor(lo), math.ceil(hi)


def _svg(height: float, body: list[str], label: str, cls: str) -> str:
    return (f'<svg class="chart {cls}" viewBox="0 0 {_W} {height:.0f}" role="img" aria-label="{esc(label)}" '
            f'xmlns="http://www.w3.org/2000/svg">' + "".join(body) + "</svg>")


@dataclass
class _Mark:
    """One aggregated band of the headroom chart."""

    points: list[ValuePoint]

    @property
    def absmax(self) -> float:
        return max(p.absmax for p in self.points)

    @property
    def min_nonzero(self) -> float | None:
        return min((p.min_nonzero for p in self.points if p.min_nonzero is not None), default=None)

    def total(self, attr: str) -> int:
        return sum(getattr(p, attr) for p in self.points)


def headroom_chart(profile: TraceProfile, fmt: Format, findings: Sequence[Finding],
                   lines: Sequence[tuple[str, float, str]] = (),
                   label: str = "headroom of every value") -> tuple[str, Buckets]:
    """Each value's |x| from its smallest nonzero to its largest against the format's limits, in node order;
    `lines` are more (name, value, label) levels drawn as the limits are (the training chart's loss-scale window)."""
    values = profile.values
    buckets = bucket_by_scope([p.scope for p in values])
    marks = [_Mark([values[i] for i in run]) for run in buckets.runs]
    top, height = 34, 420
    axis = _LogAxis(*_range_of([v for p in values for v in (p.absmax, p.min_nonzero)], fmt), top, height)
    bw = _PLOT_W / max(len(marks), 1)
    index: dict[str, int] = {}  # node name -> its first mark
    for i, p in enumerate(values):
        index.setdefault(p.node, buckets.index_of(i))
    body = [*_zones(axis, fmt), *axis.ticks(), *_scope_axis(values, buckets, top + height),
            *_bands(marks, buckets, axis, fmt), *_limit_lines(axis, fmt, lines),
            *_finding_marks(findings, index, bw, top),
            *_norm_marks(profile.norms, [p.order for p in values], buckets, bw, top + height)]
    if profile.first_nonfinite in index:
        body.append(_first_nonfinite(profile.first_nonfinite, _LEFT + index[profile.first_nonfinite] * bw, bw, axis, fmt))
    return _svg(top + height + 46, body, f"{label} against {fmt.long_name}", "headroom"), buckets


def _bands(marks: Sequence[_Mark], buckets: Buckets, axis: _LogAxis, fmt: Format) -> list[str]:
    """One rect per mark from its smallest nonzero |x| to its largest, its numbers in the tooltip."""
    bw = _PLOT_W / max(len(marks), 1)
    out = ['<g class="series" data-series="values">']
    for i, mark in enumerate(marks):
        lo = mark.min_nonzero
        if mark.absmax <= 0 or lo is None:
            continue  # every element 0: nothing to draw on a log scale
        y1, y2 = axis.y(mark.absmax), axis.y(lo)
        title = _value_title(mark, buckets.labels[i] if buckets.how and buckets.labels else None)
        out.append(f'<rect class="band {_band_class(mark, fmt)}" x="{_LEFT + i * bw + bw * 0.1:.2f}" y="{y1:.1f}" '
                   f'width="{max(bw * 0.8, 1):.2f}" height="{max(y2 - y1, 1.5):.1f}" '
                   f'data-node="{esc(mark.points[0].node)}" data-absmax="{mark.absmax:.6g}" '
                   f'data-min-nonzero="{lo:.6g}"><title>{title}</title></rect>')
    out.append("</g>")
    return out


def _first_nonfinite(node: str, x: float, bw: float, axis: _LogAxis, fmt: Format) -> str:
    """A red column over the node where the run first turns inf/NaN on a path to an output, labelled."""
    name = esc(node)
    anchor = "start" if x < _LEFT + _PLOT_W * 0.7 else "end"
    return (f'<g class="series" data-series="first-nonfinite" data-node="{name}">'
            f'<rect class="nonfinite" x="{x - 2:.1f}" y="{axis.top}" width="{max(bw, 4) + 4:.1f}" '
            f'height="{axis.height}"><title>first inf/NaN in the {esc(fmt.long_name)} run: {name}</title></rect>'
            f'<text class="nonfinite-label" x="{x + 6 if anchor == "start" else x - 4:.1f}" y="{axis.top + 14}" '
            f'text-anchor="{anchor}">first inf/NaN: {name}</text></g>')


def _zones(axis: _LogAxis, fmt: Format) -> list[str]:
    """Shaded bands: beyond the max (inf), subnormal (fewer bits), below half the smallest subnormal (0)."""
    y_max, y_normal = axis.y(fmt.max), axis.y(fmt.smallest_normal)
    y_zero = axis.y(fmt.smallest_subnormal / 2)
    bottom = axis.top + axis.height
    x, w = _LEFT, _PLOT_W
    return [f'<rect class="zone over" x="{x}" y="{axis.top}" width="{w}" height="{y_max - axis.top:.1f}"/>',
            f'<rect class="zone subnormal" x="{x}" y="{y_normal:.1f}" width="{w}" height="{y_zero - y_normal:.1f}"/>',
            f'<rect class="zone zero" x="{x}" y="{y_zero:.1f}" width="{w}" height="{bottom - y_zero:.1f}"/>',
            f'<rect class="frame" x="{x}" y="{axis.top}" width="{w}" height="{axis.height}"/>']


def _limit_lines(axis: _LogAxis, fmt: Format, more: Sequence[tuple[str, float, str]] = ()) -> list[str]:
    lines = [("max", fmt.max, f"{fmt.long_name} max {num(fmt.max, 6)}"),
             ("smallest-normal", fmt.smallest_normal, f"smallest normal {num(fmt.smallest_normal)}"),
             ("smallest-subnormal", fmt.smallest_subnormal, f"smallest subnormal {num(fmt.smallest_subnormal)}"),
             *more]
    out = ['<g class="series" data-series="limits">']
    for name, value, label in lines:
        y = axis.y(value)
        out.append(f'<g class="limit" data-limit="{name}" data-value="{value:.6g}">'
                   f'<line x1="{_LEFT}" x2="{_LEFT + _PLOT_W}" y1="{y:.1f}" y2="{y:.1f}"/>'
                   f'<text x="{_LEFT + _PLOT_W + 6}" y="{y + 4:.1f}">{esc(label)}</text></g>')
    out.append("</g>")
    return out


def _band_class(mark: _Mark, fmt: Format) -> str:
    if mark.total("overflow") or mark.total("nonfinite") > mark.total("ref_nonfinite"):
        return "over"
    if mark.total("underflow"):
        return "under"
    return "wide" if all(p.dtype != fmt.name for p in mark.points) else "held"


def _value_title(mark: _Mark, label: str | None) -> str:
    p = mark.points[0]
    elements = mark.total("elements")
    held = ", ".join(FORMATS[d].long_name for d in dict.fromkeys(q.dtype for q in mark.points))
    if label is None:
        head = f"{p.node} ({p.op})" + (f" in {p.scope}" if p.scope else "") + f"\nvalue '{p.value}', held in {held}"
    else:
        head = f"{label}: {len(mark.points)} values, {p.node} … {mark.points[-1].node}\nheld in {held}"
    counts = [f"{n} {what}" for what, n in (("overflow", mark.total("overflow")),
                                            ("round to 0", mark.total("underflow")),
                                            ("subnormal", mark.total("subnormal")),
                                            ("inf/NaN in the emulated run", mark.total("nonfinite")),
                                            ("inf/NaN in the float reference", mark.total("ref_nonfinite"))) if n]
    return esc(f"{head}\n|x| from {num(mark.min_nonzero)} to {num(mark.absmax)} over {elements} elements"
               + (f"\n{', '.join(counts)}" if counts else ""))


def _finding_marks(findings: Sequence[Finding], index: dict[str, int], bw: float, top: float) -> list[str]:
    """A triangle above each mark that has findings, in the colour of the worst."""
    at: dict[int, list[Finding]] = {}
    for f in findings:
        if f.node_name in index:
            at.setdefault(index[f.node_name], []).append(f)
    out = ['<g class="series" data-series="findings">']
    for i, hits in sorted(at.items()):
        worst = max(hits, key=lambda f: severity_rank(f.severity)).severity
        x = _LEFT + (i + 0.5) * bw
        rules = sorted({f.rule_id for f in hits})
        lines = [f"{f.rule_id} {f.rule_name}: {f.node_name}" for f in hits[:8]]
        more = f"\n… {len(hits) - 8} more" if len(hits) > 8 else ""
        out.append(f'<path class="marker {worst}" d="M{x - 5:.1f},{top - 12} h10 l-5,9 z" data-rules="{" ".join(rules)}">'
                   f'<title>{esc(chr(10).join(lines) + more)}</title></path>')
    out.append("</g>")
    return out


def _norm_marks(norms: Sequence[NormPoint], orders: list[int], buckets: Buckets, bw: float, bottom: float) -> list[str]:
    """A diamond under the mark of each norm (the first value made at or after its node); a tick where they crowd."""
    out = ['<g class="series" data-series="norms">']
    shape = "l4,5 l-4,5 l-4,-5 z" if len(norms) * 10 <= _PLOT_W else "v10 h1 v-10 z"
    for n in norms:
        point = bisect_left(orders, n.order)
        if point >= len(orders):
            continue
        x = _LEFT + (buckets.index_of(point) + 0.5) * bw
        bad = " below-eps" if n.eps is not None and (n.zero_variance_rows or n.median_variance < n.eps) else ""
        out.append(f'<path class="norm{bad}" d="M{x:.1f},{bottom + 3} {shape}" data-node="{esc(n.node)}">'
                   f'<title>{esc(_norm_text(n))}</title></path>')
    out.append("</g>")
    return out


def _norm_text(n: NormPoint) -> str:
    eps = "no eps" if n.eps is None else f"eps {num(n.eps)} ({num(n.eps_rounded)} in {n.compute_dtype})"
    return (f"norm {n.node} ({n.op})" + (f" in {n.scope}" if n.scope else "") + f"\n{eps}\nrows' variance: "
            f"min {num(n.min_variance)}, median {num(n.median_variance)} over {n.rows} rows; "
            f"{n.rows_below_eps} below eps, {n.zero_variance_rows} exactly 0 in {n.compute_dtype}")


def _scope_axis(points: Sequence, buckets: Buckets, bottom: float) -> list[str]:
    """Separators and labels under the plot: the shallowest scope level that ends in an index (block.3), else the
    deepest level that splits the graph into 2 to 40 parts; labels that would overlap are left out."""
    parts = [p.scope.split(".") if p.scope else [] for p in points]
    chosen: list[tuple] | None = None
    for depth in range(1, max(map(len, parts), default=0) + 1):
        runs, keys = _runs(_carried([tuple(p[:depth]) if len(p) >= depth else None for p in parts]))
        if len(runs) >= 2 and sum(len(k) == depth and k[-1].isdigit() for k in keys) * 2 > len(keys):
            chosen = list(zip(runs, keys))
            break
        if 2 <= len(runs) <= 40:
            chosen = list(zip(runs, keys))
    if not chosen:
        return []
    bw = _PLOT_W / max(len(buckets.runs), 1)
    out, last_sep, last_text = ['<g class="scope-axis">'], -10.0, -10.0
    for run, key in chosen:
        x0 = _LEFT + buckets.index_of(run.start) * bw
        x1 = _LEFT + (buckets.index_of(run.stop - 1) + 1) * bw
        if x0 - last_sep >= 3:
            out.append(f'<line class="sep" x1="{x0:.1f}" x2="{x0:.1f}" y1="{bottom}" y2="{bottom + 22}"/>')
            last_sep = x0
        # block.3 where it fits, else 3, else nothing
        labels = [".".join(key[-2:]), key[-1]] if key and key[-1].isdigit() else [key[-1]] if key else []
        for label in labels:
            width = 6.5 * len(printable(label))
            # centred under its run, but inside the plot
            middle = min(max((x0 + x1) / 2, _LEFT + width / 2), _LEFT + _PLOT_W - width / 2)
            # a name (word_embeddings) only under a run as wide as it; an index wherever it does not overlap
            if middle - width / 2 >= last_text + 4 and (label[-1].isdigit() or width <= x1 - x0 + 10):
                out.append(f'<text class="scope" x="{middle:.1f}" y="{bottom + 18}" text-anchor="middle">'
                           f'{esc(label)}<title>{esc(".".join(key))}</title></text>')
                last_text = middle + width / 2
                break
    out.append("</g>")
    return out


def variance_chart(norms: Sequence[NormPoint], fmt: Format) -> str:
    """Per norm, its rows' variance from the smallest to the median against its eps (as written, and in its dtype)."""
    buckets = bucket_by_scope([n.scope for n in norms])
    groups = [[norms[i] for i in run] for run in buckets.runs]
    numbers = [v for n in norms for v in (n.min_variance, n.median_variance, n.eps, n.eps_rounded)
               if v is not None and v > 0 and math.isfinite(v)]
    lo, hi = _range_of(numbers, fmt)
    if numbers:  # the variances and eps, not the whole format, set this chart's scale
        lo, hi = max(lo, math.floor(math.log2(min(numbers))) - 2), min(hi, math.ceil(math.log2(max(numbers))) + 2)
    axis = _LogAxis(lo, hi, 16, 220)
    body = [f'<rect class="frame" x="{_LEFT}" y="{axis.top}" width="{_PLOT_W}" height="{axis.height}"/>',
            *axis.ticks(7)]
    if lo < math.log2(fmt.smallest_normal) < hi:
        y = axis.y(fmt.smallest_normal)
        body.append(f'<g class="limit" data-limit="smallest-normal"><line x1="{_LEFT}" x2="{_LEFT + _PLOT_W}" '
                    f'y1="{y:.1f}" y2="{y:.1f}"/><text x="{_LEFT + _PLOT_W + 6}" y="{y + 4:.1f}">'
                    f'smallest normal {esc(fmt.long_name)}</text></g>')
    bw = _PLOT_W / max(len(groups), 1)
    body += ['<g class="series" data-series="variance">',
             *(_variance_column(group, _LEFT + (i + 0.5) * bw, bw, axis) for i, group in enumerate(groups)), "</g>"]
    return _svg(axis.top + axis.height + 12, body, "per norm, the rows' variance against its eps", "variance")


def _variance_column(group: Sequence[NormPoint], x: float, bw: float, axis: _LogAxis) -> str:
    """A line from the smallest row variance (▼) to the median (●), and a dash at each eps (dotted: as rounded)."""
    low = min(n.min_variance for n in group)
    median = sorted(n.median_variance for n in group)[len(group) // 2]
    eps = sorted({n.eps for n in group if n.eps is not None})
    rounded = sorted({n.eps_rounded for n in group if n.eps_rounded is not None} - set(eps))
    state = ("bad" if any(n.zero_variance_rows or (n.eps is not None and n.median_variance < n.eps) for n in group)
             else "low" if any(n.rows_below_eps for n in group) else "ok")
    title = "\n\n".join(_norm_text(n) for n in group[:6]) + (f"\n… {len(group) - 6} more" if len(group) > 6 else "")
    r, half = min(4.0, max(bw * 0.3, 1.5)), max(min(4.0, max(bw * 0.3, 1.5)) * 2, 3)

    def dash(cls: str, e: float) -> str:
        return f'<line class="{cls}" x1="{x - half:.1f}" x2="{x + half:.1f}" y1="{axis.y(e):.1f}" y2="{axis.y(e):.1f}"/>'

    zero = (f'<text class="zero" x="{x + half + 2:.1f}" y="{axis.y(0) + 3:.1f}">0</text>'
            if 0.0 in rounded and bw >= 16 else "")
    return (f'<g class="norm-col {state}" data-node="{esc(group[0].node)}"><title>{esc(title)}</title>'
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{axis.y(median):.1f}" y2="{axis.y(low):.1f}"/>'
            f'<circle cx="{x:.1f}" cy="{axis.y(median):.1f}" r="{r:.1f}"/>'
            f'<path d="M{x - r:.1f},{axis.y(low) - r:.1f} h{2 * r:.1f} l{-r:.1f},{2 * r:.1f} z"/>'
            + "".join(dash("eps", e) for e in eps) + "".join(dash("eps-rounded", e) for e in rounded) + zero + "</g>")


def dtype_strip(nodes: Sequence[NodeDtype]) -> tuple[str, Buckets]:
    """One column per node (or per scope when aggregated), split by the dtypes its nodes compute in."""
    buckets = bucket_by_scope([n.scope for n in nodes])
    top, height = 8, 36
    bw = _PLOT_W / max(len(buckets.runs), 1)
    body = ['<g class="series" data-series="dtypes">']
    for i, run in enumerate(buckets.runs):
        group = [nodes[j] for j in run]
        counts = Counter(n.dtype for n in group)
        x, y = _LEFT + i * bw, float(top)
        if len(group) == 1:
            n = group[0]
            title = f"{n.node} ({n.op})" + (f" in {n.scope}" if n.scope else "") + \
                f"\n{FORMATS[n.dtype].long_name if n.dtype else 'no float'}: {n.reason}"
        else:
            label = buckets.labels[i] if buckets.labels else f"nodes {group[0].node} … {group[-1].node}"
            title = f"{label}: {len(group)} nodes\n" + "\n".join(
                f"{FORMATS[d].long_name if d else 'no float'}: {c}" for d, c in counts.most_common())
        parts = []
        for dtype, count in counts.most_common():
            h = height * count / len(group)
            parts.append(f'<rect x="{x:.2f}" y="{y:.2f}" width="{max(bw, 0.6):.2f}" height="{h:.2f}" '
                         f'fill="{DTYPE_COLORS.get(dtype, "#999")}"/>')
            y += h
        body.append(f'<g class="dtype-col" data-dtype="{esc(counts.most_common(1)[0][0] or "none")}">'
                    f'<title>{esc(title)}</title>{"".join(parts)}</g>')
    body.append("</g>")
    body += _scope_axis(nodes, buckets, top + height)
    return _svg(top + height + 28, body, "the dtype each node computes in", "dtypes"), buckets
