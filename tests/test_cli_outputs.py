"""Where -o writes: missing folders made (as Ruff, pytest and mkdocs make them), os.devnull taken as nowhere, and
still nothing over an input, through a symlink or over a folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

import onnx
import pytest

from fixtures.onnx_builders import fused_norm, save
from precaudit.cli import main
from precaudit.errors import InputError
from precaudit.files import check_output, start_run, write_new


@pytest.fixture
def model(tmp_path, monkeypatch):
    """A float32 LayerNorm whose statistics run in float16 (stash_type=0): eps 1e-12 rounds to 0 there (PA101)."""
    monkeypatch.chdir(tmp_path)
    return save(fused_norm("LayerNormalization", "fp32", epsilon=1e-12, stash_type=0, name="ln"), tmp_path / "m.onnx")


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _tree(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


@pytest.mark.parametrize("command,code", [("check", 1), ("keep-list", 0), ("baseline", 0), ("fix", 3)])
def test_output_into_missing_folders_makes_them(model, tmp_path, capsys, command, code):
    target = Path("reports/today/out.onnx" if command == "fix" else "reports/today/out.json")
    args = {"check": [str(model), "-f", "json", "-o", str(target)],
            "keep-list": ["keep-list", str(model), "--for", "onnxruntime", "-f", "json", "-o", str(target)],
            "baseline": [str(model), "--write-baseline", str(target)],
            "fix": ["fix", str(model), "-o", str(target)]}[command]
    assert main(args) == code
    capsys.readouterr()
    assert _tree(tmp_path) == ["m.onnx", "reports", "reports/today", f"reports/today/{target.name}"]
    if command == "fix":  # the fixed model: its statistics in float32 now
        ln = onnx.load(str(target)).graph.node[0]
        assert [a.i for a in ln.attribute if a.name == "stash_type"] == [1]
    elif command == "baseline":
        assert [e["rule_id"] for e in json.loads(target.read_text())["findings"]] == ["PA101"]
    elif command == "check":
        assert [r["rule_id"] for r in json.loads(target.read_text())["results"]] == ["PA101"]
    else:
        assert [n["name"] for n in json.loads(target.read_text())["nodes"]] == ["ln"]


@pytest.mark.parametrize("command", ["check", "keep-list", "baseline"])
def test_output_to_devnull_writes_nothing_anywhere(model, tmp_path, capsys, command):
    before = (_tree(tmp_path), sorted(os.listdir(os.path.dirname(os.devnull))))
    args = {"check": [str(model), "-o", os.devnull],
            "keep-list": ["keep-list", str(model), "--for", "onnxruntime", "-o", os.devnull],
            "baseline": [str(model), "--write-baseline", os.devnull, "-o", os.devnull]}[command]
    assert main(args) == (1 if command == "check" else 0)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("precaudit: wrote 1 finding to the baseline /dev/null\n" if command == "baseline" else "")
    assert (_tree(tmp_path), sorted(os.listdir(os.path.dirname(os.devnull)))) == before


def test_fix_to_devnull_says_why_and_writes_nothing(model, tmp_path, capsys):
    assert main(["fix", str(model), "-o", os.devnull]) == 2
    assert _one_line(capsys) == ("precaudit: /dev/null: fix checks the model it writes in the folder of -o before "
                                 "keeping it; for the plan alone, use --dry-run without -o\n")
    assert _tree(tmp_path) == ["m.onnx"]


def test_a_link_to_devnull_is_still_a_symlink(model, tmp_path, capsys):
    Path("null").symlink_to(os.devnull)
    assert main([str(model), "-o", "null"]) == 2
    assert _one_line(capsys) == ("precaudit: null: is a symlink: precaudit writes no output through one (it could "
                                 "point at an input)\n")


@pytest.mark.parametrize("target,says", [
    ("new/../m.onnx", "new/../m.onnx: its folder does not exist, and a '..' after a missing folder is refused (it "
                      "would resolve elsewhere once the folder is made)"),
    ("m.onnx/sub/out.json", "m.onnx/sub/out.json: its folder does not exist"),  # a file where a folder would go
    ("new/", "new/: names a folder, not a file"),
    ("made", "made: is a directory: precaudit writes outputs over regular files only"),
    ("./m.onnx", "./m.onnx: refusing to write the report over one of the inputs ({model})"),
])
def test_refusals_make_no_folder_and_touch_no_input(model, tmp_path, capsys, target, says):
    Path("made").mkdir()
    same = model.read_bytes()
    assert main([str(model), "-o", target]) == 2
    assert _one_line(capsys) == f"precaudit: {says.format(model=model)}\n"
    assert _tree(tmp_path) == ["m.onnx", "made"] and model.read_bytes() == same


def test_the_early_check_makes_no_folder_and_the_write_does(tmp_path):
    start_run()
    assert check_output(tmp_path / "a" / "b" / "r.txt") == tmp_path / "a" / "b" / "r.txt"
    assert _tree(tmp_path) == []
    write_new(tmp_path / "a" / "b" / "r.txt", "report\n")
    assert _tree(tmp_path) == ["a", "a/b", "a/b/r.txt"] and (tmp_path / "a/b/r.txt").read_text() == "report\n"


def test_devnull_is_an_output_only_where_the_caller_writes_nothing_to_it(tmp_path):
    """write_new takes it (and writes no temporary file beside it); a caller that writes beside its output, as fix
    does, still gets the refusal it always had."""
    before = sorted(os.listdir(os.path.dirname(os.devnull)))
    write_new(os.devnull, "report\n")
    assert sorted(os.listdir(os.path.dirname(os.devnull))) == before
    with pytest.raises(InputError, match="is a device: precaudit writes outputs over regular files only"):
        check_output(os.devnull)


def test_a_missing_folder_and_then_dotdot_makes_nothing(tmp_path):
    (tmp_path / "m.onnx").write_text("model")
    for create in (False, True):
        with pytest.raises(InputError, match=r"its folder does not exist, and a '\.\.' after a missing folder"):
            check_output(tmp_path / "new" / ".." / "m.onnx", create=create)
    assert _tree(tmp_path) == ["m.onnx"]


def test_a_missing_folder_under_a_symlinked_one_is_made_in_its_target(model, tmp_path):
    """The folders that exist are resolved as the OS resolves them; only what is missing below is made."""
    Path("real").mkdir()
    Path("link").symlink_to("real")
    assert main([str(model), "-o", "link/new/r.txt"]) == 1
    assert _tree(tmp_path / "real") == ["new", "new/r.txt"]
