"""Real exporter output, and the same modules audited directly: exactly the expected rules, twins left alone."""

from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")  # the dynamo exporter's backend

from fixtures.torch_exports import CASES, DTYPES, HF_CASES, export  # noqa: E402
from tests.helpers import assert_traced_alike, run_json  # noqa: E402

PARAMS = [(case, exporter, dtype) for case in CASES + HF_CASES for exporter in case.exporters for dtype in DTYPES]


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("exports")


@pytest.mark.parametrize("case,exporter,dtype", PARAMS, ids=[f"{c.name}-{e}-{d}" for c, e, d in PARAMS])
def test_export(case, exporter, dtype, export_dir, tmp_path):
    if case.name.startswith("hf_"):
        pytest.importorskip("transformers")
    model = export(case, exporter, dtype, export_dir)
    _code, report = run_json([model], "--dtype", "fp16", out_dir=tmp_path)
    assert report["errors"] == []
    assert Counter(r["rule_id"] for r in report["results"]) == case.expect(exporter, dtype)
    if dtype == "fp16" and pytest.importorskip("onnxruntime"):
        # traced mode runs every exported graph on onnxruntime, node for node, and finds what the numpy kernels find
        assert_traced_alike(model, tmp_path)


ALL = CASES + HF_CASES


@pytest.mark.parametrize("index", range(len(ALL)), ids=[c.name for c in ALL])
def test_direct_capture(index, tmp_path):
    """The module itself, as `precaudit model.py:factory` captures it with torch.export in fp16."""
    case = ALL[index]
    if case.name.startswith("hf_"):
        pytest.importorskip("transformers")
    factory = tmp_path / "factory.py"
    factory.write_text("from fixtures.torch_exports import CASES, HF_CASES\n"
                       f"def make():\n    case = (CASES + HF_CASES)[{index}]\n    return case.make(), case.example()\n")
    _code, report = run_json([f"{factory}:make"], "--dtype", "fp16", out_dir=tmp_path)
    assert report["errors"] == []
    assert Counter(r["rule_id"] for r in report["results"]) == case.expect("torch", "fp16")
