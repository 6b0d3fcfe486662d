"""Issue 11, parts 3 and 4c end to end: counts of masks through deep graphs, and --check-weights (the flag, the
pyproject key, memory bounded by the largest tensor, a missing weight file)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from fixtures.onnx_builders import model, save
from fixtures.PA212_weight_overflow import projection
from precaudit.analysis.signs import is_mask_name
from precaudit.cli import main
from tests.helpers import run_cli_process, run_json


def test_mask_names():
    for name in ("attention_mask", "mask", "padding_mask", "src_key_padding_mask", "attentionMask", "mask.1",
                 "attention_masks", "Mask"):
        assert is_mask_name(name), name
    for name in ("masked_x", "input_ids", "token_type_ids", "maskless", "position_ids"):
        assert not is_mask_name(name), name


def test_a_count_20000_nodes_below_its_mask_is_found_without_recursion(tmp_path):
    """attention_mask → Cast → 20,000 × (Unsqueeze, Squeeze) → ReduceSum → Div: classed and traced to its input."""
    axes = h.make_tensor("axes", T.INT64, [1], [0])
    nodes = [h.make_node("Cast", ["attention_mask"], ["m0"], name="cast", to=T.FLOAT)]
    prev = "m0"
    for i in range(10_000):
        nodes += [h.make_node("Unsqueeze", [prev, "axes"], [f"u{i}"], name=f"u{i}"),
                  h.make_node("Squeeze", [f"u{i}", "axes"], [f"q{i}"], name=f"q{i}")]
        prev = f"q{i}"
    nodes += [h.make_node("ReduceSum", [prev, "axes1"], ["count"], name="count", keepdims=1),
              h.make_node("Div", ["x", "count"], ["y"], name="mean")]
    m = model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [2, 5]),
                      h.make_tensor_value_info("attention_mask", T.INT64, [2, 5])],
              [h.make_tensor_value_info("y", T.FLOAT, [2, 5])], [axes, h.make_tensor("axes1", T.INT64, [1], [1])])
    _code, report = run_json([save(m, tmp_path / "deep.onnx", check=False)], "--select", "PA304", out_dir=tmp_path)
    assert report["errors"] == []
    assert [(r["rule_id"], r["node_name"], r["values"]["divisor_mask"]) for r in report["results"]] == \
        [("PA304", "mean", "graph input 'attention_mask'")]


def test_check_weights_from_the_pyproject(tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()
    save(projection(70000.0), tmp_path / "model.onnx")
    monkeypatch.chdir(tmp_path)
    code, report = run_json(["model.onnx"], out_dir=tmp_path)
    assert code == 0 and report["results"] == [] and report["settings"]["check_weights"] is False
    (tmp_path / "pyproject.toml").write_text("[tool.precaudit]\ncheck-weights = true\n")
    code, report = run_json(["model.onnx"], out_dir=tmp_path)
    assert code == 1 and [r["rule_id"] for r in report["results"]] == ["PA212"]
    assert report["settings"]["check_weights"] is True
    code, report = run_json(["model.onnx", "--no-check-weights"], out_dir=tmp_path)
    assert code == 0 and report["results"] == []


def test_check_weights_must_be_a_boolean_in_the_pyproject(tmp_path, monkeypatch, capsys):
    (tmp_path / ".git").mkdir()
    save(projection(1.0), tmp_path / "model.onnx")
    (tmp_path / "pyproject.toml").write_text('[tool.precaudit]\ncheck-weights = "yes"\n')
    monkeypatch.chdir(tmp_path)
    assert main(["model.onnx"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "check-weights: must be true or false" in err[0]


def _external_model(folder, tensors: int, rows: int = 2048, cols: int = 4096):
    """x @ W0 + x @ W1 + ...: each W a float32 [rows, cols] in one external data file, one value 1e5."""
    nodes, inits, prev = [], [], None
    for i in range(tensors):
        w = np.full((rows, cols), 0.01, np.float32)
        w[0, i] = 1e5
        inits.append(numpy_helper.from_array(w, f"W{i}"))
        nodes.append(h.make_node("MatMul", ["x", f"W{i}"], [f"p{i}"], name=f"proj{i}"))
        if prev is not None:
            nodes.append(h.make_node("Add", [prev, f"p{i}"], [f"s{i}"], name=f"sum{i}"))
        prev = f"s{i}" if prev is not None else f"p{i}"
    nodes.append(h.make_node("Identity", [prev], ["y"], name="output"))
    m = model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, rows])],
              [h.make_tensor_value_info("y", T.FLOAT, [1, cols])], inits)
    path = folder / "big.onnx"
    onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="big.data",
              size_threshold=1024)
    return path


def test_check_weights_reads_one_tensor_at_a_time(tmp_path):
    """Six 32 MiB weights (192 MiB): checking them all costs a few times the largest one, not their sum."""
    path = _external_model(tmp_path, tensors=6)
    code, _, err, static = run_cli_process([path, "--select", "PA212"], tmp_path)
    assert code == 0, err
    code, out, err, checked = run_cli_process([path, "--select", "PA212", "--check-weights", "--no-group"], tmp_path)
    assert code == 1, err
    assert out.count("PA212 weight-overflow") == 6
    assert checked - static < 4 * 32, (static, checked)  # the loader holds a tensor up to three times while reading


def test_a_missing_weight_file_is_one_line_only_when_weights_are_read(tmp_path, capsys):
    path = _external_model(tmp_path, tensors=1, rows=32, cols=32)
    (tmp_path / "big.data").unlink()
    assert main([str(path)]) == 0  # a static audit never needs the weights
    capsys.readouterr()
    assert main([str(path), "--check-weights"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "W0" in err[0] and "Traceback" not in err[0], err


def test_a_tensor_every_layer_adds_before_its_softmax_is_read_once(tmp_path):
    """A folded position bias (not a 0-or-fill mask, more values than a scalar is looked for in) that three layers
    add to their scores: whether it is a mask fill is worked out once, not at each reader, and the weight checks
    then read it once more, for its numbers."""
    from precaudit.analysis.compute_dtype import DtypeResolver
    from precaudit.analysis.sites.constant import find_constant_sites
    from precaudit.analysis.sites.weight import find_weight_sites
    from precaudit.dtypes import FORMATS
    from precaudit.frontends.onnx import load_onnx

    nodes, x = [], "x"
    for k in range(3):
        nodes += [h.make_node("Add", [x, "bias"], [f"s{k}"], name=f"scores_{k}"),
                  h.make_node("Softmax", [f"s{k}"], [f"p{k}"], name=f"softmax_{k}", axis=-1)]
        x = f"p{k}"
    nodes.append(h.make_node("Identity", [x], ["y"], name="output"))
    bias = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32), "bias")
    path = save(model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [2, 16, 16])],
                      [h.make_tensor_value_info("y", T.FLOAT, [2, 16, 16])], [bias]), tmp_path / "bias.onnx")
    graph = load_onnx(str(path))
    [value] = [v for v in graph.nodes[0].inputs if v.name == "bias"]
    loader, reads = value.const_loader, []
    value.const_loader = lambda: reads.append(1) or loader()
    resolver = DtypeResolver(graph, FORMATS["fp16"])
    assert find_constant_sites(graph, resolver) == [] and len(reads) == 1
    assert [s.facts["name"] for s in find_weight_sites(graph, resolver)] == ["bias"] and len(reads) == 2


def _recorded(graph):
    """Every constant's loader wrapped to record the name of each tensor it reads."""
    reads: list[str] = []
    for node in graph.nodes:
        for value in node.inputs:
            if value is not None and value.is_const and not getattr(value.const_loader, "recorded", False):
                def counted(loader=value.const_loader, name=value.name):
                    reads.append(name)
                    return loader()
                counted.recorded = True
                value.const_loader = counted
    return reads


def test_the_static_audit_reads_a_norms_parameters_and_no_other_weight(tmp_path):
    """conv → BatchNormalization over 128 channels (more than the 64 values a scalar is looked for in): the static
    pass reads the norm's four per-channel vectors once each, never the convolution's weight; --check-weights reads
    that too."""
    from precaudit.audit_models import static_matches
    from precaudit.deployment import Deployment
    from precaudit.frontends.onnx import load_onnx
    from precaudit.rules.loader import load_rules

    c = 128
    var = np.ones(c, np.float32)
    var[5] = 1e8
    inits = [numpy_helper.from_array(np.full((c, c, 1, 1), 0.01, np.float32), "W"),
             numpy_helper.from_array(np.ones(c, np.float32), "scale"), numpy_helper.from_array(np.zeros(c, np.float32), "B"),
             numpy_helper.from_array(np.zeros(c, np.float32), "mean"), numpy_helper.from_array(var, "var")]
    nodes = [h.make_node("Conv", ["x", "W"], ["c"], name="conv"),
             h.make_node("BatchNormalization", ["c", "scale", "B", "mean", "var"], ["y"], name="bn", epsilon=1e-3)]
    path = save(model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, c, 4, 4])],
                      [h.make_tensor_value_info("y", T.FLOAT, [1, c, 4, 4])], inits), tmp_path / "conv_bn.onnx")
    rules = load_rules()
    for weights, expected in ((False, ["B", "mean", "scale", "var"]), (True, ["B", "W", "mean", "scale", "var"])):
        graph = load_onnx(str(path))
        reads = _recorded(graph)
        found = static_matches(graph, Deployment.named("fp16").resolver(graph), rules, str(path), weights=weights)
        assert [(m.finding.rule_id, m.finding.node_name, m.finding.values["overflow_count"]) for m in found] == \
            [("PA212", "bn", 1)]
        assert sorted(reads) == expected, weights


def test_a_converter_that_clamps_raises_tiny_weights_instead_of_flushing_them(tmp_path):
    """A LayerScale of 1e-8 (64 values): a plain cast makes every value 0; onnxruntime's converter raises them to
    5.96e-8 and onnxconverter-common to 1e-7, subnormal in float16 but not 0."""
    from fixtures.PA213_weight_underflow import layer_scale
    from precaudit.analysis.sites.weight import find_weight_sites
    from precaudit.deployment import Deployment
    from precaudit.frontends.onnx import load_onnx

    graph = load_onnx(str(save(layer_scale(1e-8), tmp_path / "scale.onnx")))
    counts = {}
    for converter in ("plain", "onnxruntime", "onnxconverter-common"):
        [site] = find_weight_sites(graph, Deployment.named("fp16", converter).resolver(graph))
        counts[converter] = [site.facts[k] for k in ("underflow_count", "lost_count", "raised_count",
                                                     "subnormal_fraction", "converted_by")]
    assert counts["plain"] == [64, 64, 0, 0.0, ""]
    assert counts["onnxruntime"] == [0, 0, 64, 1.0, "onnxruntime 1.32.0's float16 converter (max_finite_val=65504)"]
    assert counts["onnxconverter-common"] == [0, 0, 64, 1.0, "onnxconverter-common 1.16.0 (max_finite_val=1e4)"]


@pytest.mark.parametrize("op, tensor_name, shape", [("LayerNormalization", "scale", (2, 4, 128)),
                                                     ("BatchNormalization", "var", (2, 128, 4))])
def test_a_static_audit_of_a_graph_whose_weights_were_never_downloaded_still_runs(op, tensor_name, shape, tmp_path,
                                                                                   capsys):
    """The static pass reads a fused norm's parameters (128 channels) where they are there; a data file that is
    not (a graph fetched without its weights) is read by --check-weights and --trace, which need it, and by
    nothing else."""
    from fixtures.onnx_builders import fused_norm, save_with_external

    path = save_with_external(fused_norm(op, dtype="fp32", running_var=1.0, shape=shape), tmp_path / "norm.onnx",
                              tensor_name)
    (tmp_path / "norm.data").unlink()
    assert main([str(path)]) == 0 and capsys.readouterr().err == ""
    assert main([str(path), "--check-weights"]) == 2
    assert capsys.readouterr().err.endswith("external data file 'norm.data': no such file\n")
