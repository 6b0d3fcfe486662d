"""SARIF 2.1.0 for GitHub code scanning: one run, the rules that ran, one result per finding.

Locations and properties carry names raw, as data (as the JSON report does); message texts are what viewers
show people, so they are escaped (escape.printable) as in the text report.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..finding import Finding
from ..rules.loader import Rule
from ..version import __version__
from .json import _strict
from .locations import full_message, relative_path, shown
from .outcome import Outcome
from .rule_docs import placeholders

__all__ = ["FINGERPRINT_KEY", "render_sarif", "sarif_document"]

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
FINGERPRINT_KEY = "precauditFingerprint/v1"
_LEVELS = {"error": "error", "warning": "warning", "info": "note"}


def sarif_document(outcome: Outcome) -> dict:
    """The SARIF log as plain data."""
    index = {rule.id: i for i, rule in enumerate(outcome.rules)}
    run = {
        "tool": {"driver": {"name": "precaudit", "version": __version__, "semanticVersion": __version__,
                            "rules": [_rule(rule) for rule in outcome.rules]}},
        "originalUriBaseIds": {"%SRCROOT%": {"uri": outcome.root.as_uri() + "/"}},
        "results": [_result(f, index, outcome) for f in outcome.result.findings],
        "invocations": [{
            "executionSuccessful": not outcome.result.errors,
            "exitCode": outcome.exit_code,
            "toolExecutionNotifications": [{"level": "error", "message": {"text": str(e)}}  # str(): escaped
                                           for e in outcome.result.errors],
        }],
    }
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}


def render_sarif(outcome: Outcome) -> str:
    return json.dumps(_strict(sarif_document(outcome)), indent=2, allow_nan=False) + "\n"


def _rule(rule: Rule) -> dict:
    description = _unwrap(rule.description) or rule.summary
    tags = ["precision", "numerics", *(["preview"] if rule.preview else [])]
    return {
        "id": rule.id,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": description},
        "help": {"text": _help_text(rule), "markdown": _help_markdown(rule)},
        "defaultConfiguration": {"level": _LEVELS[rule.severity]},
        # GitHub reads precision (how often a finding is a true positive) and tags from here.
        "properties": {"tags": tags, "precision": "very-high" if rule.severity == "error" else "high"},
    }


def _help_text(rule: Rule) -> str:
    parts = [rule.summary, _unwrap(rule.description), f"Example:\n{rule.example}" if rule.example else "",
             f"Fix: {placeholders(rule.fix)}"]
    return "\n\n".join(p for p in parts if p)


def _help_markdown(rule: Rule) -> str:
    """The rule's help as code scanning renders it: a stranger's rule text shows as written (report/markdown.py),
    and only an http(s) reference is a link."""
    from .markdown import code_block, link_or_text, one_line, prose

    parts = [f"**{rule.id} {rule.name}**: {one_line(rule.summary)}", prose(_unwrap(rule.description)),
             f"Example:\n\n{code_block(rule.example)}" if rule.example else "",
             f"**Fix:** {prose(placeholders(rule.fix))}",
             "\n".join(f"- {link_or_text(ref)}" for ref in rule.references)]
    return "\n\n".join(p for p in parts if p)


def _unwrap(text: str) -> str:
    """YAML block text is wrapped at 110 columns; viewers wrap by themselves, so join lines within a paragraph."""
    return "\n\n".join(" ".join(p.split("\n")) for p in text.split("\n\n"))


def _result(f: Finding, index: dict[str, int], outcome: Outcome) -> dict:
    return {
        "ruleId": f.rule_id,
        "ruleIndex": index[f.rule_id],
        "level": _LEVELS[f.severity],
        "message": {"text": full_message(shown(f))},
        "locations": [_location(f, outcome)],
        **({"relatedLocations": _related(f, outcome)} if f.related_locations else {}),
        "partialFingerprints": {FINGERPRINT_KEY: f.fingerprint},
        "properties": {"model": f.model, "values": f.values},
    }


def _location(f: Finding, outcome: Outcome) -> dict:
    # A PyTorch finding points at the Python line that built the op; an ONNX finding at the model file itself.
    path, line = (f.source_file, f.source_line or 1) if f.source_file else (f.model, 1)
    node = f.node_name.lstrip("/")
    return {
        "physicalLocation": {
            "artifactLocation": _artifact(path, outcome),
            "region": {"startLine": line},
        },
        # kind "function": a node is one call of an operator (ONNX ops are functions); "module" would be its scope.
        "logicalLocations": [{"name": f.node_name, "kind": "function",
                              "fullyQualifiedName": f"{f.scope}/{node}" if f.scope else f.node_name}],
    }


def _related(f: Finding, outcome: Outcome) -> list[dict]:
    """Other places that explain a finding: the user's call into the library module whose forward() holds it."""
    return [{"id": i, "message": {"text": loc["message"]},
             "physicalLocation": {"artifactLocation": _artifact(loc["file"], outcome),
                                  "region": {"startLine": loc["line"] or 1}}}
            for i, loc in enumerate(f.related_locations, 1)]


def _artifact(path: str, outcome: Outcome) -> dict:
    uri = relative_path(path, outcome.root)
    if uri.startswith("/"):  # outside the repository: GitHub cannot show it, but other viewers can open the file
        return {"uri": Path(uri).as_uri()}
    return {"uri": uri, "uriBaseId": "%SRCROOT%"}
