"""Real exporter output: every hazard module flagged with exactly the expected rules, every twin left alone."""

from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")  # the dynamo exporter's backend

from fixtures.torch_exports import CASES, DTYPES, HF_CASES, export  # noqa: E402
from tests.helpers import run_json  # noqa: E402

PARAMS = [(case, exporter, dtype) for case in CASES + HF_CASES for exporter in case.exporters for dtype in DTYPES]


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("exports")


@pytest.mark.parametrize("case,exporter,dtype", PARAMS, ids=[f"{c.name}-{e}-{d}" for c, e, d in PARAMS])
def test_export(case, exporter, dtype, export_dir, tmp_path):
    if case.name.startswith("hf_"):
        pytest.importorskip("transformers")
    model = export(case, exporter, dtype, export_dir)
    code, report = run_json([model], "--dtype", "fp16", out_dir=tmp_path)
    assert report["errors"] == []
    assert Counter(r["rule_id"] for r in report["results"]) == case.expect(exporter, dtype)
