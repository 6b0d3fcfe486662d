"""--runtime all: the deployment matrix. The same audit at every runtime that runs the model, one row per hazard
and one column per runtime, each cell the hazard's severity there (or ok) with the fact it rests on: the table a
team reads to pick a target."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .runtime import RUNTIME_NAMES, runtime_classes

if TYPE_CHECKING:
    from .config import Settings
    from .errors import InputError
    from .finding import Finding
    from .options import TorchOptions, TraceOptions

__all__ = ["Matrix", "deployment_matrix", "render_matrix_json", "render_matrix_text"]

_RANK = {"ok": 0, "info": 1, "warning": 2, "error": 3}


@dataclass
class Cell:
    severity: str  # error, warning, info, or ok (the hazard is not there at this runtime)
    reason: str = ""  # why that dtype: the runtime fact, or the converter's/graph's reason
    fact: str | None = None
    message: str = ""


@dataclass
class Row:
    model: str
    rule_id: str
    rule_name: str
    node: str
    cells: dict[str, Cell] = field(default_factory=dict)


@dataclass
class Matrix:
    runtimes: list[str]  # NAME@VERSION, the columns
    rows: list[Row] = field(default_factory=list)
    errors: list[InputError] = field(default_factory=list)  # models that could not be audited (at some runtime)
    models: list[str] = field(default_factory=list)
    exit_code: int = 0


def deployment_matrix(settings: Settings, models: list[str], torch: TorchOptions | None, inputs: TraceOptions,
                      traced: bool, fail_on: str) -> Matrix:
    """Audit every model at every runtime that runs it (ONNX files on the onnxruntime EPs, TensorRT and OpenVINO;
    PyTorch modules on Core ML, eager CUDA and Inductor), and lay the findings out side by side."""
    from .context import Audit
    from .pipeline import EXIT_ERROR, EXIT_FINDINGS, exit_code_of, run_audit

    kind = {m: "onnx" if m.lower().endswith(".onnx") else "torch" for m in models}
    classes = runtime_classes()
    names = [n for n in RUNTIME_NAMES if any(k in classes[n].runs for k in kind.values())]
    matrix = Matrix([f"{n}@{classes[n].versions[-1]}" for n in names], models=list(models))
    found: dict[tuple[str, str, str], Row] = {}
    counted: list[Finding] = []
    for name, column in zip(names, matrix.runtimes):
        mine = [m for m in models if kind[m] in classes[name].runs]
        audit = Audit.of(dataclasses.replace(settings, runtime=name), torch, inputs, traced)
        outcome = run_audit(audit, mine)
        matrix.errors += [e for e in outcome.result.errors if str(e) not in {str(x) for x in matrix.errors}]
        counted += outcome.result.findings
        for f in outcome.result.findings:
            row = found.setdefault((f.model, f.rule_id, f.node_name), Row(f.model, f.rule_id, f.rule_name, f.node_name))
            cell = row.cells.get(column)
            if cell is None or _RANK[f.severity] > _RANK[cell.severity]:
                row.cells[column] = Cell(f.severity, str(f.values.get("compute_reason") or ""),
                                         f.values.get("compute_fact"), f.message)
    for row in found.values():
        for name, column in zip(names, matrix.runtimes):
            if row.model in models and kind[row.model] in classes[name].runs:
                row.cells.setdefault(column, Cell("ok"))
    matrix.rows = sorted(found.values(), key=lambda r: (models.index(r.model), r.node, r.rule_id))
    code = exit_code_of(counted, bool(matrix.errors), fail_on)
    matrix.exit_code = EXIT_ERROR if matrix.errors else EXIT_FINDINGS if code else 0
    return matrix


def render_matrix_json(matrix: Matrix) -> str:
    from .report.json import strict_json

    data = {"schema_version": 1, "runtimes": matrix.runtimes, "models": matrix.models,
            "rows": [{"model": r.model, "rule_id": r.rule_id, "rule_name": r.rule_name, "node": r.node,
                      "cells": {c: dataclasses.asdict(cell) for c, cell in r.cells.items()}} for r in matrix.rows],
            "errors": [{"file": e.file, "message": e.problem} for e in matrix.errors], "exit_code": matrix.exit_code}
    return json.dumps(strict_json(data), indent=2, ensure_ascii=False) + "\n"


def render_matrix_text(matrix: Matrix) -> str:
    """One row per hazard, one column per runtime (error, warn, info, ok; '-' where it does not run the model)."""
    from .escape import printable

    short = {"error": "ERROR", "warning": "warn", "info": "info", "ok": "ok"}
    heads = [c.split("@")[0] for c in matrix.runtimes]
    label = [f"{printable(r.node)} {r.rule_id} {r.rule_name}" for r in matrix.rows]
    width = max([len(x) for x in label] + [len("hazard")])
    lines = ["  ".join([f"{'hazard':<{width}}", *(f"{h:>{max(len(h), 5)}}" for h in heads)])]
    model = None
    for row, text in zip(matrix.rows, label):
        if row.model != model:
            model = row.model
            lines.append(printable(model))
        cells = [short[row.cells[c].severity] if c in row.cells else "-" for c in matrix.runtimes]
        lines.append("  ".join([f"{text:<{width}}", *(f"{v:>{max(len(h), 5)}}" for v, h in zip(cells, heads))]))
    if not matrix.rows:
        lines.append("no hazard at any runtime")
    lines.append(f"runtimes: {', '.join(matrix.runtimes)} (precaudit runtimes says what each fact rests on; "
                 "--format json gives every cell's reason)")
    lines += [f"error: {printable(str(e))}" for e in matrix.errors]
    return "\n".join(lines) + "\n"
