"""RoPE as the three exporters write it with a dynamic sequence: PA217 where the angle runs in fp16, bounded by
--dim, measured by --trace; nothing where transformers' float32 upcast survives (an fp16 export)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")  # the dynamo exporter's backend

from fixtures.torch_exports import EXPORTERS, Rope, export_dynamic_seq  # noqa: E402
from tests.helpers import run_json  # noqa: E402

# (upcast, dtype of the export) -> rule ids (with the node's op) without --dim, with seq=64, with seq=4096, traced
_IN_FP16 = ([("PA217", "Cos")], [], [("PA217", "Cos"), ("PA218", "Cast")],
            [("PA217", "Cos"), ("PA218", "Cast"), ("PA909", "Cos"), ("PA910", "Cast")])
EXPECT = {(False, "fp32"): _IN_FP16, (False, "fp16"): _IN_FP16,
          # .float() of an fp32 export is a no-op: a converter narrows the angle with everything else
          (True, "fp32"): _IN_FP16,
          # an fp16 export keeps the float32 island the source wrote: the angle and its cos in float32
          (True, "fp16"): ([], [], [], [])}
RUNS = ((), ("--dim", "seq=64"), ("--dim", "seq=4096"), ("--trace", "--dim", "seq=4096"))
PARAMS = [(upcast, exporter, dtype) for upcast in (False, True) for exporter in EXPORTERS for dtype in ("fp32", "fp16")]


@pytest.mark.parametrize("upcast,exporter,dtype", PARAMS,
                         ids=[f"{'upcast' if u else 'plain'}-{e}-{d}" for u, e, d in PARAMS])
def test_rope_angle(upcast, exporter, dtype, tmp_path):
    model = export_dynamic_seq(Rope(upcast), exporter, dtype, tmp_path / "rope.onnx")
    for args, expected in zip(RUNS, EXPECT[(upcast, dtype)]):
        _code, report = run_json([model], "--dtype", "fp16", *args, out_dir=tmp_path)
        assert report["errors"] == []
        found = sorted((r["rule_id"], r["op_type"]) for r in report["results"])
        assert found == sorted(expected), args
        by_rule = {r["rule_id"]: r for r in report["results"]}
        if "PA217" in by_rule:
            bound = by_rule["PA217"]["values"]["angle_bound"]
            assert bound == (4096.0 if "seq=4096" in args else None), args  # position 4096 x inv_freq 1.0
        if "PA909" in by_rule:
            assert by_rule["PA909"]["values"]["angle_max"] == 4095.0
            assert by_rule["PA909"]["inputs"] == "synthesized"
