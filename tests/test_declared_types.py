"""A model that declares every value's type and shape (as the dynamo exporter writes it) is audited from the file's
own declarations, without onnx's shape inference, and with exactly the findings inference would give."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import onnx
import pytest

from fixtures.onnx_builders import decomposed_layernorm, save
from precaudit.audit_models import load_graph
from tests.helpers import run_json

_ROOT = Path(__file__).resolve().parent.parent


def _reduction_model():
    spec = importlib.util.spec_from_file_location("pa214", _ROOT / "fixtures" / "PA214_long_reduction.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.reduce("ReduceSum", shape=(2, 8192), dtype="fp16")


MODELS = {
    "decomposed LayerNorm, eps 1e-5 (subnormal in fp16)": lambda: decomposed_layernorm(1e-5)[0],
    "decomposed LayerNorm, eps 1e-12 as a Constant": lambda: decomposed_layernorm(1e-12, eps_at="constant")[0],
    "a ReduceSum over 8,192 fp16 elements": _reduction_model,
}


@pytest.fixture
def inference_calls(monkeypatch):
    calls = []
    real = onnx.shape_inference.infer_shapes

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", counted)
    return calls


@pytest.mark.parametrize("name", MODELS)
def test_declared_types_give_the_findings_inference_gives(name, tmp_path, inference_calls):
    bare = MODELS[name]()
    declared = onnx.shape_inference.infer_shapes(bare)  # a value_info for every value, as dynamo writes
    assert len(declared.graph.value_info) == sum(len(n.output) for n in bare.graph.node) - len(bare.graph.output)
    bare_path, declared_path = save(bare, tmp_path / "bare.onnx"), save(declared, tmp_path / "declared.onnx")
    inference_calls.clear()

    _, inferred = run_json([bare_path], "--dtype", "fp16", "--select", "ALL", out_dir=tmp_path)
    assert len(inference_calls) == 1  # the bare graph needs inference
    _, read = run_json([declared_path], "--dtype", "fp16", "--select", "ALL", out_dir=tmp_path)
    assert len(inference_calls) == 1  # the declared one does not

    def found(report):
        return sorted((r["rule_id"], r["node_name"], r["message"]) for r in report["results"])
    assert found(read) == found(inferred) and found(read)


def test_every_value_has_the_type_and_shape_inference_would_give(tmp_path, inference_calls):
    bare = _reduction_model()
    declared = onnx.shape_inference.infer_shapes(bare)
    inference_calls.clear()
    graph = load_graph(str(save(declared, tmp_path / "declared.onnx")))
    from_inference = load_graph(str(save(bare, tmp_path / "bare.onnx")))
    assert len(inference_calls) == 1

    def typed(g):
        return {v.name: (v.dtype, v.shape) for n in g.nodes for v in n.outputs}
    assert typed(graph) == typed(from_inference)


def test_a_graph_with_an_undeclared_value_is_still_inferred(tmp_path, inference_calls):
    declared = onnx.shape_inference.infer_shapes(decomposed_layernorm(1e-5)[0])
    del declared.graph.value_info[0]  # one value the file does not declare
    inference_calls.clear()
    load_graph(str(save(declared, tmp_path / "partly.onnx")))
    assert len(inference_calls) == 1


@pytest.mark.requires("torch", "onnxscript", "transformers")
def test_a_real_dynamo_export_is_read_from_its_declarations(tmp_path, inference_calls):
    """torch's dynamo exporter declares every value: its graph is read without inference, with the findings the
    same graph gives when inference has to type it (its value_info removed)."""
    import warnings

    import torch
    import transformers

    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=100)
    bert = transformers.BertModel(config).eval()

    class LastHiddenState(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids, mask):
            return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state

    ids, mask = torch.randint(0, 100, (2, 16)), torch.ones(2, 16, dtype=torch.long)
    path = tmp_path / "bert.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(LastHiddenState(), (ids, mask), str(path), dynamo=True, opset_version=18,
                          verbose=False)
    bare = onnx.load(str(path))
    del bare.graph.value_info[:]
    bare_path = tmp_path / "bare.onnx"
    onnx.save(bare, str(bare_path))
    inference_calls.clear()

    _, declared = run_json([path], "--dtype", "fp16", "--select", "ALL", out_dir=tmp_path)
    assert inference_calls == []
    _, inferred = run_json([bare_path], "--dtype", "fp16", "--select", "ALL", out_dir=tmp_path)
    assert len(inference_calls) == 1

    def found(report):
        return sorted((r["rule_id"], r["node_name"], r["message"]) for r in report["results"])
    assert found(declared) == found(inferred) and found(declared)
