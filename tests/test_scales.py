"""precaudit scales, layout by layout: each checkpoint built in code with NaN, inf, zero and subnormal scales
planted at known places gives those exact counts, their first positions and findings; its clean twin gives none.
And the scan reads the headers and the scale tensors only, never a weight byte."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from precaudit.checkpoint import header as header_module
from precaudit.checkpoint import scan
from precaudit.checkpoint import scanner as scan_module
from tests.scales_checkpoints import (
    codes,
    compressed_nvfp4,
    compressed_w4a16,
    gpt_oss_mxfp4,
    modelopt_fp8,
    modelopt_nvfp4,
    named,
    torchao_mxfp8,
    write,
)

NVFP4_CONFIG = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ["lm_head"]}
CT_NVFP4_CONFIG = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "ignore": ["lm_head"],
                   "config_groups": {"group_0": {
                       "targets": ["Linear"],
                       "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16},
                       "input_activations": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                             "group_size": 16, "dynamic": "local"}}}}
W4A16_CONFIG = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
    "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}}


def stats(report, name):
    return next(t for t in report.tensors if t.tensor.name == name)


def counts(report, name):
    c = stats(report, name).counts
    return {"count": c.count, "nan": c.nan, "inf": c.inf, "zero": c.zero, "subnormal": c.subnormal,
            "negative": c.negative}


def ids(report):
    return sorted((f.rule, f.severity, f.tensor) for f in report.findings)


def modelopt_nvfp4_checkpoint(folder, broken: bool):
    down = modelopt_nvfp4(32, 128, seed=1)
    if broken:
        c = codes(down["weight_scale"])
        c[3, 2], c[5, 7] = 0x7F, 0xFF  # E4M3 NaN (and its negative twin): ModelOpt #1397's NaN scale byte
        c[1, 1] = c[6, 3] = 0x00       # zero
        c[2, 0] = 0x01                 # 2^-9, E4M3's smallest subnormal
        c[4, 4] = 0xB8                 # -1.0
    tensors = {**named("model.layers.0.self_attn.q_proj", modelopt_nvfp4(64, 64)),
               **named("model.layers.0.mlp.down_proj", down),
               "lm_head.weight": np.ones((8, 64), dtype=ml_dtypes.bfloat16)}
    return write(folder / "model.safetensors", tensors, config=NVFP4_CONFIG)


def test_modelopt_nvfp4_counts_every_planted_scale_exactly(tmp_path):
    report = scan(modelopt_nvfp4_checkpoint(tmp_path, broken=True))
    name = "model.layers.0.mlp.down_proj.weight_scale"
    assert counts(report, name) == {"count": 256, "nan": 2, "inf": 0, "zero": 2, "subnormal": 1, "negative": 1}
    assert stats(report, name).counts.first == {"nan": 3 * 8 + 2, "zero": 1 * 8 + 1, "subnormal": 2 * 8,
                                                "negative": 4 * 8 + 4}
    assert ids(report) == [("SC101", "error", name), ("SC102", "error", name), ("SC103", "warning", name),
                           ("SC104", "warning", name)]
    nan = next(f for f in report.findings if f.rule == "SC101")
    assert nan.message.startswith("2 NaN of 256 block scales (F8_E4M3), the first at [3, 2]")
    assert report.layouts == [{"layout": "modelopt-nvfp4", "family": "nvfp4", "weights": 2,
                               "evidence": "weight U8 + weight_scale + weight_scale_2"}]
    assert report.exit_code == 1


def test_modelopt_nvfp4_clean_twin(tmp_path):
    report = scan(modelopt_nvfp4_checkpoint(tmp_path, broken=False))
    assert report.findings == [] and report.exit_code == 0
    assert counts(report, "model.layers.0.mlp.down_proj.weight_scale") == {
        "count": 256, "nan": 0, "inf": 0, "zero": 0, "subnormal": 0, "negative": 0}
    assert sorted(t.tensor.name for t in report.tensors) == sorted(
        f"model.layers.0.{m}.{leaf}" for m in ("self_attn.q_proj", "mlp.down_proj")
        for leaf in ("weight_scale", "weight_scale_2", "input_scale"))


def compressed_nvfp4_checkpoint(folder, broken: bool):
    gate = compressed_nvfp4(32, 64, seed=2)
    if broken:
        codes(gate["weight_scale"])[0, 3] = 0x7F
        gate["input_global_scale"][0] = np.inf
    tensors = {**named("model.layers.0.mlp.gate_proj", gate),
               **named("model.layers.0.mlp.up_proj", compressed_nvfp4(32, 64, seed=3))}
    return write(folder / "model.safetensors", tensors, config=CT_NVFP4_CONFIG)


def test_compressed_tensors_nvfp4_nan_block_scale_and_inf_activation_scale(tmp_path):
    report = scan(compressed_nvfp4_checkpoint(tmp_path, broken=True))
    block, activation = "model.layers.0.mlp.gate_proj.weight_scale", "model.layers.0.mlp.gate_proj.input_global_scale"
    assert counts(report, block) == {"count": 128, "nan": 1, "inf": 0, "zero": 0, "subnormal": 0, "negative": 0}
    assert counts(report, activation) == {"count": 1, "nan": 0, "inf": 1, "zero": 0, "subnormal": 0, "negative": 0}
    assert ids(report) == sorted([("SC101", "error", block), ("SC101", "error", activation)])
    assert [e["layout"] for e in report.layouts] == ["compressed-tensors-nvfp4"]


def test_compressed_tensors_nvfp4_clean_twin(tmp_path):
    report = scan(compressed_nvfp4_checkpoint(tmp_path, broken=False))
    assert report.findings == [] and report.exit_code == 0 and len(report.tensors) == 6


def w4a16_checkpoint(folder, broken: bool):
    """compressed-tensors #832: NaN and inf float16 weight_scale in a saved GPTQ W4A16 checkpoint."""
    down = compressed_w4a16(16, 512, seed=4)
    if broken:
        down["weight_scale"][2, 1] = np.nan
        down["weight_scale"][7, 3] = np.nan
        down["weight_scale"][9, 0] = -np.inf
        down["weight_scale"][11, 2] = np.float16(3e-6)  # below 2^-14: float16 subnormal
    return write(folder / "model.safetensors", named("model.layers.3.mlp.down_proj", down), config=W4A16_CONFIG)


def test_compressed_tensors_w4a16_nan_and_inf_group_scales(tmp_path):
    report = scan(w4a16_checkpoint(tmp_path, broken=True))
    name = "model.layers.3.mlp.down_proj.weight_scale"
    assert counts(report, name) == {"count": 64, "nan": 2, "inf": 1, "zero": 0, "subnormal": 1, "negative": 0}
    assert stats(report, name).counts.first == {"nan": 2 * 4 + 1, "inf": 9 * 4, "subnormal": 11 * 4 + 2}
    assert ids(report) == [("SC101", "error", name), ("SC104", "warning", name)]
    assert report.findings[0].message.startswith("2 NaN and 1 inf of 64 block scales (F16), the first at [2, 1]")


def test_compressed_tensors_w4a16_clean_twin(tmp_path):
    report = scan(w4a16_checkpoint(tmp_path, broken=False))
    assert report.findings == [] and [e["layout"] for e in report.layouts] == ["compressed-tensors-int"]


def fp8_checkpoint(folder, broken: bool):
    o_proj = modelopt_fp8(32, 32, seed=5)
    if broken:
        o_proj["weight_scale"] = np.array(0.0, dtype=np.float32)
    tensors = {**named("model.layers.0.self_attn.o_proj", o_proj),
               **named("model.layers.0.self_attn.v_proj", modelopt_fp8(32, 32, seed=6))}
    return write(folder / "model.safetensors", tensors, config={"quant_method": "modelopt", "quant_algo": "FP8"})


def test_modelopt_fp8_zero_per_tensor_scale_is_an_error(tmp_path):
    report = scan(fp8_checkpoint(tmp_path, broken=True))
    name = "model.layers.0.self_attn.o_proj.weight_scale"
    assert counts(report, name) == {"count": 1, "nan": 0, "inf": 0, "zero": 1, "subnormal": 0, "negative": 0}
    assert ids(report) == [("SC103", "error", name)]
    assert report.findings[0].message == ("1 zero of 1 weight scales (F32): everything it scales is 0, or inf "
                                          "where a loader divides by it")
    assert [e["layout"] for e in report.layouts] == ["modelopt-fp8"]


def test_modelopt_fp8_clean_twin(tmp_path):
    assert scan(fp8_checkpoint(tmp_path, broken=False)).findings == []


def mxfp4_checkpoint(folder, broken: bool):
    experts = gpt_oss_mxfp4(2, 8, 64, seed=7)
    if broken:
        experts["scales"][1, 3, 0] = 0xFF  # E8M0 NaN
        experts["scales"][0, 0, 1] = 0xFF
        experts["scales"][0, 5, 0] = 0x00  # 2^-127: a shift-based decoder reads 0
    tensors = {"model.layers.0.mlp.experts.gate_up_proj_blocks": experts["blocks"],
               "model.layers.0.mlp.experts.gate_up_proj_scales": experts["scales"]}
    return write(folder / "model.safetensors", tensors,
                 config={"quant_method": "mxfp4", "modules_to_not_convert": ["self_attn", "router", "lm_head"]})


def test_transformers_mxfp4_e8m0_nan_and_code_zero(tmp_path):
    report = scan(mxfp4_checkpoint(tmp_path, broken=True))
    name = "model.layers.0.mlp.experts.gate_up_proj_scales"
    assert counts(report, name) == {"count": 32, "nan": 2, "inf": 0, "zero": 0, "subnormal": 1, "negative": 0}
    assert stats(report, name).counts.first == {"nan": 1, "subnormal": 10}
    assert ids(report) == [("SC101", "error", name), ("SC104", "warning", name)]
    assert "E8M0 code 0 is 2^-127" in report.findings[1].message
    assert report.layouts[0]["layout"] == "mxfp4" and report.layouts[0]["weights"] == 1


def test_transformers_mxfp4_clean_twin(tmp_path):
    report = scan(mxfp4_checkpoint(tmp_path, broken=False))
    assert report.findings == [] and stats(report, "model.layers.0.mlp.experts.gate_up_proj_scales").decode == "F8_E8M0"


def torchao_checkpoint(folder, broken: bool):
    tensors, metadata = torchao_mxfp8("0", 16, 64, seed=8)
    if broken:
        codes(tensors["0._weight_scale"])[3, 1] = 0xFF
    return write(folder / "model.safetensors", tensors, metadata=metadata)


def test_torchao_mx_tensor_from_its_metadata(tmp_path):
    report = scan(torchao_checkpoint(tmp_path, broken=True))
    assert counts(report, "0._weight_scale") == {"count": 32, "nan": 1, "inf": 0, "zero": 0, "subnormal": 0,
                                                 "negative": 0}
    assert ids(report) == [("SC101", "error", "0._weight_scale")]
    assert report.layouts == [{"layout": "torchao-MXTensor", "family": "mxfp8", "weights": 1,
                               "evidence": "__metadata__ MXTensor (qdata, scale)"}]


def test_torchao_clean_twin(tmp_path):
    assert scan(torchao_checkpoint(tmp_path, broken=False)).findings == []


@pytest.mark.requires("safetensors.numpy")
def test_a_checkpoint_the_safetensors_library_wrote_is_read(tmp_path):
    """The real writer, not ours: compressed-tensors MXFP4 in U8 tensors (the library's numpy side has no F8)."""
    import safetensors.numpy as safetensors_numpy
    scale = np.full((8, 2), 127, dtype=np.uint8)
    scale[4, 1] = 0xFF
    safetensors_numpy.save_file({"model.layers.0.mlp.up_proj.weight_packed": np.zeros((8, 32), dtype=np.uint8),
                                 "model.layers.0.mlp.up_proj.weight_scale": scale}, str(tmp_path / "m.safetensors"))
    report = scan(tmp_path / "m.safetensors")
    assert counts(report, "model.layers.0.mlp.up_proj.weight_scale")["nan"] == 1
    assert [e["layout"] for e in report.layouts] == ["compressed-tensors-mxfp4"] and report.exit_code == 1


@pytest.mark.requires("safetensors")
def test_the_library_reads_what_the_tests_write(tmp_path):
    import safetensors
    path = modelopt_nvfp4_checkpoint(tmp_path, broken=True)
    with safetensors.safe_open(str(path), "np") as f:
        assert len(set(f.keys())) == 9
        assert f.get_tensor("model.layers.0.mlp.down_proj.weight_scale_2") == np.float32(0.0021)


class Recorder:
    """Every (offset, length) read from any file the scan opens."""

    def __init__(self, monkeypatch):
        self.reads: list[tuple[str, int, int]] = []
        recorder = self

        def recording(open_regular):
            def open_and_record(path, shown=None):
                fh = open_regular(path, shown)
                return _Recording(fh, str(path), recorder.reads)
            return open_and_record

        monkeypatch.setattr(header_module, "open_regular", recording(header_module.open_regular))
        monkeypatch.setattr(scan_module, "open_regular", recording(scan_module.open_regular))


class _Recording:
    def __init__(self, fh, path, reads):
        self._fh, self._path, self._reads = fh, path, reads

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()

    def __getattr__(self, name):
        return getattr(self._fh, name)

    def read(self, n=-1):
        at = self._fh.tell()
        data = self._fh.read(n)
        self._reads.append((self._path, at, len(data)))
        return data

    def readinto(self, buffer):
        at = self._fh.tell()
        n = self._fh.readinto(buffer)
        self._reads.append((self._path, at, n))
        return n


def test_only_the_header_and_the_scale_tensors_are_read(tmp_path, monkeypatch):
    path = modelopt_nvfp4_checkpoint(tmp_path, broken=True)
    header_length = int.from_bytes(path.read_bytes()[:8], "little")
    entries = json.loads(path.read_bytes()[8:8 + header_length])
    scales = {name: (8 + header_length + e["data_offsets"][0], 8 + header_length + e["data_offsets"][1])
              for name, e in entries.items() if "scale" in name}
    recorder = Recorder(monkeypatch)
    report = scan(path)
    allowed: list[list[int]] = []  # the header and the scale tensors, back-to-back ones merged (read in one read)
    for lo, hi in sorted([(0, 8 + header_length), *scales.values()]):
        if allowed and allowed[-1][1] == lo:
            allowed[-1][1] = hi
        else:
            allowed.append([lo, hi])
    for file, at, n in recorder.reads:
        assert file == str(path) and any(lo <= at and at + n <= hi for lo, hi in allowed), (at, n)
    read = sum(n for _, _, n in recorder.reads)
    assert read == report.bytes_read == 8 + header_length + sum(hi - lo for lo, hi in scales.values())
    assert report.bytes_total == path.stat().st_size


FORMATS = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2, "F8_E8M0": ml_dtypes.float8_e8m0fnu,
           "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F32": np.float32, "F64": np.float64}


@pytest.mark.parametrize("dtype", FORMATS)
def test_counts_match_numpy_across_chunks_and_reads(tmp_path, dtype):
    """Every kind counted exactly, with its first position, where the tensor spans many reads and many chunks and
    the anomalies sit in late chunks only (the early ones take the fast path of clean chunks)."""
    from precaudit.checkpoint.header import read_header
    from precaudit.checkpoint.values import count_values

    numpy_type = FORMATS[dtype]
    rng = np.random.default_rng(11)
    values = rng.uniform(0.5, 100.0, size=1_500_001).astype(np.float32)
    planted = {"nan": [1_200_003, 1_400_000], "inf": [1_300_000], "zero": [1_100_000, 1_100_001],
               "subnormal": [1_250_000], "negative": [1_499_999]}
    values[planted["nan"]] = np.nan
    values[planted["inf"]] = np.inf
    values[planted["zero"]] = 0.0
    values[planted["negative"]] = -3.0
    array = values.astype(numpy_type)
    if dtype == "F8_E8M0":  # no zero, inf or negative: those became NaN or rounded; code 0 is the subnormal
        array.view(np.uint8)[planted["subnormal"]] = 0
    else:
        array[planted["subnormal"]] = ml_dtypes.finfo(numpy_type).smallest_subnormal
    path = write(tmp_path / "t.safetensors", {"s": array})
    tensor = read_header(str(path)).tensors["s"]
    with open(path, "rb") as fh:
        got = count_values(fh, tensor, dtype, bytearray(64 << 10))
    as64 = array.astype(np.float64)
    finite = np.isfinite(as64)
    tiny = 2.0 ** -126 if dtype == "F8_E8M0" else float(ml_dtypes.finfo(numpy_type).smallest_normal)
    masks = {"nan": np.isnan(as64), "inf": np.isinf(as64), "zero": as64 == 0,
             "subnormal": finite & (as64 != 0) & (np.abs(as64) < tiny), "negative": finite & (as64 < 0)}
    assert got.count == array.size
    assert {k: getattr(got, k) for k in masks} == {k: int(m.sum()) for k, m in masks.items()}
    assert got.first == {k: int(np.argmax(m)) for k, m in masks.items() if m.any()}
    assert got.min == as64[finite & (as64 > 0)].min() and got.max == as64[finite].max()
    assert got.nan >= 2 and got.subnormal == 1
