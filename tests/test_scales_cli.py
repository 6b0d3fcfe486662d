"""precaudit scales as a command: exit codes, the text/JSON/SARIF reports, names from the checkpoint escaped where
people read them, -o, and --manifest with -j and --resume."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np

from precaudit.checkpoint.command import scales_main
from tests.scales_checkpoints import codes, modelopt_nvfp4, named, write

SARIF_SCHEMA = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())


def checkpoint(folder: Path, nan: bool = False, name: str = "model.layers.0.mlp.up_proj") -> Path:
    parts = modelopt_nvfp4(16, 64)
    if nan:
        codes(parts["weight_scale"])[2, 1] = 0x7F
    return write(folder / "model.safetensors", named(name, parts))


def run(capsys, *args):
    code = scales_main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_exit_codes_clean_and_with_errors(tmp_path, capsys):
    assert run(capsys, checkpoint(tmp_path / "clean"))[0] == 0
    code, out, err = run(capsys, checkpoint(tmp_path / "nan", nan=True))
    assert code == 1 and err == ""
    assert "  error   SC101 scale-nonfinite  model.layers.0.mlp.up_proj.weight_scale  (model.safetensors)\n" in out
    assert out.endswith("  1 error, 0 warnings\n")


def test_json_report(tmp_path, capsys):
    code, out, _ = run(capsys, checkpoint(tmp_path, nan=True), "--format", "json")
    report = json.loads(out)
    assert code == 1 and report["summary"]["exit_code"] == 1 and report["summary"]["errors"] == 1
    scale = next(t for t in report["tensors"] if t["name"] == "model.layers.0.mlp.up_proj.weight_scale")
    assert {k: scale[k] for k in ("dtype", "read_as", "shape", "count", "nan", "zero", "first")} == {
        "dtype": "F8_E4M3", "read_as": "F8_E4M3", "shape": [16, 4], "count": 64, "nan": 1, "zero": 0,
        "first": {"nan": [2, 1]}}
    assert report["findings"][0]["id"] == "SC101" and report["findings"][0]["values"]["nan"] == 1
    assert report["layouts"][0]["layout"] == "modelopt-nvfp4"


def test_sarif_validates_and_locates_the_tensor(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".git").mkdir()
    checkpoint(tmp_path / "ckpt", nan=True)
    code, out, _ = run(capsys, "ckpt/model.safetensors", "--format", "sarif")
    log = json.loads(out)
    jsonschema.Draft7Validator(SARIF_SCHEMA).validate(log)
    result = log["runs"][0]["results"][0]
    assert code == 1 and result["ruleId"] == "SC101" and result["level"] == "error"
    location = result["locations"][0]
    assert location["physicalLocation"]["artifactLocation"] == {"uri": "ckpt/model.safetensors",
                                                                "uriBaseId": "%SRCROOT%"}
    assert location["logicalLocations"] == [{"name": "model.layers.0.mlp.up_proj.weight_scale", "kind": "variable"}]
    assert log["runs"][0]["invocations"][0]["exitCode"] == 1


def test_names_from_the_header_are_escaped_in_text_and_raw_in_json(tmp_path, capsys):
    name = "model.\x1b[2Jlayers\n0.up_proj"
    path = checkpoint(tmp_path, nan=True, name=name)
    _, text, _ = run(capsys, path)
    assert "\x1b" not in text and "model.\\x1b[2Jlayers\\n0.up_proj.weight_scale" in text
    _, out, _ = run(capsys, path, "--format", "json")
    assert json.loads(out)["findings"][0]["tensor"] == name + ".weight_scale"


def test_output_file_and_never_over_an_input(tmp_path, capsys):
    path = checkpoint(tmp_path, nan=True)
    before = path.read_bytes()
    code, out, err = run(capsys, path, "-f", "json", "-o", tmp_path / "report.json")
    assert code == 1 and out == "" and json.loads((tmp_path / "report.json").read_text())["summary"]["errors"] == 1
    code, out, err = run(capsys, path, "-o", path)
    assert code == 2 and err == (f"precaudit: {path}: refusing to write the report over one of the inputs\n")
    assert path.read_bytes() == before


def manifest(tmp_path: Path) -> Path:
    checkpoint(tmp_path / "clean")
    checkpoint(tmp_path / "broken", nan=True)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model.safetensors").write_bytes(b"\x01")
    listing = tmp_path / "checkpoints.txt"
    listing.write_text("# three checkpoints\nclean\nbroken/model.safetensors\n\nbad\nclean\n")
    return listing


def lines(path: Path) -> dict[str, dict]:
    return {r["checkpoint"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_manifest_one_line_per_checkpoint_with_jobs(tmp_path, capsys):
    results = tmp_path / "results.jsonl"
    code, out, err = run(capsys, "--manifest", manifest(tmp_path), "-j", "2", "-o", results)
    assert code == 2 and out == "" and err == "precaudit: scanned 3 checkpoints\n"
    records = lines(results)
    assert sorted(records) == ["bad", "broken/model.safetensors", "clean"]
    assert {k: r["exit_code"] for k, r in records.items()} == {"bad": 2, "broken/model.safetensors": 1, "clean": 0}
    assert records["bad"]["error"] == f"{tmp_path / 'bad' / 'model.safetensors'}: truncated header: the file has 1 " \
                                      "bytes, and a safetensors file starts with an 8-byte header length"
    assert records["broken/model.safetensors"]["findings"][0]["id"] == "SC101"


def test_manifest_resume_scans_only_what_is_not_done(tmp_path, capsys):
    listing = manifest(tmp_path)
    results = tmp_path / "results.jsonl"
    clean = json.dumps({"checkpoint": "clean", "exit_code": 0})
    results.write_text(clean + '\n{"checkpoint": "broken/model.saf')  # a run killed mid-line
    code, _, err = run(capsys, "--manifest", listing, "-o", results, "--resume")
    assert code == 2 and err == "precaudit: scanned 2 checkpoints, skipped 1 already in the results\n"
    text = results.read_text().splitlines()
    assert text[0] == clean and text[1] == '{"checkpoint": "broken/model.saf'
    assert sorted(lines_of(text[2:])) == ["bad", "broken/model.safetensors"]
    code, _, err = run(capsys, "--manifest", listing, "-o", results, "--resume")
    assert code == 2 and err == "precaudit: scanned 0 checkpoints, skipped 3 already in the results\n"
    assert len(results.read_text().splitlines()) == 4


def lines_of(text: list[str]) -> list[str]:
    return [json.loads(line)["checkpoint"] for line in text]


def test_manifest_refuses_an_existing_results_file_without_resume(tmp_path, capsys):
    results = tmp_path / "results.jsonl"
    results.write_text('{"checkpoint": "clean", "exit_code": 0}\n')
    code, _, err = run(capsys, "--manifest", manifest(tmp_path), "-o", results)
    assert code == 2 and err == f"precaudit: {results}: exists: pass --resume to continue it, or name a new file\n"


def test_manifest_never_appends_to_a_checkpoint(tmp_path, capsys):
    listing = manifest(tmp_path)
    shard = tmp_path / "clean" / "model.safetensors"
    before = shard.read_bytes()
    code, _, err = run(capsys, "--manifest", listing, "-o", shard, "--resume")
    assert code == 2 and err == f"precaudit: {shard}: refusing to write the results file over one of the inputs\n"
    assert shard.read_bytes() == before


def test_manifest_to_stdout(tmp_path, capsys):
    code, out, _ = run(capsys, "--manifest", manifest(tmp_path), "-j", "1")
    assert code == 2 and lines_of(out.splitlines()) == ["clean", "broken/model.safetensors", "bad"]


def test_a_clean_manifest_exits_0(tmp_path, capsys):
    checkpoint(tmp_path / "a")
    (tmp_path / "list.txt").write_text("a\n")
    assert run(capsys, "--manifest", tmp_path / "list.txt")[0] == 0


def test_float_scales_print_as_plain_json(tmp_path, capsys):
    parts = modelopt_nvfp4(16, 64)
    parts["input_scale"] = np.array(np.inf, dtype=np.float32)
    path = write(tmp_path / "m.safetensors", named("x", parts))
    _, out, _ = run(capsys, path, "--format", "json")
    assert '"max": null' in out and "Infinity" not in out and json.loads(out)["summary"]["errors"] == 1


def test_python_api(tmp_path):
    import pytest

    from precaudit import InputError, api

    report = api.scales(checkpoint(tmp_path, nan=True))
    assert report.exit_code == 1 and not report.ok and [f.rule for f in report.errors] == ["SC101"]
    assert json.loads(report.to_json())["summary"]["errors"] == 1 and "SC101" in report.to_text()
    with pytest.raises(InputError, match=r"^checkpoint: must be a path \(str or os.PathLike\), got 3$"):
        api.scales(3)
    with pytest.raises(InputError, match="truncated header"):
        (tmp_path / "bad.safetensors").write_bytes(b"")
        api.scales(tmp_path / "bad.safetensors")


def test_precaudit_scales_is_a_command_of_precaudit(tmp_path, capsys):
    from precaudit.cli import main

    assert main(["scales", str(tmp_path / "missing.safetensors")]) == 2
    assert capsys.readouterr().err.splitlines() == [f"precaudit: {tmp_path / 'missing.safetensors'}: no such file or "
                                                    "folder"]
