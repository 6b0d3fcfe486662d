"""A scan as SARIF 2.1.0, shaped like precaudit's own (report/sarif.py): one run, every check as a rule, one result
per finding located at its shard file and named by its tensor. Message texts are escaped (escape.printable) as
in the text report; locations and properties carry names raw."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..escape import printable
from ..version import __version__
from .findings import RULES, ScaleFinding

if TYPE_CHECKING:
    from .report import ScanReport

__all__ = ["render_sarif", "sarif_document"]

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
FINGERPRINT_KEY = "precauditFingerprint/v1"
_LEVELS = {"error": "error", "warning": "warning", "info": "note"}


def sarif_document(report: ScanReport) -> dict[str, Any]:
    from ..report.locations import repo_root

    root = repo_root()
    index = {rule: i for i, rule in enumerate(RULES)}
    run = {
        "tool": {"driver": {"name": "precaudit", "version": __version__, "semanticVersion": __version__,
                            "rules": [_rule(rule) for rule in RULES]}},
        "originalUriBaseIds": {"%SRCROOT%": {"uri": root.as_uri() + "/"}},
        "results": [_result(f, index, root) for f in report.findings],
        "invocations": [{"executionSuccessful": True, "exitCode": report.exit_code,
                         "toolExecutionNotifications": [{"level": "note", "message": {"text": printable(n)}}
                                                        for n in report.notes]}],
        "properties": {"checkpoint": report.checkpoint, "bytes_read": report.bytes_read,
                       "bytes_total": report.bytes_total, "scale_tensors": len(report.tensors)},
    }
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}


def render_sarif(report: ScanReport) -> str:
    from ..escape import strict_json

    return json.dumps(strict_json(sarif_document(report)), indent=2, allow_nan=False) + "\n"


def _rule(rule: str) -> dict[str, Any]:
    name, severity, summary = RULES[rule]
    return {"id": rule, "name": name, "shortDescription": {"text": summary}, "fullDescription": {"text": summary},
            "help": {"text": summary, "markdown": summary.replace("*", "\\*")},
            "defaultConfiguration": {"level": _LEVELS[severity]},
            "properties": {"tags": ["precision", "quantization", "checkpoint"],
                           "precision": "very-high" if severity == "error" else "high"}}


def _result(f: ScaleFinding, index: dict[str, int], root: Path) -> dict[str, Any]:
    fingerprint = hashlib.sha256(f"{f.rule}\0{os.path.basename(f.file)}\0{f.tensor}".encode("utf-8",
                                                                                             "surrogateescape"))
    return {
        "ruleId": f.rule,
        "ruleIndex": index[f.rule],
        "level": _LEVELS[f.severity],
        "message": {"text": printable(f"tensor '{f.tensor}': {f.message}")},
        "locations": [{"physicalLocation": {"artifactLocation": _artifact(f.file, root), "region": {"startLine": 1}},
                       "logicalLocations": [{"name": f.tensor, "kind": "variable"}]}],
        "partialFingerprints": {FINGERPRINT_KEY: fingerprint.hexdigest()[:32]},
        "properties": {"values": f.values},
    }


def _artifact(path: str, root: Path) -> dict[str, str]:
    from ..report.locations import relative_path

    uri = relative_path(path, root)
    if uri.startswith("/"):  # outside the repository: code scanning cannot show it, other viewers can open it
        return {"uri": Path(uri).as_uri()}
    return {"uri": uri, "uriBaseId": "%SRCROOT%"}
