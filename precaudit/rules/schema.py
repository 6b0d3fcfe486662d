"""The rule-file JSON Schema, from the loader's own keys, severities, site kinds and repair kinds: what editors
validate a user's rule file against (docs/rules/rule-schema.json). The loader stays the authority: it also checks
conditions, templates and sizes, which a schema cannot."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["EXAMPLE_KEYS", "EXAMPLE_REQUIRED", "render_schema", "rule_schema"]

# One example in a rule's tests (precaudit test runs each): the model, check's options, the nodes it fires at.
EXAMPLE_KEYS = ("model", "args", "fires")
EXAMPLE_REQUIRED = ("model", "fires")


def rule_schema() -> dict[str, Any]:
    from ..analysis.sites.base import FACT_NAMES
    from ..finding import SEVERITIES
    from ..repairs import REPAIR_KINDS
    from .loader import _ID, _NAME, _OPTIONAL, _REQUIRED

    text = {"type": "string"}
    properties: dict[str, Any] = {
        # the loader anchors with \Z (no trailing newline); ECMA-262 has no \Z, and a validator using Python's re
        # lets $ match before a trailing newline: (?![\s\S]) is the end of the text in both
        "id": {"type": "string", "pattern": _ID.pattern.replace("\\Z", "(?![\\s\\S])"),
               "description": "PA101, US001 ..."},
        "name": {"type": "string", "pattern": _NAME.pattern.replace("\\Z", "(?![\\s\\S])")},
        "severity": {"enum": list(SEVERITIES)},
        "summary": text, "description": text, "example": text, "condition": text, "message": text, "fix": text,
        "sites": {"type": "array", "items": {"enum": sorted(FACT_NAMES)}, "minItems": 1},
        "pattern": {"type": "object", "description": "an op pattern (see docs): the rule makes its own sites"},
        "ops": {"type": "array", "items": {"type": "string"}},
        "params": {"type": "object"},
        "references": {"type": "array", "items": {"type": "string"}},
        "preview": {"type": "boolean"},
        "repair": {"oneOf": [{"enum": sorted(REPAIR_KINDS)},
                             {"type": "object", "required": ["none"], "additionalProperties": False,
                              "properties": {"none": {"type": "string", "minLength": 1},
                                             "keep-fp32": {"type": "boolean"}}}]},
        "tests": {"type": "array", "items": _example(),
                  "description": "the rule's own examples, run by `precaudit test RULES_DIR`"},
    }
    assert set(properties) == set(_REQUIRED) | set(_OPTIONAL)  # the loader's keys, no more, no fewer
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "precaudit rule file", "type": "object",
            "required": list(_REQUIRED), "additionalProperties": False, "properties": properties,
            "anyOf": [{"required": ["sites"]}, {"required": ["pattern"]}]}


def _example() -> dict[str, Any]:
    properties = {
        "model": {"type": "string", "pattern": r"^(?![/\\])[\s\S]*\.onnx(?![\s\S])",
                  "description": "an ONNX file, relative to the rule file, inside the rule folder"},
        "args": {"type": "array", "items": {"type": "string"},
                 "description": "check's options for this example (default --dtype fp16)"},
        "fires": {"type": "array", "items": {"type": "string", "minLength": 1}, "uniqueItems": True,
                  "description": "every node where the rule must fire; [] where it must stay quiet"},
    }
    assert tuple(properties) == EXAMPLE_KEYS
    return {"type": "object", "required": list(EXAMPLE_REQUIRED), "additionalProperties": False,
            "properties": properties}


def render_schema() -> str:
    return json.dumps(rule_schema(), indent=2) + "\n"
