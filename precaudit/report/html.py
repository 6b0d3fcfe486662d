"""--format html: one self-contained page from an Outcome (inline CSS and SVG, one small script, nothing fetched).

Sections: the summary and settings; the findings, sortable and filterable by rule and severity; per model, for a
traced run the headroom chart and the norms' variance against their eps, and the dtype each node computes in.

Every string from a model, a path or a rule file is escaped twice over: escape.printable (one visible line, no
bidi override) and html.escape. The script holds no data: it sorts and filters the table's rows by their
attributes, and the page's Content-Security-Policy allows that script alone (by its hash) and no network.
"""

from __future__ import annotations

import base64
import hashlib
import math
from collections import Counter
from collections.abc import Sequence

from ..dtypes import FORMATS, Format, format_named
from ..escape import printable
from ..finding import SEVERITIES, Finding, severity_rank
from ..trace import TraceRun
from ..trace.profile import TraceProfile
from ..version import __version__
from .charts import DTYPE_COLORS, MAX_POINTS, dtype_strip, esc, headroom_chart, num, variance_chart
from .dtype_map import NodeDtype
from .folding import fold_names, fold_texts, shape_of
from .locations import shown
from .outcome import Outcome
from .text import summary_line

__all__ = ["render_html", "render_html_fragment"]

# (value key, label, as a percentage): the numbers a finding's row shows, where it has them
_NUMBERS = [("eps", "eps", False), ("eps_rounded", "in its dtype", False), ("absmax", "max |x|", False),
            ("min_nonzero", "min |x|", False), ("overflow_fraction", "overflow", True),
            ("underflow_fraction", "to 0", True), ("nonfinite_fraction", "inf/NaN", True),
            ("min_variance", "min var", False), ("median_variance", "median var", False),
            ("rows_below_eps_fraction", "rows < eps", True), ("input_max", "input max", False),
            ("zero_fraction", "zeros", True), ("input_rel_error", "rel. error", True),
            ("overflow_count", "values > max", False), ("reduction_length", "length", False)]
_MAX_CLASSES = 40  # rows of the dtype table


def render_html_fragment(outcome: Outcome) -> str:
    """The report as a notebook shows it (Report._repr_html_): one element, every style scoped to it, so it restyles
    nothing of the notebook around it; no script (a notebook may not run one), so no sorting or filtering."""
    page = _body(outcome)
    return f'<div class="{_SCOPE}"><style>{_scoped(_CSS)}</style>\n{page}\n</div>\n'


_SCOPE = "precaudit-report"


def _scoped(css: str) -> str:
    """Every rule of the page's CSS limited to the fragment's container (:root and body are the container)."""
    rules = []
    for block in css.split("}"):
        if "{" not in block:
            continue
        selectors, body = block.split("{", 1)
        scoped = []
        for written in selectors.split(","):
            selector = " ".join(written.split())
            if selector in (":root", "body"):
                scoped.append(f".{_SCOPE}")
            else:
                scoped.append(f".{_SCOPE} {selector}")
        rules.append(f"{','.join(scoped)}{{{body}}}")
    return "\n".join(rules)


def render_html(outcome: Outcome) -> str:
    models = ", ".join(outcome.result.models) or "no model"
    page = _body(outcome)
    digest = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
    policy = f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-{digest}'"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{policy}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>precaudit: {esc(models)}</title><style>{_CSS}</style></head>\n<body>\n{page}\n"
            f"<script>{_SCRIPT}</script>\n</body></html>\n")


def _body(outcome: Outcome) -> str:
    fmt = format_named(outcome.settings["dtype"])
    result = outcome.result
    # the charts first: they are the one glance; then each finding; then the dtype each node computes in
    body = [_header(outcome, fmt), _summary(outcome)]
    body += [_traced_section(i, model, outcome, fmt) for i, model in enumerate(result.models)
             if _profile(outcome, model) is not None]
    body += [_gradient_section(i, model, outcome) for i, model in enumerate(result.models)
             if model in result.gradients]
    body.append(_findings(outcome))
    body += [_dtype_section(i, model, outcome, fmt) for i, model in enumerate(result.models)
             if outcome.result.dtype_maps.get(model)]
    return "\n".join(body)


def _header(outcome: Outcome, fmt: Format) -> str:
    counts = Counter(f.severity for f in outcome.result.findings)
    cards = "".join(f'<div class="card {s}"><b>{counts[s]}</b> {s}{"s" * (counts[s] != 1 and s != "info")}</div>'
                    for s in SEVERITIES)
    traced = " · traced" if outcome.result.traces else ""
    return (f'<header><h1>precaudit report</h1><p class="sub">{len(outcome.result.models)} model'
            f'{"s" * (len(outcome.result.models) != 1)} against <b>{esc(fmt.long_name)}</b>{traced} · exit code '
            f'{outcome.exit_code} · precaudit {esc(__version__)}</p>{_provenance(outcome)}'
            f'<div class="cards">{cards}</div><nav><a href="#summary">Summary</a>'
            + "".join(f' <a href="#trace-{i}">Headroom: {esc(_short(m))}</a>' for i, m in enumerate(outcome.result.models)
                      if _profile(outcome, m) is not None)
            + "".join(f' <a href="#gradients-{i}">Gradients: {esc(_short(m))}</a>'
                      for i, m in enumerate(outcome.result.models) if m in outcome.result.gradients)
            + ' <a href="#findings">Findings</a>'
            + "".join(f' <a href="#dtypes-{i}">Dtypes: {esc(_short(m))}</a>' for i, m in enumerate(outcome.result.models)
                      if outcome.result.dtype_maps.get(m))
            + "</nav></header>")


def _provenance(outcome: Outcome) -> str:
    """At the top: what every traced number rests on, the user's inputs or synthesized ones."""
    synthesized = [m for m, run in outcome.result.traces.items() if run.synthesized]
    if not synthesized:
        return ('<p class="inputs user">Traced on your inputs (--inputs).</p>' if outcome.result.traces else "")
    names = ", ".join(esc(_short(m)) for m in synthesized)
    return (f'<p class="inputs synthesized"><b>Traced on synthesized inputs, not your data</b> ({names}): the traced '
            "findings hold for random inputs only, with no silence, padding or real ranges. Give yours with "
            "--inputs FILE.npz.</p>")


def _short(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def _summary(outcome: Outcome) -> str:
    s = outcome.settings
    rows = [("models", "<br>".join(esc(m) for m in outcome.result.models) or "–"),
            ("dtype", esc(s["dtype"])), ("fail on", esc(s["fail_on"])),
            ("keep fp32", esc(", ".join(s["keep_fp32"])) or "–"), ("select", esc(", ".join(s["select"])) or "all"),
            ("ignore", esc(", ".join(s["ignore"])) or "–"), ("preview rules", "yes" if s["preview"] else "no"),
            ("rule files", esc(", ".join(s["rules"])) or "built-in"), ("baseline", esc(s["baseline"] or "–")),
            ("weights checked", "yes" if s["check_weights"] else "no"), ("config", esc(s["config_file"] or "–"))]
    notes = [esc(summary_line(outcome.result))]
    notes += [f"Traced {esc(model)}: {esc(run.describe())}." for model, run in outcome.result.traces.items()]
    if outcome.ignored:
        notes.append(f"{outcome.ignored} finding{'s' * (outcome.ignored != 1)} hidden by per-model or per-node ignores.")
    if outcome.baseline is not None:
        notes.append(f"{outcome.baseline.matched} already in the baseline {esc(outcome.baseline.file)}; "
                     f"{len(outcome.baseline.stale)} stale baseline entries.")
    notes += [f'<span class="error-text">could not audit: {esc(str(e))}</span>' for e in outcome.result.errors]
    grid = "".join(f"<div><dt>{k}</dt><dd>{v}</dd></div>" for k, v in rows)
    return (f'<section id="summary"><h2>Summary</h2>{"".join(f"<p>{n}</p>" for n in notes)}'
            f'<dl class="settings">{grid}</dl></section>')


def _findings(outcome: Outcome) -> str:
    # worst first; within a severity, in the order the audit found them
    findings = sorted((shown(f) for f in outcome.result.findings), key=lambda f: -severity_rank(f.severity))
    if not findings:
        return '<section id="findings"><h2>Findings</h2><p>No findings.</p></section>'
    several = len(outcome.result.models) > 1
    rules = Counter((f.rule_id, f.rule_name) for f in findings)
    rule_options = "".join(f'<option value="{esc(rid)}">{esc(rid)} {esc(name)} ({n})</option>'
                           for (rid, name), n in sorted(rules.items()))
    sev_options = "".join(f'<option value="{s}">{s}</option>' for s in SEVERITIES
                          if any(f.severity == s for f in findings))
    head = "".join(f'<th data-key="{k}" data-type="{t}">{label}</th>' for k, t, label in
                   [("order", "num", "#"), ("sev", "num", "severity"), ("rule", "text", "rule"),
                    *([("model", "text", "model")] if several else []), ("node", "text", "node"),
                    ("where", "text", "scope / source"), ("dtype", "text", "dtype")]) + \
        "<th>numbers</th><th>message and fix</th>"
    rows = "\n".join(_finding_row(i, f, several) for i, f in enumerate(findings))
    return (f'<section id="findings"><h2>Findings</h2><div class="filters">'
            f'<label>rule <select id="f-rule"><option value="">all rules</option>{rule_options}</select></label>'
            f'<label>severity <select id="f-sev"><option value="">all</option>{sev_options}</select></label>'
            f'<label>node or scope <input id="f-text" type="search" placeholder="filter"></label>'
            f'<span class="count"><span id="f-count">{len(findings)}</span> of {len(findings)} shown</span>'
            f'</div><div class="scroll"><table id="findings-table" class="findings"><thead><tr>{head}</tr></thead>'
            f'<tbody>\n{rows}\n</tbody></table></div><p class="note">Click a column heading to sort.</p></section>')


def _finding_row(i: int, f: Finding, several: bool) -> str:
    where = f.scope or ""
    if f.source_file:
        where = f"{f.source_file}:{f.source_line}" + (f" · {where}" if where else "")
    dtype = f.values.get("compute_dtype") or ""
    numbers = "".join(f"<span><i>{label}</i> {_value(f.values[key], pct)}</span>"
                      for key, label, pct in _NUMBERS if isinstance(f.values.get(key), (int, float))
                      and not isinstance(f.values.get(key), bool))
    model = f'<td class="model">{esc(_short(f.model))}</td>' if several else ""
    attrs = (f'data-order="{i}" data-sev="{severity_rank(f.severity)}" data-severity="{f.severity}" '
             f'data-rule="{esc(f.rule_id)}" data-model="{esc(f.model)}" data-node="{esc(f.node_name)}" '
             f'data-where="{esc(where)}" data-dtype="{esc(dtype)}"')
    return (f'<tr {attrs}><td>{i + 1}</td><td><span class="sev {f.severity}">{f.severity}</span></td>'
            f'<td><b>{esc(f.rule_id)}</b><br><small>{esc(f.rule_name)}</small></td>{model}'
            f'<td><code>{esc(f.node_name)}</code><br><small>{esc(f.op_type)}</small></td>'
            f'<td class="where">{esc(where) or "–"}</td><td>{esc(dtype) or "–"}</td>'
            f'<td class="numbers">{numbers or "–"}</td>'
            f'<td class="msg">{esc(f.message)}<div class="fix"><b>fix:</b> {esc(f.fix)}</div>'
            + (f'<div class="why"><b>why {esc(dtype)}:</b> {esc(f.values["compute_reason"])}</div>'
               if f.values.get("compute_reason") else "") + "</td></tr>")


def _value(v: float, pct: bool) -> str:
    return f"{v:.2%}" if pct else esc(num(v))


def _profile(outcome: Outcome, model: str):
    run = outcome.result.traces.get(model)
    return run.profile if run is not None else None


def _traced_section(i: int, model: str, outcome: Outcome, fmt: Format) -> str:
    run = outcome.result.traces[model]
    findings = [shown(f) for f in outcome.result.findings if f.model == model]
    assert run.profile is not None  # a traced section is made only for a run with a profile
    parts = [f'<section id="trace-{i}" class="model"><h2>Headroom: {esc(model)}</h2>', _headroom(run, fmt, findings)]
    if run.profile.norms:
        parts.append(_norms(run, fmt))
    return "\n".join([*parts, "</section>"])


def _gradient_section(i: int, model: str, outcome: Outcome) -> str:
    """precaudit train --trace: each parameter's float32 gradient at the loss scale the regime's backward ran at,
    against the low dtype's limits, with the loss-scale window's two ends drawn as levels."""
    g = outcome.result.gradients[model]
    fmt = FORMATS[g.low]
    findings = [shown(f) for f in outcome.result.findings if f.model == model]
    smallest, largest = g.window
    lines = []
    if smallest is not None:
        # at the window's smallest scale a gradient survives when g * smallest > half the smallest subnormal:
        # on this chart's axis (g * scale) that level is shifted by scale / smallest
        lines.append(("window-bottom", fmt.smallest_subnormal * g.scale / smallest,
                      f"lowest kept at scale 2^{math.log2(smallest):.0f}"))
    if g.backward_max > 0 and math.isfinite(g.backward_max):
        lines.append(("backward-max", g.backward_max * g.scale, "backward's largest |x| at this scale"))
    lost = sum(1 for p in g.points if p.underflow)
    facts = [f"{len(g.points)} parameters' gradients from the float32 step on {esc(g.inputs_from)}, at loss scale "
             f"{_scale(g.scale)} as the {esc(g.regime)} backward holds them in {esc(fmt.long_name)}",
             f"{lost} lose elements to 0 at it"]
    if g.low == "fp16":
        top = (f"{_scale(largest)} (the largest before the backward overflows)" if largest is not None else
               "no top measured (the unscaled backward held no nonzero float16 value)")
        window = (f"the loss-scale window runs from {_scale(smallest)} (keeps 99.9% of the nonzero elements) to "
                  f"{top}")
        if g.scaler_init is not None:
            window += f"; GradScaler starts at {_scale(g.scaler_init)}"
        facts.append(window)
    chart, _ = headroom_chart(TraceProfile(values=g.points), fmt, findings, lines, "each parameter's gradient")
    legend = _legend([("band held", f"gradient held in {fmt.long_name}"),
                      ("band under", "some of its elements round to 0 at the scale"),
                      ("marker error", "finding (error)"), ("marker warning", "finding (warning)")])
    return (f'<section id="gradients-{i}" class="model"><h2>Gradients: {esc(model)}</h2>'
            f'<p>{"; ".join(facts)}.</p><p class="note">x: the parameters in the model\'s order; y: |gradient| × '
            f"the loss scale on a log<sub>2</sub> scale, each band from a parameter's smallest nonzero element to its "
            f"largest. Below half the smallest subnormal an element becomes 0; the dashed levels are the window's: "
            f"elements under the lowest-kept level are lost even at its smallest scale, and the backward's largest "
            f"value must stay under the max.</p>{legend}<div class=\"chart-box\">{chart}</div></section>")


def _scale(s: float | None) -> str:
    if s is None:
        return "–"
    e = math.log2(s) if s > 0 else math.nan
    return f"2^{e:.0f}" if e == round(e) else num(s)


def _dtype_section(i: int, model: str, outcome: Outcome, fmt: Format) -> str:
    return (f'<section id="dtypes-{i}" class="model"><h2>Compute dtypes: {esc(model)}</h2>'
            f"{_dtypes(outcome.result.dtype_maps[model], fmt)}</section>")


def _headroom(run: TraceRun, fmt: Format, findings: Sequence[Finding]) -> str:
    profile = run.profile
    assert profile is not None  # drawn only for a run with a profile (_traced_section)
    values = profile.values
    chart, buckets = headroom_chart(profile, fmt, findings)
    over = sum(1 for p in values if p.overflow)
    under = sum(1 for p in values if p.underflow)
    facts = [f"{len(values):,} float values measured over {run.samples} sample{'s' * (run.samples != 1)}",
             f"{over} reach beyond the {esc(fmt.long_name)} max", f"{under} have elements that round to 0"]
    held = [p for p in values if p.dtype == fmt.name and p.absmax > 0]
    if held:  # the headroom itself: how far the largest value held in the format stays under its max
        top = max(held, key=lambda p: p.absmax)
        facts.append(f"the largest |x| held in {esc(fmt.long_name)} is {num(top.absmax)} at <code>{esc(top.node)}</code>"
                     + (f", 2<sup>{math.log2(fmt.max / top.absmax):.1f}</sup> below the max" if top.absmax < fmt.max
                        else ""))
    if profile.first_nonfinite is not None:
        facts.append(f'the run first turns inf/NaN on a path to an output at <code>{esc(profile.first_nonfinite)}</code>')
    note = (f"<p class=\"note aggregated\">{len(values):,} values are more than the chart has pixels (over "
            f"{MAX_POINTS:,}): they are drawn as {len(buckets.runs):,} marks, aggregated {esc(buckets.how)}. "
            "Each mark spans the smallest nonzero |x| to the largest |x| of all its values; hover for the "
            "scope.</p>") if buckets.how else ""
    legend = _legend([("band held", f"held in {fmt.long_name}"), ("band wide", "held in a wider dtype (float32 island, "
                      "--keep-fp32)"), ("band under", "some elements round to 0"),
                      ("band over", "overflows (or inf/NaN in the emulated run)"), ("marker error", "finding (error)"),
                      ("marker warning", "finding (warning)"), ("norm", "norm"), ("nonfinite", "first inf/NaN")])
    return (f'<p>{"; ".join(facts)}.</p>'
            f'<p class="note">x: the values in graph order; y: |x| on a log<sub>2</sub> scale. Each band spans one '
            f'value\'s smallest nonzero |x| to its largest |x| in the float reference run. Dashed lines: the '
            f'{esc(fmt.long_name)} max, smallest normal and smallest subnormal; above the max a value becomes inf, '
            f'below half the smallest subnormal it becomes 0. Hover a band, a triangle or a diamond for its node.</p>'
            f"{note}{legend}<div class=\"chart-box\">{chart}</div>")


def _norms(run: TraceRun, fmt: Format) -> str:
    assert run.profile is not None  # drawn only for a run with a profile (_traced_section)
    norms = run.profile.norms
    rows = "".join(
        f'<tr class="{"bad" if n.zero_variance_rows or (n.eps is not None and n.median_variance < n.eps) else ""}">'
        f"<td><code>{esc(n.node)}</code><br><small>{esc(n.op)}</small></td><td>{esc(n.scope or '–')}</td>"
        f"<td>{esc(n.compute_dtype)}</td><td>{num(n.eps)}</td><td>{num(n.eps_rounded)}</td><td>{n.rows}</td>"
        f"<td>{num(n.min_variance)}</td><td>{num(n.median_variance)}</td><td>{n.rows_below_eps}</td>"
        f"<td>{n.zero_variance_rows}</td></tr>" for n in norms)
    table = (f'<table class="norms"><thead><tr><th>norm</th><th>scope</th><th>dtype</th><th>eps</th>'
             f'<th>eps in dtype</th><th>rows</th><th>min variance</th><th>median variance</th><th>rows below eps</th>'
             f'<th>rows with variance 0.0</th></tr></thead><tbody>{rows}</tbody></table>')
    legend = _legend([("norm-col ok", "median and smallest row variance (● ▼)"), ("eps", "eps as written"),
                      ("eps-rounded", "eps in its dtype, where it differs (0: rounded away)"),
                      ("norm-col low", "some rows below eps"), ("norm-col bad", "median below eps, or rows of 0.0")])
    return (f"<h3>Norms: rows' variance against eps</h3><p class=\"note\">Per norm (in graph order), the variance "
            f"(mean square for RMSNorm) of each row it normalized: from the smallest (▼) to the median (●), against "
            f"its eps. Where the variance sinks under the eps, the eps, not the data, sets the row's scale.</p>"
            f"{legend}<div class=\"chart-box\">{variance_chart(norms, fmt)}</div>"
            f"<details{' open' if len(norms) <= 12 else ''}><summary>{len(norms)} norms</summary>"
            f'<div class="scroll">{table}</div></details>')


def _dtypes(nodes: Sequence[NodeDtype], fmt: Format) -> str:
    strip, buckets = dtype_strip(nodes)
    totals = Counter(n.dtype for n in nodes)
    names = [f"{c:,} in {FORMATS[d].long_name}" if d else f"{c:,} read no float" for d, c in totals.most_common()]
    note = (f'<p class="note aggregated">{len(nodes):,} nodes are drawn as {len(buckets.runs):,} columns, aggregated '
            f'{esc(buckets.how)}; each column is split by the dtypes of its nodes.</p>') if buckets.how else ""
    legend = "".join(f'<span class="key"><span class="swatch" style="background:{DTYPE_COLORS.get(d, "#999")}">'
                     f'</span>{esc(FORMATS[d].long_name) if d else "no float input"}</span>' for d in totals)
    classes = _dtype_classes(nodes)
    rows = "".join(f"<tr><td>{esc(FORMATS[d].long_name) if d else '–'}</td><td>{esc(reason)}</td><td>{count:,}</td>"
                   f"<td>{esc(ops)}</td><td>{esc(where)}</td></tr>"
                   for d, reason, count, ops, where in classes[:_MAX_CLASSES])
    more = (f"<p class=\"note\">… and {len(classes) - _MAX_CLASSES} more reasons.</p>"
            if len(classes) > _MAX_CLASSES else "")
    return (f"<p>{len(nodes):,} nodes: {', '.join(names)}. Which dtype each node computes in "
            f"when the model runs in {esc(fmt.long_name)}, and why.</p>{note}<div class=\"legend\">{legend}</div>"
            f'<div class="chart-box">{strip}</div><div class="scroll"><table class="dtypes"><thead><tr><th>dtype</th>'
            f"<th>why</th><th>nodes</th><th>ops</th><th>where</th></tr></thead><tbody>{rows}</tbody></table></div>{more}")


def _dtype_classes(nodes: Sequence[NodeDtype]) -> list[tuple[str | None, str, int, str, str]]:
    """Nodes by dtype and reason, the reasons that differ only in a name's indices folded into one."""
    groups: dict[tuple, list[NodeDtype]] = {}
    shapes: dict[str, tuple] = {}  # most nodes share a reason: shape each once
    for n in nodes:
        shape = shapes.get(n.reason)
        if shape is None:
            shape = shapes[n.reason] = shape_of(printable(n.reason), quantities=False)
        groups.setdefault((n.dtype, shape), []).append(n)
    out = []
    for (dtype, _), members in groups.items():
        reasons = list(dict.fromkeys(printable(m.reason) for m in members))
        ops = ", ".join(f"{op} {c}" if c > 1 else op for op, c in Counter(m.op for m in members).most_common(6))
        scopes = fold_names((printable(m.scope) for m in members if m.scope), limit=3)
        out.append((dtype, fold_texts(reasons), len(members), ops, ", ".join(scopes) or "–"))
    return sorted(out, key=lambda row: (row[0] is None, -row[2]))


def _legend(keys: list[tuple[str, str]]) -> str:
    return '<div class="legend">' + "".join(f'<span class="key"><svg width="14" height="12"><rect class="{cls}" '
                                            f'x="1" y="1" width="12" height="10"/></svg>{esc(label)}</span>'
                                            for cls, label in keys) + "</div>"


_CSS = """
:root{--err:#c62828;--warn:#e08a00;--info:#1f78b4;--ink:#1d2330;--mute:#5d6675;--line:#dde1e7}
*{box-sizing:border-box}body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--ink);
margin:0 auto;max-width:1400px;padding:16px 24px;background:#fff}
h1{font-size:22px;margin:0}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid var(--line);padding-bottom:4px;
word-break:break-all}h3{font-size:15px;margin:22px 0 6px}
header .sub{color:var(--mute);margin:2px 0 10px}.inputs.synthesized{border-left:4px solid var(--warn);padding:4px 8px}nav a{margin-right:12px;color:var(--info)}
.cards{display:flex;gap:10px;margin:8px 0}.card{border:1px solid var(--line);border-radius:6px;padding:6px 14px;
min-width:110px}.card b{font-size:20px;margin-right:4px}.card.error b{color:var(--err)}.card.warning b{color:var(--warn)}
.card.info b{color:var(--info)}
table{border-collapse:collapse;width:100%}th,td{text-align:left;vertical-align:top;padding:4px 8px;
border-bottom:1px solid var(--line)}th{background:#f5f7fa;font-weight:600;white-space:nowrap}
dl.settings{display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:2px 18px;margin:6px 0}
dl.settings div{display:flex;gap:8px;border-bottom:1px solid var(--line);padding:2px 0}dl.settings dt{font-weight:600;
min-width:120px;color:var(--mute)}dl.settings dd{margin:0;overflow-wrap:anywhere}
table.findings th[data-key]{cursor:pointer}table.findings th[data-key]:hover{background:#e8edf4}
table.findings td{font-size:13px}table.findings small{white-space:nowrap}code{font-size:12px;word-break:break-all}
.sev{font-weight:600;padding:1px 6px;border-radius:3px;color:#fff}.sev.error{background:var(--err)}
.sev.warning{background:var(--warn)}.sev.info{background:var(--info)}
.numbers span{display:block;white-space:nowrap}.numbers i{color:var(--mute);font-style:normal}
.msg{min-width:420px}.fix,.why{color:var(--mute);margin-top:2px;font-size:12px}.where{word-break:break-all;max-width:220px}
.filters{display:flex;gap:16px;align-items:center;margin:6px 0 8px}.filters .count{color:var(--mute)}
.scroll{max-height:80vh;overflow:auto;border:1px solid var(--line)}.note{color:var(--mute);margin:4px 0}
.aggregated{color:#8a5a00}.error-text{color:var(--err)}
.legend{display:flex;flex-wrap:wrap;gap:14px;margin:6px 0;color:var(--mute);font-size:12px}
.key{display:inline-flex;align-items:center;gap:5px}.swatch{display:inline-block;width:12px;height:10px}
.chart-box{border:1px solid var(--line);border-radius:4px;padding:4px}svg.chart{width:100%;height:auto;display:block}
svg text{font:11px system-ui,sans-serif;fill:var(--mute)}
.zone.over{fill:#fbe3e3}.zone.subnormal{fill:#fff4d1}.zone.zero{fill:#ececec}.frame{fill:none;stroke:#b8bec8}
.grid{stroke:#e9ecf0}.limit line{stroke:#6b2d2d;stroke-dasharray:6 4;stroke-width:1.2}.limit text{fill:#6b2d2d}
.band{fill:#4e79a7}.band.held{fill:#4e79a7}.band.wide{fill:#59a14f}.band.under{fill:#f28e2b}.band.over{fill:#d62728}
.band:hover{fill:#111}.marker.error{fill:var(--err)}.marker.warning{fill:var(--warn)}.marker.info{fill:var(--info)}
.norm{fill:#7b4fa0}.norm.below-eps{fill:var(--err)}.nonfinite{fill:rgba(214,39,40,.16);stroke:#d62728}
.nonfinite-label{fill:#b71c1c;font-weight:600}.sep{stroke:#c5cad3}.scope{fill:var(--mute)}
.norm-col line{stroke:#2a9d8f;stroke-width:2}.norm-col circle,.norm-col path{fill:#2a9d8f}
.norm-col.low line{stroke:var(--warn)}.norm-col.low circle,.norm-col.low path{fill:var(--warn)}
.norm-col.bad line{stroke:var(--err)}.norm-col.bad circle,.norm-col.bad path{fill:var(--err)}
.norm-col .eps,.eps{stroke:#111;stroke-width:2;fill:#111}.norm-col .eps-rounded,.eps-rounded{stroke:#111;
stroke-width:1;stroke-dasharray:2 2;fill:#888}.norm-col.ok{fill:#2a9d8f}.norm-col.low{fill:var(--warn)}
.norm-col.bad{fill:var(--err)}
table.norms tr.bad td{background:#fdeeee}svg text.zero{fill:var(--err);font-weight:600}
"""

_SCRIPT = """(function(){
var t=document.getElementById('findings-table');if(!t)return;
var body=t.tBodies[0],rows=Array.prototype.slice.call(body.rows);
var rule=document.getElementById('f-rule'),sev=document.getElementById('f-sev'),q=document.getElementById('f-text');
function apply(){var n=0,text=q.value.toLowerCase();rows.forEach(function(r){
var ok=(!rule.value||r.dataset.rule===rule.value)&&(!sev.value||r.dataset.severity===sev.value)&&
(!text||(r.dataset.node+' '+r.dataset.where).toLowerCase().indexOf(text)>=0);r.hidden=!ok;if(ok)n++;});
document.getElementById('f-count').textContent=n;}
[rule,sev,q].forEach(function(e){e.addEventListener('input',apply);});
Array.prototype.forEach.call(t.tHead.querySelectorAll('th[data-key]'),function(th){th.addEventListener('click',function(){
var key=th.dataset.key,num=th.dataset.type==='num',dir=th.dataset.dir==='asc'?'desc':'asc';th.dataset.dir=dir;
rows.sort(function(a,b){var x=a.dataset[key],y=b.dataset[key],c=num?x-y:x.localeCompare(y);return dir==='asc'?c:-c;});
rows.forEach(function(r){body.appendChild(r);});});});
})();"""
