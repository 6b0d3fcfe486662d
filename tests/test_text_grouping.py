"""The text report folds alike findings into one block; --no-group and --format concise list each one."""

from __future__ import annotations

import pytest

from precaudit.cli import main
from precaudit.report.folding import fold_names, fold_set, fold_texts, shape_of
from tests.helpers import run_json
from tests.report_models import t5_like

HEAD_102 = ("  warning PA102 eps-subnormal  ×48  nodes '/encoder/block.{0..23}/layer.{0,1}/layer_norm/Add' (Add) "
            "in encoder.block.{0..23}.layer.{0,1}.layer_norm")


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    return t5_like(tmp_path_factory.mktemp("t5") / "t5.onnx")


def test_a_24_layer_t5_prints_one_block_per_rule(t5, capsys):
    assert main([str(t5), "--dtype", "fp16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index(HEAD_102)
    assert lines[start + 1:start + 4] == [
        "          eps 1e-06 (initializer 'eps') is subnormal in float16: stored as 1.0133e-06, and 0.0 wherever "
        "subnormals are flushed to zero",
        "          why float16: --dtype fp16: float32 tensors run as float16",
        "          fix: Use eps >= 6.104e-05 (the smallest normal float16), or compute this node's statistics in "
        "float32 (stash_type=1, or --keep-fp32 /encoder/block.{0..23}/layer.{0,1}/layer_norm/*).",
    ]
    # the final norm's fix names another block, so it is a block of its own; PA208's fix names none: one block
    heads = [line for line in lines if line.startswith("  warning")]
    assert heads == [
        HEAD_102,
        "  warning PA208 statistic-overflow  ×49  nodes '/encoder/block.{0..23}/layer.{0,1}/layer_norm/Add', "
        "'/encoder/final_layer_norm/Add' (Add) in encoder.block.{0..23}.layer.{0,1}.layer_norm, "
        "encoder.final_layer_norm",
        "  warning PA102 eps-subnormal  node '/encoder/final_layer_norm/Add' (Add) in encoder.final_layer_norm",
    ]
    assert lines[-2:] == [f"Found 98 findings in 1 model ({t5}): 0 errors, 98 warnings, 0 info.",
                          "98 findings shown in 3 blocks of alike findings; --no-group or --format concise lists "
                          "each one."]


def test_no_group_prints_every_finding(t5, capsys):
    assert main([str(t5), "--no-group"]) == 0
    out = capsys.readouterr().out
    assert out.count("PA102 eps-subnormal  node '") == 49
    assert "  warning PA102 eps-subnormal  node '/encoder/block.7/layer.1/layer_norm/Add' (Add) in " \
           "encoder.block.7.layer.1.layer_norm\n" in out
    assert "×" not in out and "shown in" not in out


def test_concise_is_one_line_per_finding(t5, capsys):
    assert main([str(t5), "--format", "concise"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 98 + 1
    assert lines[0] == (f"{t5}:/encoder/block.0/layer.0/layer_norm/Add: PA102 [warning] eps 1e-06 (initializer 'eps') "
                        "is subnormal in float16: stored as 1.0133e-06, and 0.0 wherever subnormals are flushed to zero")
    assert lines[-1] == f"Found 98 findings in 1 model ({t5}): 0 errors, 98 warnings, 0 info."


def test_json_stays_one_result_per_node(t5, tmp_path):
    _, report = run_json([t5], out_dir=tmp_path)
    nodes = [r["node_name"] for r in report["results"] if r["rule_id"] == "PA102"]
    assert len(nodes) == len(set(nodes)) == 49


def test_a_block_kept_in_float32_leaves_a_gap_in_the_fold(t5, capsys):
    # block.1 and block.10-19 run in float32: no finding there, and the others fold around the gap
    assert main([str(t5), "--keep-fp32", "/encoder/block.1*", "--select", "PA102"]) == 0
    out = capsys.readouterr().out
    assert "×26  nodes '/encoder/block.{0,2..9,20..23}/layer.{0,1}/layer_norm/Add' (Add)" in out


def test_different_eps_are_different_blocks(tmp_path, capsys):
    a = t5_like(tmp_path / "a.onnx", blocks=3, eps=1e-6)
    assert main([str(a), "--select", "PA102"]) == 0
    assert "×6  nodes '/encoder/block.{0..2}/layer.{0,1}/layer_norm/Add'" in capsys.readouterr().out
    b = t5_like(tmp_path / "b.onnx", blocks=3, eps=1e-5, prefix="/decoder")
    assert main([str(a), str(b), "--select", "PA102"]) == 0
    out = capsys.readouterr().out
    assert out.count("×6") == 2 and "eps 1e-05" in out and "eps 1e-06" in out  # one block per model


def test_hostile_names_stay_escaped_when_folded(tmp_path, capsys):
    model = t5_like(tmp_path / "m.onnx", blocks=2, prefix="/enc\x1b[2J\n  error   PA000 FAKE")
    assert main([str(model), "--select", "PA102"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\n  error   PA000" not in out
    assert "/enc\\x1b[2J\\n  error   PA000 FAKE/block.{0,1}/layer.{0,1}/layer_norm/Add" in out


@pytest.mark.parametrize("values, folded", [
    ([str(i) for i in range(24)], "{0..23}"),
    (["0", "1"], "{0,1}"),
    (["3"], "3"),
    (["0", "1", "2", "3", "4", "5", "7", "9", "10", "11"], "{0..5,7,9..11}"),
    (["00", "01", "02", "07"], "{00..02,07}"),  # zero-padded to one width: a padded range
    (["1", "01"], "{1,01}"),  # mixed widths: listed as written
    ([str(i * 7) for i in range(20)], "{0,7,14,21,28,35,… 14 more}"),
])
def test_fold_set(values, folded):
    assert fold_set(values) == folded


def test_fold_names_is_exact():
    scopes = [f"encoder.block.{b}.layer.{k}.layer_norm" for b in range(24) for k in (0, 1)]
    assert fold_names(scopes) == ["encoder.block.{0..23}.layer.{0,1}.layer_norm"]
    # not every combination exists: two patterns, never one that claims l0.s1 and l1.s1 both
    assert fold_names(["l0.s0", "l0.s1", "l1.s0"]) == ["l{0,1}.s0", "l0.s1"]
    assert fold_names(["a", "a_1", "a_2"]) == ["a", "a_{1,2}"]
    assert fold_names(["12", "13", "14"]) == ["{12..14}"]  # a name that is all digits is an index, not a number
    assert fold_names([f"n{i}.x" if i % 2 else f"m{i}" for i in range(12)], limit=2) == \
        ["m{0,2,4,6,8,10}", "n{1,3,5,7,9,11}.x"]


def test_messages_keep_their_quantities_and_fold_their_names():
    texts = [f"Pow output '/block.{b}/sq' reaches |x| = {x} above the float16 max 65504 (stash_type=1)"
             for b, x in ((3, "7.1e+04"), (4, "2.5e+05"), (5, "9e+04"))]
    assert shape_of(texts[0]) == shape_of(texts[1])
    assert shape_of(texts[0], quantities=False) != shape_of(texts[1], quantities=False)
    assert fold_texts(texts) == ("Pow output '/block.{3..5}/sq' reaches |x| = 7.1e+04 to 2.5e+05 above the "
                                 "float16 max 65504 (stash_type=1)")
    # a value TorchScript named '17' is a name: its digits fold, they are no measured range
    assert fold_texts(["Add output '17' overflows", "Add output '18' overflows"]) == "Add output '{17,18}' overflows"
