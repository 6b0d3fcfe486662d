"""Run the CLI in-process and read its JSON report, as a user's script would."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from precaudit.cli import main

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "precaudit/schemas/report.schema.json").read_text())


def run_json(models: list[Path | str], *args: str, out_dir: Path) -> tuple[int, dict]:
    """Exit code and parsed JSON report of `precaudit MODELS... ARGS -f json -o FILE`."""
    out = out_dir / "report.json"
    code = main([*map(str, models), *args, "--format", "json", "-o", str(out)])
    report = json.loads(out.read_text())
    jsonschema.Draft7Validator(SCHEMA).validate(report)  # every report any test reads follows the schema
    return code, report


def assert_traced_alike(model: Path | str, out_dir: Path) -> list[tuple[str, str]]:
    """Trace the model on both engines: no errors, every node on onnxruntime, the same PA9 findings (returned)."""
    found = {}
    for engine in ("onnxruntime", "numpy"):
        _, report = run_json([model], "--trace", "--trace-engine", engine, "--select", "PA9", out_dir=out_dir)
        assert report["errors"] == []
        found[engine] = sorted((r["rule_id"], r["node_name"]) for r in report["results"])
        if engine == "onnxruntime":
            assert report["trace"][0]["nodes"]["numpy"] == 0
    assert found["onnxruntime"] == found["numpy"]
    return found["onnxruntime"]
