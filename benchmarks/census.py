"""The precision census page (docs/census.md): render it from the sweep's rows, read its data back, compare two runs.

The page is generated, never edited: its table and its summary are rendered from the rows the sweep measured, and
those rows (with the versions they were measured with) are embedded at the end of the page as JSON in an HTML
comment, so `--census-check` and tests/test_census.py can re-render the page from the page itself. Pure Python:
importing this module needs neither torch nor onnx.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import Counter, defaultdict

__all__ = [
    "CONVERTERS",
    "DATA_END",
    "DATA_START",
    "FAMILIES",
    "FAMILY_OF",
    "RUNTIMES",
    "STATIC_DTYPES",
    "data_of",
    "differences",
    "escape_cell",
    "read_data",
    "render",
    "renders_itself",
    "verdict_of_converter",
]

STATIC_DTYPES = ("fp16", "bf16", "fp8-e4m3")
CONVERTERS = ("onnxconverter-common", "modelopt", "onnxruntime")
# --runtime columns: the major runtimes (coreml audits the PyTorch module: coremltools converts modules, not ONNX)
RUNTIMES = ("ort-cpu", "ort-cuda", "tensorrt", "openvino-cpu", "coreml")
# Which kind of model each architecture is, for the census summary (the position encoding and the norm decide which
# rules can fire: RoPE's cos/sin, RMSNorm's mean of squares, a CNN's BatchNorm folded into its Conv).
FAMILIES = {
    "text encoder, LayerNorm (BERT-like)": ["BertModel", "DistilBertModel", "RobertaModel", "DebertaV2Model",
                                            "ElectraModel", "MPNetModel", "AlbertModel", "XLMRobertaModel"],
    "text decoder, learned or ALiBi positions": ["GPT2Model", "OPTModel", "BloomModel"],
    "RoPE text, LayerNorm": ["ModernBertModel", "GPTNeoXModel", "FalconModel", "PhiModel", "StableLmModel",
                             "CohereModel", "OlmoModel"],
    "RoPE text, RMSNorm": ["LlamaModel", "MistralModel", "Qwen2Model", "Qwen3Model", "Phi3Model", "GemmaModel",
                           "Gemma2Model", "GraniteModel"],
    "T5 encoder (RMSNorm, relative bias)": ["T5EncoderModel", "MT5EncoderModel"],
    "vision transformer": ["ViTModel", "DeiTModel", "BeitModel", "Dinov2Model", "CLIPVisionModel", "SwinModel",
                           "LevitModel", "SegformerModel", "MobileViTModel"],
    "vision CNN": ["ConvNextModel", "ConvNextV2Model", "ResNetModel", "MobileNetV2Model", "PoolFormerModel",
                   "RegNetModel", "EfficientNetModel"],
    "audio encoder": ["Wav2Vec2Model", "HubertModel", "WhisperEncoder"],
}
FAMILY_OF = {name: family for family, names in FAMILIES.items() for name in names}
DATA_START = "<!-- census-data"
DATA_END = "census-data -->"
VERSION_ORDER = ("python", "torch", "transformers", "onnx", "onnxscript", "onnxruntime", "onnxconverter-common",
                 "precaudit")
# Only this line changes between two runs of the same code on the same versions: a check ignores it.
TIMING_PREFIX = "Run: "


# ---- escaping: every string a model or an exception supplies goes through here before it reaches the table ----

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def escape_cell(text: object) -> str:
    """One table cell's text, inert in Markdown and HTML: a pipe would end the cell, a backtick open code, a `<` a
    tag, a newline the row; `&` first so the entities written here stay as written."""
    text = _ANSI.sub("", str(text)).replace("&", "&amp;")  # exporters colour their messages
    text = re.sub(r"\s*[\r\n]+\s*", " ", text)
    text = _CONTROL.sub("?", text)
    text = text.replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_\[\]|#])", r"\\\1", text)


def _json_for_comment(data: dict) -> str:
    """The data as JSON that cannot end the HTML comment it sits in (`--` never appears: `-` is written \\u002d
    only inside strings, where JSON allows it)."""
    text = json.dumps(data, indent=1, sort_keys=True, ensure_ascii=True)
    return text.replace("--", "-\\u002d").replace("<", "\\u003c").replace(">", "\\u003e")


# ---- cells ----------------------------------------------------------------------------------------------------


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{rule}×{n}" if n > 1 else rule for rule, n in sorted(counts.items())) or "—"


def audit_cell(value: dict | None) -> str:
    """An audit's cell: the rules and how often each fired, '—' for none; or why there is no audit."""
    if value is None:
        return "not run"
    if "failed" in value:
        return "FAILED: " + escape_cell(value["failed"])
    if "error" in value:
        return "error: " + escape_cell(value["error"])
    return escape_cell(_counts(value["counts"]))


def verdict_of_converter(plain: dict | None, converted: dict | None) -> str | None:
    """'breaks' when the converter's audit flags a (rule, node) the plain fp16 audit does not, or any finding of
    severity error; 'keeps' otherwise; None where either audit did not run."""
    if not plain or not converted or "sites" not in plain or "sites" not in converted:
        return None
    plain_sites = {tuple(s) for s in plain["sites"]}
    new = [s for s in converted["sites"] if tuple(s) not in plain_sites]
    return "breaks" if new or converted.get("errors", 0) else "keeps"


def _new_rules(plain: dict, converted: dict) -> list[str]:
    plain_sites = {tuple(s) for s in plain["sites"]}
    return sorted({s[0] for s in converted["sites"] if tuple(s) not in plain_sites})


def converter_cells(row: dict) -> tuple[str, str]:
    """(the converters whose default conversion breaks the model, with the rules that appear; those that keep it)."""
    breaks, keeps = [], []
    for name in CONVERTERS:
        converted = row.get("converters", {}).get(name)
        verdict = verdict_of_converter(row.get("fp16"), converted)
        if verdict is None:
            reason = audit_cell(converted) if converted and "counts" not in converted else "not run"
            breaks.append(f"{name}: {reason}")
        elif verdict == "breaks":
            why = _new_rules(row["fp16"], converted)
            errors = converted.get("errors", 0)
            detail = ", ".join(why + ([f"{errors} error(s)"] if errors else []))
            breaks.append(f"{name} ({escape_cell(detail)})")
        else:
            keeps.append(name)
    return "; ".join(breaks) or "—", ", ".join(keeps) or "—"


def keep_list_cell(value: dict | None) -> str:
    """'kept / blocking its op types' (node counts), the op types and the rules the list is for; or why none."""
    if value is None:
        return "not run"
    if "failed" in value or "error" in value:
        return audit_cell(value)
    if not value["kept"]:
        return "0"
    types = ", ".join(f"{t} {n}" for t, n in sorted(value["op_types"].items()))
    rules = ", ".join(value.get("rules", []))
    return f"{value['kept']} / {value['blocked']} ({escape_cell(types)}) for {escape_cell(rules or 'no rule')}"


def _fix_had_work(value: dict) -> bool:
    """Whether fix found anything to repair (a repair written or withheld, or a finding it leaves to a keep-list):
    it repairs info findings too (a mask fill, PA209), so the findings' severities do not say."""
    return bool(value["written"] or value["repairs"] or value["withheld"] or value["left"])


def fix_cell(value: dict | None) -> str:
    """What `fix` did (repairs written, withheld beyond its float32 gate, findings it leaves to a keep-list), its
    exit code, and whether the model it wrote re-audits clean at fp16."""
    if value is None:
        return "not run"
    if "failed" in value or "error" in value:
        return audit_cell(value)
    if not _fix_had_work(value):
        return f"nothing to repair (exit {value['exit']})"
    done = f"{value['repairs']} written, {value['withheld']} withheld, {value['left']} left (exit {value['exit']})"
    if not value["written"]:
        return f"{done}: no model written"
    after = value["after"]
    if "counts" not in after:
        return f"{done}: re-audit {audit_cell(after)}"
    verdict = "clean" if value["clean"] else f"not clean: {escape_cell(_counts(after['counts']))}"
    return f"{done}: {verdict}"


# ---- the page -------------------------------------------------------------------------------------------------

_HEADER = ("| architecture | family | exporter | fp16 | bf16 | fp8-e4m3 | traced fp16 | converter breaks it | "
           "converter keeps it | keep-list: kept / op-block | fix | " + " | ".join(RUNTIMES) + " |")


def runtime_cell(value: dict | None) -> str:
    """A runtime's verdict on the model at fp16: its error and warning counts, 'ok' for none; or why not audited."""
    if value is None or "counts" not in value:
        return audit_cell(value)
    errors, warnings = value["errors"], value.get("warnings", 0)
    if not errors and not warnings:
        return "ok"
    parts = [f"{n} {word}{'s' * (n != 1)}" for n, word in ((errors, "error"), (warnings, "warning")) if n]
    return ", ".join(parts)


def table(rows: list[dict]) -> list[str]:
    lines = [_HEADER, "|" + "---|" * _HEADER.count(" | ") + "---|"]
    for row in rows:
        first = [escape_cell(row["architecture"]), escape_cell(row["family"]), escape_cell(row["exporter"])]
        if "not_exported" in row:
            cells = first + ["not exported: " + escape_cell(row["not_exported"])] + [""] * (7 + len(RUNTIMES))
        else:
            breaks, keeps = converter_cells(row)
            cells = first + [audit_cell(row.get(d)) for d in STATIC_DTYPES] + [audit_cell(row.get("trace")),
                                                                                breaks, keeps,
                                                                                keep_list_cell(row.get("keep_list")),
                                                                                fix_cell(row.get("fix"))]
            cells += [runtime_cell(row.get("runtimes", {}).get(r)) for r in RUNTIMES]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _audited(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "not_exported" not in r]


def _by_family(rows: list[dict]) -> dict[str, list[dict]]:
    families: dict[str, list[dict]] = defaultdict(list)
    for row in _audited(rows):
        families[row["family"]].append(row)
    return dict(sorted(families.items()))


def _fired(rows: list[dict], mode: str) -> Counter:
    """How many of rows fire each rule in mode."""
    seen: Counter = Counter()
    for row in rows:
        value = row.get(mode) or {}
        seen.update(value.get("counts", {}).keys())
    return seen


def _rule_list(fired: Counter, total: int) -> str:
    return ", ".join(f"{rule} {n}/{total}" for rule, n in sorted(fired.items(), key=lambda kv: (-kv[1], kv[0]))) \
        or "none"


def _families_firing(rows: list[dict], mode: str, rule: str) -> str:
    parts = []
    for family, members in _by_family(rows).items():
        n = sum(1 for r in members if rule in (r.get(mode) or {}).get("counts", {}))
        if n:
            parts.append(f"{escape_cell(family)} {n}/{len(members)}")
    return "; ".join(parts)


def rule_ref(rule: str, rules: dict) -> str:
    """A rule id linked to its page (docs/rules/PAnnn-name.md), with its name and severity, where the run recorded
    them."""
    known = rules.get(rule)
    if not known:
        return f"**{escape_cell(rule)}**"
    name = escape_cell(known["name"])
    return f"**[{escape_cell(rule)}](rules/{rule}-{known['name']}.md) {name}** ({escape_cell(known['severity'])})"


def headline(rows: list[dict], rules: dict) -> list[str]:
    """Each rule that fires anywhere, per dtype: on how many exports, and in which families."""
    audited = _audited(rows)
    lines = []
    for mode in (*STATIC_DTYPES, "trace"):
        label = "traced fp16" if mode == "trace" else mode
        fired = _fired(audited, mode)
        if not fired:
            lines.append(f"- {label}: no rule fires on any export")
        for rule, n in sorted(fired.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"- {label}: {rule_ref(rule, rules)} on {n} of {len(audited)} exports: "
                         f"{_families_firing(audited, mode, rule)}")
    return lines


def in_short(rows: list[dict]) -> list[str]:
    """One line per family: the keep-list it needs and the rules behind it, and the converters that break it."""
    lines = []
    for family, members in _by_family(rows).items():
        lists = [r["keep_list"] for r in members if r.get("keep_list") and "kept" in r["keep_list"]]
        needing = [k for k in lists if k["kept"]]
        if needing:
            rules = Counter(rule for k in needing for rule in k.get("rules", []))
            types = Counter(t for k in needing for t in k["op_types"])
            common = [t for t, n in sorted(types.items()) if n == len(needing)]
            keep = (f"{len(needing)} of {len(members)} exports need a keep-list ({_rule_list(rules, len(needing))}"
                    f"; op types in every one of them: {', '.join(common) or 'none'})")
        else:
            keep = f"none of {len(members)} exports needs a keep-list"
        broken = []
        for name in CONVERTERS:
            breaking = [r for r in members
                        if verdict_of_converter(r.get("fp16"), r.get("converters", {}).get(name)) == "breaks"]
            new = sorted({rule for r in breaking for rule in _new_rules(r["fp16"], r["converters"][name])})
            if breaking:
                broken.append(f"{name} breaks {len(breaking)}" + (f" ({', '.join(new)})" if new else ""))
        lines.append(f"- **{escape_cell(family)}**: {keep}; " + (", ".join(broken) or "no converter breaks one"))
    return lines


def _converter_line(members: list[dict]) -> str:
    total, broken = len(members), []
    for name in CONVERTERS:
        breaking = [r for r in members
                    if verdict_of_converter(r.get("fp16"), r.get("converters", {}).get(name)) == "breaks"]
        new = Counter(rule for r in breaking for rule in _new_rules(r["fp16"], r["converters"][name]))
        errors = sum(1 for r in breaking if r["converters"][name].get("errors"))
        why = [f"{rule} {n}" for rule, n in sorted(new.items())] + ([f"errors {errors}"] if errors else [])
        broken.append(f"{name} {len(breaking)}/{total}" + (f" ({', '.join(why)})" if why else ""))
    return "converter's default breaks it: " + "; ".join(broken)


def _keep_list_line(members: list[dict]) -> str | None:
    lists = [r["keep_list"] for r in members if r.get("keep_list") and "kept" in r["keep_list"]]
    if not lists:
        return None
    needing = [k for k in lists if k["kept"]]
    if not needing:
        return f"keep-list for onnxruntime: none of {len(lists)} needs one"
    rules = Counter(rule for k in needing for rule in k.get("rules", []))
    types = Counter(t for k in needing for t in k["op_types"])
    kept, blocked = sum(k["kept"] for k in needing), sum(k["blocked"] for k in needing)
    return (f"keep-list for onnxruntime: {len(needing)}/{len(lists)} need one, for "
            f"{_rule_list(rules, len(needing))}; {kept} nodes kept in all against {blocked} by blocking their op "
            f"types (median {statistics.median(k['kept'] for k in needing):g} against "
            f"{statistics.median(k['blocked'] for k in needing):g}); op types kept: {_rule_list(types, len(needing))}")


def _fix_line(members: list[dict]) -> str | None:
    fixes = [r["fix"] for r in members if r.get("fix") and "written" in r["fix"]]
    if not fixes:
        return None
    needing = [f for f in fixes if _fix_had_work(f)]
    if not needing:
        return f"fix: nothing to repair in any of {len(fixes)}"
    written = [f for f in needing if f["written"]]
    clean = sum(1 for f in written if f.get("clean"))
    withheld, left = sum(f["withheld"] for f in needing), sum(f["left"] for f in needing)
    return (f"fix: something to repair in {len(needing)}/{len(fixes)}; it wrote a model for "
            f"{len(written)} of them, {clean} of which re-audit clean at fp16 ({withheld} repairs withheld beyond "
            f"the float32 gate, {left} findings left to a keep-list, in all)")


def summary(rows: list[dict], rules: dict | None = None) -> list[str]:
    """The patterns, counted from the rows: which rules fire where, and per family which converters break it, how
    large its keep-lists are against blocking the op types, and how often `fix` re-audits clean."""
    audited = _audited(rows)
    lines = [f"{len(audited)} exports audited ({len({r['architecture'] for r in audited})} architectures), "
             f"{len(rows) - len(audited)} export(s) that failed. Counts are exports (one per architecture and "
             "exporter): a rule followed by n/m fires on n of the family's m exports.", "",
             "### In short", "", *in_short(rows), "", "### Which rules fire where", "", *headline(rows, rules or {}), "",
             "### By family", ""]
    for family, members in _by_family(rows).items():
        total = len(members)
        lines.append(f"- **{escape_cell(family)}** ({total} exports: "
                     f"{escape_cell(', '.join(dict.fromkeys(r['architecture'] for r in members)))})")
        for mode in (*STATIC_DTYPES, "trace"):
            label = "traced fp16" if mode == "trace" else mode
            lines.append(f"    - {label}: {_rule_list(_fired(members, mode), total)}")
        extra = [_converter_line(members), _keep_list_line(members), _fix_line(members)]
        lines += [f"    - {line}" for line in extra if line]
    return lines


def runtime_summary(rows: list[dict]) -> list[str]:
    """Per runtime: how many exports have an error or a warning finding at fp16 as it computes, of those audited."""
    audited = [r for r in _audited(rows) if r.get("runtimes")]
    if not audited:
        return []
    lines = ["### By runtime", ""]
    for name in RUNTIMES:
        values = [r["runtimes"].get(name) or {} for r in audited]
        judged = [v for v in values if "counts" in v]
        flagged = [v for v in judged if v["errors"] or v.get("warnings", 0)]
        errors = sum(1 for v in judged if v["errors"])
        lines.append(f"- **{name}**: {len(flagged)} of {len(judged)} exports have an error or warning finding "
                     f"({errors} an error)" + (f"; {len(values) - len(judged)} not audited" if len(judged) < len(values)
                                               else ""))
    return [*lines, ""]


def render(data: dict) -> str:
    """The whole page from the data: the header, the table, the summary, and the data itself."""
    meta = data["meta"]
    # in a fixed order, not the data's: the embedded JSON sorts its keys, and a page must render the same from it
    order = sorted(meta["versions"], key=lambda k: (VERSION_ORDER.index(k) if k in VERSION_ORDER else 99, k))
    versions = ", ".join(f"{k} {escape_cell(meta['versions'][k])}" for k in order)
    scope = meta["scope"]
    lines = [
        "# Precision census",
        "",
        "Generated by `python benchmarks/architecture_sweep.py --census docs/census.md`; do not edit by hand. "
        "`--census-check docs/census.md` reruns the sweep and exits 1 if any row differs from this page.",
        "",
        f"**Scope: {escape_cell(scope)}.**",
        "",
        f"Versions: {versions}; precaudit commit {escape_cell(meta['commit'])}.",
        "",
        f"Machine: {escape_cell(meta['machine'])}.",
        "",
        f"{TIMING_PREFIX}{escape_cell(meta['date'])}, the sweep took {meta['seconds'] / 60:.1f} min "
        f"(`--jobs {meta['jobs']}`).",
        "",
        "## How each column is measured",
        "",
        "Each architecture is a tiny random-init transformers model (`benchmarks/architecture_sweep.py`: hidden "
        "size 32, two layers, seeded with `torch.manual_seed(0)`), exported in float32 by the TorchScript exporter "
        "(opset 17) and by the dynamo exporter. Every export is audited in one child process, through the Python "
        "API (`precaudit.audit`, `keep_list`, `fix`, with no pyproject); a child that crashes or times out is "
        "reported as FAILED in its row, and the sweep goes on.",
        "",
        "- **fp16, bf16, fp8-e4m3**: the static audit, `precaudit MODEL --dtype D`; each rule with the number of "
        "sites it fired at (`—`: no finding).",
        "- **traced fp16**: `--trace --dtype fp16` on **synthesized inputs** (N(0, 1) values, random token ids; "
        "seed 0), not real data: a traced finding here is what random inputs reach.",
        "- **converter breaks it / keeps it**: `--converter C` (fp16) for onnxconverter-common, modelopt and "
        "onnxruntime: the audit of the model that converter's *default* conversion writes "
        "([Converters](converters.md)). A converter **breaks** the model when its audit has a finding at a "
        "(rule, node) the plain fp16 audit does not have, or any finding of severity error; the rules in brackets "
        "are those new ones. Otherwise it **keeps** it: the conversion adds nothing to what plain fp16 has.",
        "- **keep-list: kept / op-block**: `precaudit keep-list MODEL --for onnxruntime` (static, its snippet run "
        "with the real converter): the number of nodes it keeps in float32, against the number of nodes an "
        "`op_block_list` of the same op types keeps (every node of those types in the graph), with the op types "
        "and their node counts. `0`: no node needs keeping.",
        "- **fix**: `precaudit fix MODEL -o OUT` at fp16 ([Fixing a model](fix.md)), its float32 gate on "
        "synthesized inputs (so a model written with every repair passing exits 3): the repairs written, those "
        "withheld (beyond `--tolerance 1e-3` in float32: exit 1), the findings it leaves to a keep-list (a float32 "
        "model's norm chain), its exit code, and whether OUT re-audits **clean** at fp16: no finding of severity "
        "error or warning (info findings do not count).",
        "- **ort-cpu, ort-cuda, tensorrt, openvino-cpu, coreml**: `precaudit MODEL --dtype fp16 --runtime R` at each "
        "runtime's newest modelled version ([Runtimes](runtimes.md)): the errors and warnings of the audit as that "
        "runtime computes (`ok`: none). coreml audits the PyTorch module itself (coremltools converts modules, not "
        "ONNX files), so both exports of an architecture show the same cell.",
        "",
        "## What the rows show",
        "",
        *summary(data["rows"], meta.get("rules", {})),
        "",
        *runtime_summary(data["rows"]),
        "## The rows",
        "",
        *table(data["rows"]),
        "",
        DATA_START,
        _json_for_comment(data),
        DATA_END,
        "",
    ]
    return "\n".join(lines)


# ---- reading a page back and comparing two runs --------------------------------------------------------------


def data_of(page: str) -> dict:
    """The data a page embeds (ValueError where it has none)."""
    start, end = page.rfind(DATA_START), page.rfind(DATA_END)
    if start < 0 or end < start:
        raise ValueError("no census data block in the page")
    return json.loads(page[start + len(DATA_START):end])


def read_data(path) -> dict:
    from pathlib import Path
    return data_of(Path(path).read_text(encoding="utf-8"))


def renders_itself(page: str) -> bool:
    """Whether the page is exactly what its embedded data renders to (no hand edit since it was generated)."""
    return render(data_of(page)) == page


def _key(row: dict) -> tuple[str, str]:
    return row["architecture"], row["exporter"]


def differences(old: dict, new: dict) -> list[str]:
    """What differs between two runs' data, except the timing, the commit and the machine (the run, not its
    results): the scope, the versions, and each row that is in one only or differs, as the table prints it."""
    found = []
    for field in ("scope", "versions"):
        if old["meta"].get(field) != new["meta"].get(field):
            found.append(f"{field}: page {old['meta'].get(field)!r}, rerun {new['meta'].get(field)!r}")
    old_rows, new_rows = {_key(r): r for r in old["rows"]}, {_key(r): r for r in new["rows"]}
    for key in sorted(set(old_rows) | set(new_rows)):
        before, after = old_rows.get(key), new_rows.get(key)
        if before == after:
            continue
        found.append(f"{key[0]} {key[1]}:")
        found.append("  page:  " + (table([before])[2] if before else "(no row)"))
        found.append("  rerun: " + (table([after])[2] if after else "(no row)"))
    return found
