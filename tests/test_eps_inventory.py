"""The eps inventory: every eps and floor with its value where it is used, per converter and runtime, and the diff
of two exports."""

from __future__ import annotations

import pytest

from fixtures.onnx_builders import decomposed_layernorm, fused_norm, save
from precaudit.config import load_settings
from precaudit.context import Audit
from precaudit.eps_inventory import diff_inventories, eps_inventory


def inventory(path, **given):
    return eps_inventory(Audit.of(load_settings(given, config=None)), str(path))[1]


@pytest.mark.parametrize("given, value, dtype, state, converted", [
    ({}, 0.0, "float16", "zero", None),
    ({"converter": "onnxconverter-common"}, 1.1920928955078125e-07, "float16", "subnormal", 1e-07),
    ({"runtime": "ort-cpu"}, 0.0, "float32", "zero", None),
    ({"dtype": "bf16"}, 9.998e-13, "bfloat16", "normal", None)])
def test_each_eps_with_its_value_where_it_is_used(tmp_path, given, value, dtype, state, converted):
    """BERT's 1e-12 in a decomposed LayerNorm: 0.0 in float16; onnxconverter-common clamps it to 1e-7 first (a
    float16 subnormal); onnxruntime CPU computes in float32 but reads the 0.0 the conversion stored."""
    path = save(decomposed_layernorm(1e-12, dtype="fp32")[0], tmp_path / "ln.onnx")
    [entry] = inventory(path, **given)
    assert (entry.node, entry.kind, entry.placement) == ("add_eps", "LayerNorm", "inside_sqrt")
    assert entry.written == pytest.approx(1e-12, rel=1e-7)  # (the float32 initializer's 1e-12)
    assert (entry.value, entry.dtype, entry.state, entry.converted) == (pytest.approx(value, rel=1e-3), dtype, state,
                                                                        converted)


def test_the_diff_of_two_exports_names_what_changed(tmp_path):
    old = save(decomposed_layernorm(1e-12, dtype="fp32")[0], tmp_path / "old.onnx")
    new = save(decomposed_layernorm(1e-5, dtype="fp32")[0], tmp_path / "new.onnx")
    fused = save(fused_norm("LayerNormalization", dtype="fp32", epsilon=1e-12), tmp_path / "fused.onnx")
    [change] = diff_inventories(inventory(old), inventory(new))
    assert (change["change"], change["node"], change["old"]["state"], change["new"]["state"]) == \
        ("changed", "add_eps", "zero", "subnormal")
    gone_new = diff_inventories(inventory(old), inventory(fused))
    assert [(c["change"], c["node"], c["op"]) for c in gone_new] == [("gone", "add_eps", "Add"),
                                                                    ("new", "norm", "LayerNormalization")]
    assert diff_inventories(inventory(old), inventory(old)) == []
