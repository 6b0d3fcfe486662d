"""precaudit scales' checks beyond the counts: global scales on the wrong side of their convention, shapes that do
not fit their weight, dtypes loaders do not read, modules claimed twice, config and tensors that disagree, and
scales missing (per expert too). Each with a near-twin that does not fire."""

from __future__ import annotations

import numpy as np

from precaudit.checkpoint import scan
from tests.scales_checkpoints import block_scales, compressed_nvfp4, modelopt_fp8, modelopt_nvfp4, named, write

NVFP4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}


def found(report, rule=None):
    return [(f.rule, f.severity, f.tensor) for f in report.findings if rule is None or f.rule == rule]


def one(report, rule):
    matching = [f for f in report.findings if f.rule == rule]
    assert len(matching) == 1, report.to_text()
    return matching[0]


# ---- SC201: the global scale's convention ---------------------------------------------------------------------

def test_modelopt_weight_scale_2_stored_as_the_reciprocal(tmp_path):
    """TensorRT-LLM #17726: ModelOpt stores amax/(6*448); this one holds (6*448)/amax, for amax 2."""
    parts = modelopt_nvfp4(16, 64)
    parts["weight_scale_2"] = np.array(1344.0, dtype=np.float32)
    report = scan(write(tmp_path / "m.safetensors", named("model.layers.0.mlp.up_proj", parts), config=NVFP4))
    f = one(report, "SC201")
    assert (f.severity, f.tensor) == ("error", "model.layers.0.mlp.up_proj.weight_scale_2")
    assert f.message == ("weight_scale_2 = 1344 >= 1: modelopt-nvfp4 stores amax/(6*448), under 1 for any |w|max "
                         "below 2688; read as (6*448)/amax (compressed-tensors' convention) it gives |w|max = 2")
    assert f.values == {"value": 1344.0, "convention": "amax/(6*448)"}
    assert report.exit_code == 1


def test_an_uncalibrated_weight_scale_2_of_one_is_named_so(tmp_path):
    parts = modelopt_nvfp4(16, 64)
    parts["weight_scale_2"] = np.array(1.0, dtype=np.float32)
    report = scan(write(tmp_path / "m.safetensors", named("model.layers.0.mlp.up_proj", parts), config=NVFP4))
    assert one(report, "SC201").message.endswith("1.0 is also what an export writes when nothing was calibrated")


def test_compressed_tensors_global_scale_stored_the_modelopt_way(tmp_path):
    parts = compressed_nvfp4(16, 64)
    parts["weight_global_scale"] = np.array([0.00075], dtype=np.float32)  # amax 2 / 2688
    parts["input_global_scale"] = np.array([0.5], dtype=np.float32)      # |x|max 5376: possible, so a warning
    report = scan(write(tmp_path / "m.safetensors", named("model.layers.0.mlp.up_proj", parts)))
    assert found(report, "SC201") == [("SC201", "error", "model.layers.0.mlp.up_proj.weight_global_scale"),
                                      ("SC201", "warning", "model.layers.0.mlp.up_proj.input_global_scale")]
    weight = report.findings[0]
    assert "read as amax/(6*448) (ModelOpt's convention) it gives |w|max = 2.016" in weight.message


def test_global_scales_on_their_side_do_not_fire(tmp_path):
    tensors = {**named("a", modelopt_nvfp4(16, 64)), **named("b", compressed_nvfp4(16, 64))}
    report = scan(write(tmp_path / "m.safetensors", tensors))
    assert report.findings == []
    assert sorted(e["layout"] for e in report.layouts) == ["compressed-tensors-nvfp4", "modelopt-nvfp4"]


# ---- SC301: shapes ------------------------------------------------------------------------------------------------

def test_block_scale_computed_from_the_packed_weight(tmp_path):
    """Model-Optimizer #2038: weight_scale [2048, 64] for [2048, 128], from the packed columns; here 16 rows."""
    parts = modelopt_nvfp4(16, 2048)
    parts["weight_scale"] = block_scales(16, 64)
    report = scan(write(tmp_path / "m.safetensors", named("model.layers.0.mlp.down_proj", parts), config=NVFP4))
    f = one(report, "SC301")
    assert f.tensor == "model.layers.0.mlp.down_proj.weight_scale" and f.severity == "error"
    assert f.values == {"shape": [16, 64], "expected": [16, 128], "weight_shape": [16, 1024]}
    assert f.message == ("shape [16, 64] for weight 'model.layers.0.mlp.down_proj.weight' [16, 1024] (U8): "
                         "in_features = 2048 (FP4, two a byte: 1024 x 2), so a block of 16 needs ceil(2048/16) = "
                         "128 scale columns; 64 columns is what the packed width 1024 gives: the scale was computed "
                         "from the packed data")


def test_block_scale_with_a_ragged_last_block_fits(tmp_path):
    """in_features 40 (20 bytes): ceil(40/16) = 3 columns, the last block partly padding."""
    parts = modelopt_nvfp4(16, 32)
    parts["weight"] = np.zeros((16, 20), dtype=np.uint8)
    parts["weight_scale"] = block_scales(16, 3)
    assert scan(write(tmp_path / "m.safetensors", named("x", parts))).findings == []


def test_fp8_scale_of_no_granularity(tmp_path):
    parts = modelopt_fp8(256, 256)
    parts["weight_scale"] = np.full((3, 3), 0.001, dtype=np.float32)
    report = scan(write(tmp_path / "m.safetensors", named("x", parts)))
    assert one(report, "SC301").message.endswith("it matches no FP8 granularity: per tensor [1], per channel "
                                                 "[256, 1], or 128x128 blocks [2, 2]")
    parts["weight_scale"] = np.full((2, 2), 0.001, dtype=np.float32)
    assert scan(write(tmp_path / "twin.safetensors", named("x", parts))).findings == []


def test_gptq_group_scales_against_weight_shape(tmp_path):
    config = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 64}}}}
    tensors = {"m.weight_packed": np.zeros((8, 32), dtype=np.int32),  # 256 int4 columns
               "m.weight_scale": np.full((8, 2), 0.01, dtype=np.float16),
               "m.weight_shape": np.array([8, 256], dtype=np.int64)}
    f = one(scan(write(tmp_path / "a" / "m.safetensors", tensors, config=config)), "SC301")
    assert f.values["expected"] == [8, 4]
    tensors["m.weight_scale"] = np.full((8, 4), 0.01, dtype=np.float16)
    assert scan(write(tmp_path / "b" / "m.safetensors", tensors, config=config)).findings == []


# ---- SC302: dtypes ------------------------------------------------------------------------------------------------

def test_nvfp4_block_scale_stored_as_float32(tmp_path):
    parts = modelopt_nvfp4(16, 64)
    parts["weight_scale"] = np.full((16, 4), 3.0, dtype=np.float32)
    f = one(scan(write(tmp_path / "m.safetensors", named("x", parts))), "SC302")
    assert f.message == ("modelopt-nvfp4 block scale stored as F32; its loaders read F8_E4M3 or U8")


# ---- SC501: missing scales ----------------------------------------------------------------------------------------

def moe(tmp_path, without_input: tuple[int, ...] = (), bare: tuple[int, ...] = (), config=NVFP4):
    tensors = {}
    for e in range(4):
        parts = modelopt_nvfp4(16, 64, seed=e, input_scale=e not in without_input)
        if e in bare:
            parts = {"weight": parts["weight"]}
        tensors.update(named(f"model.layers.1.mlp.experts.{e}.down_proj", parts))
    return scan(write(tmp_path / "m.safetensors", tensors, config=config))


def test_an_expert_never_calibrated_has_no_input_scale(tmp_path):
    """vLLM #45212: an expert calibration never routed to has no input_scale; a loader makes it 0, 1/0 = inf."""
    report = moe(tmp_path, without_input=(2,))
    f = one(report, "SC501")
    assert f.tensor == "model.layers.1.mlp.experts.2.down_proj.weight"
    assert f.message == ("modelopt-nvfp4 weight 'model.layers.1.mlp.experts.2.down_proj.weight' has no input_scale, "
                         "and the config's quant_algo NVFP4 quantizes its activations with a calibrated scale: a "
                         "loader fills it with 0 (1/0 = inf) or a NaN sentinel")
    assert report.exit_code == 1


def test_the_missing_input_scale_is_found_from_the_siblings_without_a_config(tmp_path):
    f = one(moe(tmp_path, without_input=(2,), config=None), "SC501")
    assert f.message.endswith("which 3 of 4 model.layers.*.mlp.experts.*.down_proj have: a loader fills it with 0 "
                              "(1/0 = inf) or a NaN sentinel, and only the prompts routed there fail")
    assert f.values == {"missing": "input_scale", "having": 3, "of": 4}


def test_an_expert_stored_without_any_scale(tmp_path):
    report = moe(tmp_path, bare=(3,), config=None)
    assert sorted(f.values["missing"] for f in report.findings if f.rule == "SC501") == [
        "input_scale", "weight_scale", "weight_scale_2"]
    assert {f.tensor for f in report.findings} == {"model.layers.1.mlp.experts.3.down_proj.weight"}


def test_experts_all_with_their_scales(tmp_path):
    assert moe(tmp_path).findings == []


def test_a_w4a16_config_expects_no_input_scale(tmp_path):
    config = {"quant_method": "modelopt", "quant_algo": "W4A16_NVFP4"}
    assert moe(tmp_path, without_input=(0, 1, 2, 3), config=config).findings == []


# ---- SC401 / SC402: the config ----------------------------------------------------------------------------------

def ct_config(groups: dict, ignore=()):
    return {"quant_method": "compressed-tensors", "ignore": list(ignore), "config_groups": groups}


FP4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}
FP8 = {"num_bits": 8, "type": "float", "strategy": "tensor"}


def ct_checkpoint(tmp_path, config):
    tensors = {**named("model.layers.0.mlp.down_proj", compressed_nvfp4(16, 64)),
               **named("model.layers.0.mlp.up_proj", compressed_nvfp4(16, 64, seed=1))}
    return scan(write(tmp_path / "m.safetensors", tensors, config=config))


def test_two_groups_claim_one_module_with_different_schemes(tmp_path):
    report = ct_checkpoint(tmp_path, ct_config({
        "group_0": {"targets": ["re:.*mlp\\.down_proj$"], "weights": FP4},
        "group_1": {"targets": ["re:.*layers\\.0\\..*"], "weights": FP8}}))
    f = one(report, "SC401")
    assert (f.severity, f.tensor) == ("error", "model.layers.0.mlp.down_proj.weight_packed")
    assert f.message == ("'model.layers.0.mlp.down_proj' is claimed by 2 quantization groups at one precedence: "
                         "group_0 (nvfp4, group_size 16); group_1 (fp8, group_size None); the scheme a loader "
                         "applies depends on their order")
    assert found(report, "SC402") == [("SC402", "error", "model.layers.0.mlp.up_proj.weight_packed")]


def test_an_exact_name_outranks_a_class_target(tmp_path):
    """compressed-tensors' precedence: a module named exactly takes that group; no second claim."""
    report = ct_checkpoint(tmp_path, ct_config({
        "group_0": {"targets": ["Linear"], "weights": FP4},
        "group_1": {"targets": ["model.layers.0.mlp.down_proj"], "weights": FP4}}))
    assert report.findings == []


def test_two_groups_with_one_scheme_is_a_warning(tmp_path):
    report = ct_checkpoint(tmp_path, ct_config({"a": {"targets": ["Linear"], "weights": FP4},
                                                "b": {"targets": ["Linear"], "weights": FP4}}))
    assert found(report) == [("SC401", "warning", "model.layers.0.mlp.down_proj.weight_packed"),
                             ("SC401", "warning", "model.layers.0.mlp.up_proj.weight_packed")]
    assert report.exit_code == 0


def test_an_ignored_module_stored_quantized(tmp_path):
    report = ct_checkpoint(tmp_path, ct_config({"g": {"targets": ["Linear"], "weights": FP4}},
                                               ignore=["re:.*up_proj$"]))
    f = one(report, "SC401")
    assert f.message == ("'model.layers.0.mlp.up_proj' is stored as compressed-tensors-nvfp4, claimed by group 'g' "
                         "and by the config's ignore entry 're:.*up_proj$': a loader builds it unquantized and its "
                         "tensors do not fit")


def test_a_regex_that_can_backtrack_for_hours_is_skipped_with_a_note(tmp_path):
    report = ct_checkpoint(tmp_path, ct_config({"g": {"targets": ["Linear"], "weights": FP4}},
                                               ignore=["re:(a+)+$"]))
    assert report.findings == []
    assert report.notes == ["target 're:(a+)+$' skipped: a repeated group that repeats or alternates inside can "
                            "backtrack for hours"]


def test_config_gives_another_format(tmp_path):
    report = ct_checkpoint(tmp_path, ct_config({"g": {"targets": ["Linear"], "weights": FP8}}))
    assert [f.message for f in report.findings if f.tensor.startswith("model.layers.0.mlp.down_proj")] == [
        "the config gives 'model.layers.0.mlp.down_proj' fp8 (group 'g'), but its tensors are nvfp4 "
        "(weight_packed U8 + weight_scale + weight_global_scale)"]


def test_modelopt_int4_awq_is_not_taken_for_nvfp4(tmp_path):
    """A U8 weight with float16 group scales under quant_algo W4A16_AWQ: int4, two a byte; a NaN smoothing factor
    is counted like a scale."""
    config = {"quant_method": "modelopt", "quant_algo": "W4A16_AWQ", "group_size": 128}
    tensors = {"m.weight": np.zeros((8, 128), dtype=np.uint8), "m.weight_scale": np.full((8, 2), 0.01, np.float16),
               "m.pre_quant_scale": np.ones(256, dtype=np.float16)}
    tensors["m.pre_quant_scale"][17] = np.nan
    report = scan(write(tmp_path / "m.safetensors", tensors, config=config))
    assert [(e["layout"], e["family"]) for e in report.layouts] == [("int4", "int4")]
    assert found(report) == [("SC101", "error", "m.pre_quant_scale")]
    assert report.findings[0].message.startswith("1 NaN of 256 smoothing factors (F16), the first at [17]")
    tensors["m.weight_scale"] = np.full((8, 1), 0.01, np.float16)
    report = scan(write(tmp_path / "twin" / "m.safetensors", tensors, config=config))
    assert one(report, "SC301").values == {"shape": [8, 1], "expected": [8, 2], "weight_shape": [8, 128]}
