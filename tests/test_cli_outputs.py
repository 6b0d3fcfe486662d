"""Where -o writes: missing folders made (as Ruff, pytest and mkdocs make them), os.devnull taken as nowhere, and
still nothing over an input, through a symlink or over a folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from precaudit.errors import InputError
from precaudit.files import check_output, start_run, write_new


def _tree(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


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
        with pytest.raises(InputError, match="its folder does not exist, and a '..' after a missing folder"):
            check_output(tmp_path / "new" / ".." / "m.onnx", create=create)
    assert _tree(tmp_path) == ["m.onnx"]
