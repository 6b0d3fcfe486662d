"""--format github: workflow-command annotations that GitHub shows on the pull request; the pre-commit hook."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from fixtures.onnx_builders import fused_norm, save
from precaudit.cli import main
from precaudit.report.github import escape_data, escape_property

UNDER = ("eps 1e-12 (attribute epsilon) rounds to 0.0 in float16: the guard against dividing by a zero statistic is gone"
         ". At node '/encoder/ln' (LayerNormalization) in encoder. Fix: Raise eps to at least 6.104e-05, the smallest "
         "normal float16, or keep this node in float32 (--keep-fp32 LayerNormalization; the same entry in your "
         "converter's op block list).")
SUB = ("eps 1e-05 (attribute epsilon) is subnormal in float16: stored as 1.0014e-05, and 0.0 wherever subnormals are "
       "flushed to zero. At node '/head/ln' (LayerNormalization) in head. Fix: Use eps >= 6.104e-05 (the smallest normal "
       "float16), or compute this node's statistics in float32 (stash_type=1, or --keep-fp32 LayerNormalization).")


@pytest.fixture
def repo(tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()
    (tmp_path / "models").mkdir()
    save(fused_norm("LayerNormalization", epsilon=1e-12, stash_type=0, name="/encoder/ln"), tmp_path / "models/under.onnx")
    save(fused_norm("LayerNormalization", epsilon=1e-5, stash_type=0, name="/head/ln"), tmp_path / "models/sub.onnx")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_github_annotations_golden(repo, capsys):
    assert main(["models/under.onnx", "models/sub.onnx", "--format", "github"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"::error file=models/under.onnx,line=1,title=PA101 eps-underflow::{UNDER}",
        f"::warning file=models/sub.onnx,line=1,title=PA102 eps-subnormal::{SUB}",
        "Found 2 findings in 2 models: 1 error, 1 warning, 0 info.",
    ]


def test_paths_are_relative_to_the_repository_root_from_a_subfolder(repo, monkeypatch, capsys):
    monkeypatch.chdir(repo / "models")
    main(["under.onnx", "--format", "github"])
    assert capsys.readouterr().out.startswith("::error file=models/under.onnx,line=1,title=PA101 eps-underflow::")


def test_info_is_a_notice(repo, capsys):
    (repo / "info.yaml").write_text("id: PA102\nseverity: info\n")
    assert main(["models/sub.onnx", "--format", "github", "--rules", "info.yaml"]) == 0
    assert capsys.readouterr().out.startswith("::notice file=models/sub.onnx,line=1,title=PA102 eps-subnormal::")


def test_commas_and_colons_in_a_file_name_are_escaped(repo, capsys):
    save(fused_norm("LayerNormalization", epsilon=1e-12, stash_type=0), repo / "models" / "a,b:c.onnx")
    main(["models/a,b:c.onnx", "--format", "github"])
    assert capsys.readouterr().out.startswith("::error file=models/a%2Cb%3Ac.onnx,line=1,title=PA101 eps-underflow::")


def test_the_runners_older_command_syntax_never_reaches_the_log(repo, capsys):
    """The runner acts on `##[command]` anywhere in a line of stdout or stderr that is no `::command` (an annotation,
    add-mask, set-output): a file named with it is written with \\x5b for its [ in every other line. An annotation
    is parsed as the ::command it is, so its file= stays the real path GitHub links."""
    save(fused_norm("LayerNormalization", epsilon=1e-12, stash_type=0), repo / "models" / "##[error]boom.onnx")
    (repo / "models" / "##[set-output name=x]y.onnx").write_bytes(b"garbage")
    assert main(["models/##[error]boom.onnx", "models/##[set-output name=x]y.onnx", "--format", "github"]) == 2
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("::error file=models/##[error]boom.onnx,line=1,title=PA101 eps-underflow::eps 1e-12 ")
    assert lines[1:] == ["::error file=models/##[set-output name=x]y.onnx,title=precaudit could not audit this "
                         "model::not a readable ONNX model (DecodeError: Error parsing message with type "
                         "'onnx.ModelProto': Wire format was corrupt)",
                         "Found 1 finding in 1 model (models/##\\x5berror]boom.onnx): 1 error, 0 warnings, 0 info; 1 "
                         "model could not be audited."]
    assert err.splitlines() == ["precaudit: models/##\\x5bset-output name=x]y.onnx: not a readable ONNX model "
                                "(DecodeError: Error parsing message with type 'onnx.ModelProto': Wire format was "
                                "corrupt)"]


def test_escaping_follows_githubs_rules():
    assert escape_data("100% sure\r\nnext: a, b") == "100%25 sure%0D%0Anext: a, b"
    assert escape_property("100% sure\r\nnext: a, b") == "100%25 sure%0D%0Anext%3A a%2C b"


def test_a_model_that_cannot_be_read_is_an_error_annotation_and_exit_2(repo, capsys):
    assert main(["models/missing.onnx", "--format", "github", "-o", "annotations.txt"]) == 2
    lines = (repo / "annotations.txt").read_text().splitlines()
    assert lines[0] == "::error file=models/missing.onnx,title=precaudit could not audit this model::no such file"


def test_pre_commit_hook_runs_precaudit_on_onnx_files():
    (hook,) = yaml.safe_load((Path(__file__).resolve().parent.parent / ".pre-commit-hooks.yaml").read_text())
    assert (hook["id"], hook["entry"], hook["language"]) == ("precaudit", "precaudit", "python")
    assert re.search(hook["files"], "models/bert.onnx") and not re.search(hook["files"], "models/bert.onnx.data")
