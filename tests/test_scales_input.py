"""precaudit scales on bad input: one line naming the file and the problem, exit 2, no traceback, and nothing read
beyond what the header proves is there."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from precaudit.checkpoint.command import scales_main
from tests.scales_checkpoints import header_and_data, modelopt_nvfp4, named, raw_file, write
from tests.test_scales import Recorder

GOOD = named("model.layers.0.mlp.up_proj", modelopt_nvfp4(16, 64))


def refused(capsys, *args: str) -> str:
    """The one stderr line of a run that exits 2 and writes nothing to stdout."""
    code = scales_main([*args])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.rstrip("\n")


def with_header(tmp_path, edit, name="m.safetensors"):
    """A checkpoint whose header JSON is edit(header) over GOOD's data."""
    header, data = header_and_data(GOOD)
    return raw_file(tmp_path / name, json.dumps(edit(header)), data)


def test_a_truncated_header(tmp_path, capsys):
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"\x10\x00\x00")
    assert refused(capsys, str(path)) == (f"precaudit: {path}: truncated header: the file has 3 bytes, and a "
                                          "safetensors file starts with an 8-byte header length")


def test_a_header_length_beyond_the_file(tmp_path, capsys, monkeypatch):
    header, data = header_and_data(GOOD)
    text = json.dumps(header)
    path = raw_file(tmp_path / "m.safetensors", text, data, length=len(text) + len(data) + 1)
    recorder = Recorder(monkeypatch)
    assert refused(capsys, str(path)) == (f"precaudit: {path}: header length {len(text) + len(data) + 1:,} bytes "
                                          f"runs past the end of the file ({path.stat().st_size:,} bytes)")
    assert [(at, n) for _, at, n in recorder.reads] == [(0, 8)]  # the length field, not one byte more


def test_a_header_length_over_the_bound_is_not_read(tmp_path, capsys, monkeypatch):
    path = tmp_path / "m.safetensors"
    with open(path, "wb") as fh:  # a sparse 200 MB file that would hold the claimed header
        fh.write((150_000_000).to_bytes(8, "little"))
        fh.truncate(200_000_000)
    recorder = Recorder(monkeypatch)
    assert refused(capsys, str(path)) == (f"precaudit: {path}: header length 150,000,000 bytes is over the "
                                          "100,000,000-byte limit safetensors itself sets")
    assert sum(n for _, _, n in recorder.reads) == 8


def test_overlapping_offsets(tmp_path, capsys, monkeypatch):
    def overlap(header):
        header["model.layers.0.mlp.up_proj.input_scale"]["data_offsets"] = [0, 4]  # inside the weight
        return header
    path = with_header(tmp_path, overlap)
    recorder = Recorder(monkeypatch)
    assert refused(capsys, str(path)) == (f"precaudit: {path}: tensors 'model.layers.0.mlp.up_proj.input_scale' "
                                          "and 'model.layers.0.mlp.up_proj.weight' overlap: data bytes [0, 4) and "
                                          "[0, 512)")
    header_length = int.from_bytes(path.read_bytes()[:8], "little")
    assert sum(n for _, _, n in recorder.reads) == 8 + header_length


def test_out_of_range_offsets(tmp_path, capsys):
    def past(header):
        end = header["model.layers.0.mlp.up_proj.input_scale"]["data_offsets"][1]
        header["model.layers.0.mlp.up_proj.input_scale"]["data_offsets"] = [end + 4, end + 8]
        return header
    path = with_header(tmp_path, past)
    line = refused(capsys, str(path))
    assert line == (f"precaudit: {path}: tensor 'model.layers.0.mlp.up_proj.input_scale': data_offsets [588, 592] "
                    "run past the end of the data (584 bytes after the header)")


def test_offsets_that_disagree_with_the_shape(tmp_path, capsys):
    def wrong(header):
        header["model.layers.0.mlp.up_proj.weight_scale_2"]["shape"] = [2]
        return header
    path = with_header(tmp_path, wrong)
    assert refused(capsys, str(path)).endswith("tensor 'model.layers.0.mlp.up_proj.weight_scale_2': shape [2] of F32 "
                                               "is 8 bytes, but its data_offsets [576, 580] span 4")


def test_an_unknown_dtype(tmp_path, capsys):
    def unknown(header):
        header["model.layers.0.mlp.up_proj.weight_scale"]["dtype"] = "F8_E4M3FN"
        return header
    line = refused(capsys, str(with_header(tmp_path, unknown)))
    assert "tensor 'model.layers.0.mlp.up_proj.weight_scale' has the unknown dtype 'F8_E4M3FN' (safetensors knows " \
           "BOOL, F4," in line


def test_a_duplicate_tensor_name(tmp_path, capsys):
    """The safetensors library keeps the second entry silently; a NaN scale under the first would never show."""
    entry = '{"dtype":"F32","shape":[],"data_offsets":[0,4]}'
    path = raw_file(tmp_path / "m.safetensors", f'{{"x.input_scale":{entry},"x.input_scale":{entry}}}',
                    np.float32(np.nan).tobytes())
    assert refused(capsys, str(path)) == (f"precaudit: {path}: the header gives the name 'x.input_scale' twice (a "
                                          "reader keeps one of them silently)")


@pytest.mark.parametrize("text, problem", [
    ('{"a": ', "the header is not valid JSON: Expecting value at character 6"),
    ("[1, 2]", "the header is not a JSON object of tensors"),
    ('{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "b": NaN}', "the header is not valid JSON: NaN "
                                                                                "is not JSON"),
    ('{"__metadata__": {"a": 1}}', "the header's __metadata__ is not an object of strings"),
    ('{"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}',
     "tensor 'a': shape [-1] is not a list of non-negative integers"),
    ('{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}',
     "tensor 'a': data_offsets [4, 0] are not [begin, end] with 0 <= begin <= end"),
    (b'{"\xff": 1}', "the header is not UTF-8 (byte 0xff at 2)"),
    ("[" * 100_000 + "]" * 100_000, "the header is JSON nested too deeply to read"),
])
def test_broken_header_json(tmp_path, capsys, text, problem):
    path = raw_file(tmp_path / "m.safetensors", text, b"\0" * 4)
    assert refused(capsys, str(path)) == f"precaudit: {path}: {problem}"


def shards(tmp_path, weight_map=None):
    """Two shards and their index; weight_map overrides the index's map."""
    first = named("model.layers.0.mlp.up_proj", modelopt_nvfp4(16, 64))
    second = named("model.layers.1.mlp.up_proj", modelopt_nvfp4(16, 64, seed=1))
    write(tmp_path / "model-00001-of-00002.safetensors", first)
    write(tmp_path / "model-00002-of-00002.safetensors", second)
    mapping = {**{n: "model-00001-of-00002.safetensors" for n in first},
               **{n: "model-00002-of-00002.safetensors" for n in second}}
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map(mapping) if weight_map else mapping}))
    return index


def test_an_index_and_its_folder_scan_the_same_shards(tmp_path, capsys):
    index = shards(tmp_path)
    for target in (index, tmp_path):
        assert scales_main([str(target), "--format", "json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert [os.path.basename(f["path"]) for f in report["files"]] == ["model-00001-of-00002.safetensors",
                                                                           "model-00002-of-00002.safetensors"]
        assert report["summary"]["scale_tensors"] == 6 and report["index"] == str(index)


def test_a_shard_missing_from_an_index(tmp_path, capsys):
    index = shards(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    assert refused(capsys, str(index)) == (f"precaudit: {index}: names the shard 'model-00002-of-00002.safetensors', "
                                           f"and {tmp_path / 'model-00002-of-00002.safetensors'} does not exist")
    assert refused(capsys, str(tmp_path)) == refused(capsys, str(index))


def test_an_index_naming_a_shard_outside_its_folder(tmp_path, capsys):
    index = shards(tmp_path, lambda m: {**m, "x.weight": "../elsewhere.safetensors"})
    assert refused(capsys, str(index)) == (f"precaudit: {index}: names the shard '../elsewhere.safetensors', which is "
                                           "not a file name in the index's folder")


def test_an_index_placing_a_tensor_in_a_shard_without_it(tmp_path, capsys):
    index = shards(tmp_path, lambda m: {**m, "model.layers.9.mlp.up_proj.weight": "model-00001-of-00002.safetensors"})
    assert refused(capsys, str(index)) == (f"precaudit: {tmp_path / 'model-00001-of-00002.safetensors'}: the index "
                                           "places tensor 'model.layers.9.mlp.up_proj.weight' in this shard, but its "
                                           "header has no such tensor")


def test_one_tensor_in_two_shards_of_a_folder(tmp_path, capsys):
    write(tmp_path / "a.safetensors", GOOD)
    write(tmp_path / "b.safetensors", {"model.layers.0.mlp.up_proj.input_scale": np.float32(1.0).reshape(())})
    assert refused(capsys, str(tmp_path)) == (f"precaudit: {tmp_path / 'b.safetensors'}: tensor "
                                              "'model.layers.0.mlp.up_proj.input_scale' is also in "
                                              f"{tmp_path / 'a.safetensors'}: a loader keeps one of the two silently")


def test_not_a_checkpoint(tmp_path, capsys):
    assert refused(capsys, str(tmp_path / "nope")) == f"precaudit: {tmp_path / 'nope'}: no such file or folder"
    assert refused(capsys, str(tmp_path)) == f"precaudit: {tmp_path}: holds no .safetensors file and no index"
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    assert refused(capsys, str(fifo)) == (f"precaudit: {fifo}: is a FIFO (named pipe), not a regular file; "
                                          "precaudit reads only regular files")


def test_a_broken_config_json(tmp_path, capsys):
    path = write(tmp_path / "m.safetensors", GOOD)
    (tmp_path / "config.json").write_text('{"quantization_config": {"quant_method": "modelopt", "quant_method": 1}}')
    assert refused(capsys, str(path)) == (f"precaudit: {tmp_path / 'config.json'}: config.json gives the name "
                                          "'quant_method' twice (a reader keeps one of them silently)")


def test_usage_errors_are_one_line(capsys):
    assert refused(capsys) == ("precaudit: scales: no checkpoint given: precaudit scales CHECKPOINT (or --manifest "
                               "FILE)")
    line = refused(capsys, "x", "--format", "html")  # argparse's own words vary with the Python version
    assert line.startswith("precaudit: scales: argument --format/-f: invalid choice: 'html'")
    assert line.endswith("(precaudit scales --help shows the usage)")


def test_well_formed_headers_of_any_shape_and_dtype_end_in_a_report_or_one_error(tmp_path):
    """A fixed-seed fuzz of what a header can hold once it is well formed: scales of any dtype and shape, leaves
    added and dropped, torchao metadata with zero block sizes, configs with hostile regexes and odd group sizes.
    Every scan renders in every format or raises InputError; nothing else escapes."""
    import math
    import random

    import ml_dtypes

    from precaudit import InputError
    from precaudit.checkpoint import scan
    from precaudit.checkpoint.header import BITS
    from tests.scales_checkpoints import compressed_nvfp4, compressed_w4a16, gpt_oss_mxfp4, torchao_mxfp8

    tensors, metadata = torchao_mxfp8("0", 16, 64)
    mx = gpt_oss_mxfp4(2, 4, 64)
    tensors.update({**GOOD, **named("a", compressed_nvfp4(16, 64)), **named("b", compressed_w4a16(8, 256)),
                    "g.up_blocks": mx["blocks"], "g.up_scales": mx["scales"],
                    "h.weight": np.zeros((4, 8), ml_dtypes.float8_e4m3fn), "h.weight_scale_inv": np.ones((1, 1))})
    header, _ = header_and_data(tensors, metadata)
    configs = [{"quant_method": "compressed-tensors", "ignore": ["re:.*up.*", "b"], "config_groups": {
                   "g": {"targets": ["re:(x+)+y", "Linear"], "weights": {"num_bits": 4, "type": "float",
                                                                        "group_size": 16}},
                   "h": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", "group_size": True}}}},
               {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 7, "exclude_modules": ["a*"]},
               {"quant_method": "fp8", "weight_block_size": [3, 0]}, None]
    torchao = [json.dumps({"_type": "Float8Tensor", "_data": {"block_size": [0, 5]},
                           "_tensor_data_names": ["qdata", "scale"]}),
               json.dumps({"_type": "NVFP4Tensor", "_data": {"block_size": 0}, "_tensor_data_names": ["qdata", "s"]})]
    rng = random.Random(36)
    for case in range(60):
        edited = json.loads(json.dumps(header))
        names = [k for k in edited if k != "__metadata__"]
        for _ in range(rng.randint(1, 4)):
            name, roll = rng.choice(names), rng.random()
            if roll < 0.35:
                edited[name]["dtype"] = rng.choice([d for d in BITS if BITS[d] % 8 == 0])
            elif roll < 0.7:
                edited[name]["shape"] = [rng.choice([0, 1, 2, 3, 16, 17, 32]) for _ in range(rng.randint(0, 4))]
            elif roll < 0.9:
                leaf = rng.choice(["weight_scale", "weight_scale_2", "input_scale", "weight_packed", "weight_shape"])
                edited[name.rsplit(".", 1)[0] + "." + leaf] = dict(edited[name])
            else:
                edited["__metadata__"]["0.weight"] = rng.choice(torchao)
        offset = 0
        for key, entry in edited.items():
            if key != "__metadata__":
                size = math.prod(entry["shape"]) * BITS[entry["dtype"]] // 8
                entry["data_offsets"], offset = [offset, offset + size], offset + size
        folder = tmp_path / str(case)
        folder.mkdir()
        data = np.random.default_rng(case).integers(0, 256, size=offset, dtype=np.uint8).tobytes()
        raw_file(folder / "m.safetensors", json.dumps(edited), data)
        config = rng.choice(configs)
        if config is not None:
            (folder / "config.json").write_text(json.dumps({"quantization_config": config}))
        try:
            report = scan(folder / "m.safetensors")
        except InputError:
            continue
        assert report.to_text() and json.loads(report.to_json()) and json.loads(report.to_sarif())
