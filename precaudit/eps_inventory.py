"""`precaudit eps`: every epsilon and floor of a graph — a normalization's eps, a guard's Max/Clip/Add constant —
with the value it really has where it is used: as written, as the converter leaves it (clamped, bumped), as stored,
and as the dtype the runtime computes it in holds it; and the eps a converter writes of its own (coremltools' log,
rsqrt and reciprocal). `--diff OLD NEW` says what changed between two exports or versions of a model."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context import Audit
    from .ir import Graph

__all__ = [
    "EpsEntry",
    "diff_inventories",
    "eps_inventory",
    "render_diff_json",
    "render_diff_text",
    "render_inventory_json",
    "render_inventory_text",
]

# the eps coremltools' MIL writes for these torch ops (coremltools ops/defs/iOS15/elementwise_unary.py; 9.0 and
# earlier for reciprocal), cast to float16 below iOS 17 (1e-45 becomes 0.0, 1e-12 is bumped to 5.96e-8)
_COREML_INSERTS = {"Log": ("log(x + 1e-45)", 1e-45), "Reciprocal": ("1 / (x + 1e-4)", 1e-4)}


@dataclass
class EpsEntry:
    """One eps or floor and what becomes of it."""

    node: str
    op: str
    kind: str  # LayerNorm, RMSNorm, ... (a normalization's eps) or guard (a floor under a log, sqrt or division)
    placement: str  # inside_sqrt, outside_sqrt, guard, missing, ...
    written: float | None  # as the graph (or the converter, for an inserted one) writes it
    converted: float | None  # as the converter leaves it (its clamp), where that differs
    value: float | None  # in the dtype it is used in: what the kernel adds
    dtype: str  # that dtype
    held: str  # the format the eps reaches the kernel in (stored narrower where the runtime widens)
    state: str  # normal, subnormal, zero, overflow, invalid, none
    source: str  # where it lives: attribute, initializer, Constant node; what changed it
    reason: str  # why that dtype
    inserted_by: str = ""  # a converter's own eps, not in the graph


def eps_inventory(audit: Audit, path: str) -> tuple[Graph, list[EpsEntry]]:
    """The model's eps and floors at the audit's deployment (dtype, converter, runtime), in graph order."""
    from .analysis.collect import collect_sites

    graph = audit.load(path)
    resolver = audit.deployment.resolver(graph)
    entries = []
    for site in collect_sites(graph, resolver, {}):
        facts = site.facts
        if site.kind not in ("norm", "guard") or "eps" not in facts or (site.kind == "guard" and facts.get("in_norm_chain")):
            continue  # (a norm chain's Add is the norm's eps, listed once as such)
        entries.append(EpsEntry(
            node=site.node.name, op=site.node.op_type,
            kind=facts.get("norm") or "guard", placement=str(facts.get("eps_placement") or "guard"),
            written=facts.get("eps"), converted=facts.get("eps_converted"), value=facts.get("eps_rounded"),
            dtype=str(facts.get("compute_dtype")), held=str(facts.get("eps_dtype") or facts.get("compute_dtype")),
            state=str(facts.get("eps_class") or "none"), source=str(facts.get("eps_source") or ""),
            reason=str(facts.get("compute_reason") or "")))
    entries += _inserted(graph, audit)
    return graph, entries


def _inserted(graph: Graph, audit: Audit) -> list[EpsEntry]:
    """The eps a converter writes of its own where the runtime model says so (coremltools, for torch ops)."""
    runtime = audit.deployment.runtime
    if runtime is None or runtime.name != "coreml":
        return []
    from .dtypes import FORMATS, classify, round_to_format

    fp16 = FORMATS["fp16"]
    out = []
    for node in graph.nodes:
        inserted = _COREML_INSERTS.get(node.op_type)
        if inserted is None:
            continue
        form, eps = inserted
        value = round_to_format(eps, fp16)
        out.append(EpsEntry(node.name, node.op_type, "inserted", "guard", eps, None, value, fp16.long_name,
                            fp16.long_name, classify(eps, fp16), f"coremltools writes {form}",
                            f"{runtime.label}: below iOS 17 it is cast to float16", inserted_by=runtime.label))
    return out


def diff_inventories(old: list[EpsEntry], new: list[EpsEntry]) -> list[dict[str, Any]]:
    """What changed between two inventories, matched by node name and op: changed values, gone and new entries."""
    before = {(e.node, e.op, e.kind): e for e in old}
    after = {(e.node, e.op, e.kind): e for e in new}
    changes: list[dict[str, Any]] = []
    for key in [*before, *(k for k in after if k not in before)]:
        a, b = before.get(key), after.get(key)
        if a is not None and b is not None:
            if (a.written, a.value, a.dtype, a.state) != (b.written, b.value, b.dtype, b.state):
                changes.append({"change": "changed", "node": key[0], "op": key[1], "kind": key[2], "old": asdict(a),
                                "new": asdict(b)})
        else:
            changes.append({"change": "gone" if b is None else "new", "node": key[0], "op": key[1], "kind": key[2],
                            "old": asdict(a) if a else None, "new": asdict(b) if b else None})
    return changes


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def render_inventory_text(model: str, entries: list[EpsEntry]) -> str:
    from .escape import printable

    lines = [f"{printable(model)}: {len(entries)} eps and floor{'s' * (len(entries) != 1)}"]
    for e in entries:
        converted = f" → {_shown(e.converted)}" if e.converted is not None else ""
        lines.append(f"  {printable(e.node)} ({e.op}, {e.kind} {e.placement}): {_shown(e.written)}{converted} → "
                     f"{_shown(e.value)} in {e.dtype} [{e.state}]")
        lines.append(f"      {printable(e.source)}; {printable(e.reason)}")
    return "\n".join(lines) + "\n"


def render_inventory_json(model: str, entries: list[EpsEntry]) -> str:
    from .report.json import strict_json

    return json.dumps(strict_json({"schema_version": 1, "model": model, "eps": [asdict(e) for e in entries]}),
                      indent=2, ensure_ascii=False) + "\n"


def render_diff_text(old: str, new: str, changes: list[dict[str, Any]]) -> str:
    from .escape import printable

    lines = [f"{printable(old)} → {printable(new)}: {len(changes)} change{'s' * (len(changes) != 1)}"]
    for c in changes:
        a, b = c["old"], c["new"]
        if c["change"] == "changed":
            lines.append(f"  {printable(c['node'])} ({c['op']}): {_shown(a['written'])} → {_shown(a['value'])} in "
                         f"{a['dtype']} [{a['state']}]  became  {_shown(b['written'])} → {_shown(b['value'])} in "
                         f"{b['dtype']} [{b['state']}]")
        else:
            e = a if c["change"] == "gone" else b
            lines.append(f"  {c['change']}: {printable(c['node'])} ({c['op']}) {_shown(e['written'])} → "
                         f"{_shown(e['value'])} in {e['dtype']} [{e['state']}]")
    return "\n".join(lines) + "\n"


def render_diff_json(old: str, new: str, changes: list[dict[str, Any]]) -> str:
    from .report.json import strict_json

    return json.dumps(strict_json({"schema_version": 1, "old": old, "new": new, "changes": changes}), indent=2,
                      ensure_ascii=False) + "\n"
