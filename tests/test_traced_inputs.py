"""Traced-mode inputs: a bad --inputs file is one line and exit 2; synthesized inputs respect tables and --dim."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from fixtures.onnx_builders import chain_model, const, model, save
from precaudit.cli import main
from tests.helpers import run_json


@pytest.fixture
def rms(tmp_path):
    steps = [("Pow", ["x", "two"], "sq"), ("ReduceMean", ["sq"], "ms", {"axes": [-1]}), ("Sqrt", ["ms"], "rms")]
    return save(chain_model(steps, consts={"two": 2.0}), tmp_path / "model.onnx")


def _npz(tmp_path, **arrays) -> str:
    path = tmp_path / "in.npz"
    np.savez(path, **arrays)
    return str(path)


@pytest.mark.parametrize("make,problem", [
    (lambda t: str(t / "missing.npz"), "no such inputs file"),
    (lambda t: (t / "junk.npz").write_text("not a zip") and str(t / "junk.npz"), "not a readable .npz file"),
    (lambda t: _npz(t, y=np.ones((2, 8))), "no array for graph input 'x' (the file has: y; the model's inputs are: x)"),
    (lambda t: _npz(t, x=np.ones((2, 8)), z=np.ones(3)), "array 'z' matches no graph input"),
    (lambda t: _npz(t, x=np.ones((2, 8, 1))), "input 'x': array has shape (2, 8, 1), the model expects rank 2 ([2, 8])"),
    (lambda t: _npz(t, x=np.ones((2, 9))), "input 'x': dim 1 is 9, the model expects 8 ([2, 8])"),
    (lambda t: _npz(t, x=np.array([["a"] * 8] * 2)), "input 'x': array of <U1 where the model expects fp16"),
])
def test_bad_inputs_file_is_one_line_and_exit_2(rms, tmp_path, capsys, make, problem):
    npz = make(tmp_path)
    assert main([str(rms), "--trace", "--inputs", npz]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"precaudit: {npz}: ") and problem in err, err


def _embedding_model():
    """ids → Gather from a 50-row table → ReduceMean; a dynamic batch and sequence."""
    table = const("table", np.random.default_rng(0).standard_normal((50, 4)))
    nodes = [h.make_node("Gather", ["table", "ids"], ["emb"], name="embed"),
             h.make_node("Mul", ["emb", "big"], ["act"], name="act"),
             h.make_node("Mul", ["act", "act"], ["sq"], name="sq"),
             h.make_node("ReduceMean", ["sq"], ["y"], name="mean", axes=[-1])]
    ids = h.make_tensor_value_info("ids", T.INT64, ["batch", "sequence"])
    y = h.make_tensor_value_info("y", T.FLOAT, ["batch", "sequence", 1])
    return model(nodes, [ids], [y], [table, const("big", 1000.0)])


def test_synthesized_ids_stay_inside_the_embedding_table(tmp_path):
    path = save(_embedding_model(), tmp_path / "emb.onnx")
    code, report = run_json([path], "--trace", "--select", "PA901", "--dim", "sequence=5", "--samples", "3",
                            out_dir=tmp_path)
    assert report["errors"] == []
    (finding,) = report["results"]
    # act = table row × 1000 (|x| ~ 1e3): its square overflows float16; 1 × 5 positions × 4 features × 3 samples
    assert finding["node_name"] == "sq" and finding["values"]["elements"] == 60 and finding["values"]["samples"] == 3
    # synthesized inputs only: a warning that says so (exit 0), not an error
    assert code == 0 and finding["severity"] == "warning" and finding["message"].endswith(
        "[on synthesized inputs only: a warning until your own --inputs show it]")
    # the report says what the findings hold for: synthesized ids of shape (1, 5), three samples from seed 0
    (run,) = report["trace"]
    assert (run["model"], run["inputs"], run["seed"], run["samples"]) == (str(path), [], 0, 3)
    assert run["shapes"] == {"ids": [1, 5]}
    assert sum(run["nodes"].values()) == 4  # every node of the graph ran


def test_npz_inputs_are_used_as_given(tmp_path, rms):
    code, report = run_json([rms], "--trace", "--select", "PA901", "--inputs", _npz(tmp_path, x=np.full((2, 8), 10.0)),
                            out_dir=tmp_path)
    assert (code, report["results"], report["errors"]) == (0, [], [])
    (run,) = report["trace"]
    assert (run["inputs"], run["seed"], run["samples"], run["shapes"]) == ([str(tmp_path / "in.npz")], None, 1, {"x": [2, 8]})


def test_text_report_says_what_the_trace_ran_on(tmp_path, rms, capsys):
    assert main([str(rms), "--trace", "--seed", "7", "--samples", "2", "--trace-engine", "numpy"]) == 0
    out = capsys.readouterr().out
    assert f"traced {rms}: 2 synthesized samples (seed 7); x (2, 8); 4 nodes on numpy\n" in out


def test_too_large_synthesized_input_is_one_line(tmp_path, capsys):
    x = h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq"])
    y = h.make_tensor_value_info("y", T.FLOAT, ["batch", "seq"])
    m = model([h.make_node("Relu", ["x"], ["y"], name="relu")], [x], [y])
    path = save(m, tmp_path / "dyn.onnx")
    assert main([str(path), "--trace", "--dim", "seq=100000000000"]) == 2
    err = capsys.readouterr().err
    assert "input 'x' would have shape (1, 100000000000)" in err and "Traceback" not in err
    assert main([str(path), "--trace", "--seed", "-1"]) == 2


def test_unknown_dim_name_is_an_error(tmp_path, capsys):
    x = h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq"])
    y = h.make_tensor_value_info("y", T.FLOAT, ["batch", "seq"])
    path = save(model([h.make_node("Relu", ["x"], ["y"], name="relu")], [x], [y]), tmp_path / "dyn.onnx")
    assert main([str(path), "--trace", "--dim", "sequence=8"]) == 2
    assert "--dim sequence: no input has a dim of that name (symbolic dims: batch, seq)" in capsys.readouterr().err


def test_several_npz_files_are_several_batches(tmp_path, rms):
    """Two batches: only the second holds activations of 300, whose squares overflow float16."""
    quiet, loud = tmp_path / "quiet.npz", tmp_path / "loud.npz"
    np.savez(quiet, x=np.ones((2, 8), np.float32))
    np.savez(loud, x=np.full((2, 8), 300.0, np.float32))
    _code, report = run_json([rms], "--trace", "--select", "PA901", "--inputs", str(quiet), "--inputs", str(loud),
                            out_dir=tmp_path)
    (finding,) = report["results"]
    assert (finding["node_name"], finding["values"]["elements"], finding["values"]["samples"]) == ("sq", 32, 2)
    assert finding["values"]["overflow_fraction"] == 0.5  # all 16 values of the second batch, none of the first
    (run,) = report["trace"]
    assert (run["inputs"], run["samples"], run["seed"]) == ([str(quiet), str(loud)], 2, None)


def test_the_report_never_overwrites_an_inputs_file(tmp_path, rms, capsys):
    batch = _npz(tmp_path, x=np.ones((2, 8)))
    assert main([str(rms), "--trace", "--inputs", batch, "-o", batch]) == 2
    assert "refusing to write the report over one of the inputs" in capsys.readouterr().err
    assert np.load(batch)["x"].shape == (2, 8)  # still the user's file


# ---- inputs that mean something: masks in every state, ranges, the dims guessed, where each number comes from ----

def test_a_bool_padding_mask_is_synthesized_with_a_valid_position_in_every_row(tmp_path):
    """A key-padding mask (True = padding, read from the Where that fills where it is True): the batch (guessed 2)
    holds a row all valid and one partly padded, never a row all padding (a softmax over nothing, NaN in float32 too,
    which real inputs never feed): nothing turns NaN, and the mask fill is what the run measured."""
    from fixtures.keep_list_models import padding_mask_attention
    from precaudit.frontends.onnx import load_onnx
    from precaudit.trace.inputs import synthesize_inputs

    path = padding_mask_attention(tmp_path / "pad.onnx")
    mask = synthesize_inputs(load_onnx(str(path)), {}, 0)["mask"]
    assert mask.tolist() == [[False] * 8, [False] * 4 + [True] * 4]
    _, report = run_json([path], "--trace", "--select", "PA906", out_dir=tmp_path)
    [trace] = report["trace"]
    assert trace["source"] == "synthesized" and trace["guessed_dims"] == {"batch": 2} and trace["masks"] == ["mask"]
    assert report["results"] == []


def test_an_int_attention_mask_has_two_rows_and_a_fixed_batch_of_one_is_partly_valid(tmp_path):
    from precaudit.frontends.onnx import load_onnx
    from precaudit.trace.inputs import synthesize_inputs

    ids = h.make_tensor_value_info("attention_mask", T.INT64, ["batch", 6])
    x = h.make_tensor_value_info("x", T.FLOAT, ["batch", 6])
    y = h.make_tensor_value_info("y", T.FLOAT, ["batch", 6])
    nodes = [h.make_node("Cast", ["attention_mask"], ["m"], to=T.FLOAT), h.make_node("Mul", ["x", "m"], ["y"])]
    path = save(model(nodes, [ids, x], [y]), tmp_path / "am.onnx")
    feeds = synthesize_inputs(load_onnx(str(path)), {}, 0)
    assert feeds["attention_mask"].tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]] and feeds["x"].shape == (2, 6)
    feeds = synthesize_inputs(load_onnx(str(path)), {"batch": 1}, 0)
    assert feeds["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0]]


def test_range_sets_a_synthesized_inputs_values(tmp_path, rms, capsys):
    from precaudit.frontends.onnx import load_onnx
    from precaudit.trace.inputs import synthesize_inputs

    x = synthesize_inputs(load_onnx(str(rms)), {}, 0, {"x": (-32768.0, 32767.0)})["x"]
    assert x.dtype == np.float16 and x.min() >= -32768 and x.max() <= 32767 and np.abs(x).max() > 1000
    # |x| in the thousands: x² passes 65504 in float16, where N(0, 1) never does
    _, report = run_json([rms], "--trace", "--select", "PA901", "--range", "x=-32768:32767", out_dir=tmp_path)
    assert [r["rule_id"] for r in report["results"]] == ["PA901"]
    _, report = run_json([rms], "--trace", "--select", "PA901", out_dir=tmp_path)
    assert report["results"] == []
    for bad, message in (("x=1", "expected NAME=LO:HI with finite LO <= HI, got 'x=1'"),
                         ("x=3:1", "--range: 'x' must be a pair of finite numbers LO <= HI, got (3.0, 1.0)"), ("z=0:1", "--range z: no graph input of that name")):
        assert main([str(rms), "--trace", "--range", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err


def test_a_shape_error_from_a_guessed_dim_says_which_and_how_to_set_it(tmp_path, capsys):
    """A Reshape to a fixed 64 elements fails on the default size 16 for 'seq': fix's float32 check names the dim it
    guessed and --dim."""
    x = h.make_tensor_value_info("x", T.FLOAT, [1, "seq"])
    y = h.make_tensor_value_info("y", T.FLOAT, [1, 64])
    nodes = [h.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
             h.make_node("Sigmoid", ["r"], ["s"], name="sig"), h.make_node("Log", ["s"], ["y"], name="log")]
    shape = h.make_tensor("shape", T.INT64, [2], [1, 64])
    path = save(model(nodes, [x], [y], [shape]), tmp_path / "reshape.onnx")
    code = main(["fix", str(path), "-o", str(tmp_path / "fixed.onnx")])
    out = capsys.readouterr().out
    assert code == 3
    assert ("float32 check: not run: onnxruntime cannot run the model in float32 to compare it:" in out
            and "(precaudit guessed the symbolic dims seq=16: set them with --dim NAME=SIZE)" in out)
    assert main(["fix", str(path), "-o", str(tmp_path / "fixed2.onnx"), "--dim", "seq=64"]) == 3
    assert "float32 check (onnxruntime, 1 synthesized sample (seed 0))" in capsys.readouterr().out


def _sized_by_input(op: str):
    """A model whose one node's output size is an int64 input's value: ConstantOfShape(shape), Expand(x, shape),
    Tile(x, repeats), Range(0, limit, 1) (then summed to a scalar added to x)."""
    from onnx import numpy_helper

    if op == "ConstantOfShape":
        made = [h.make_node("ConstantOfShape", ["n"], ["big"], name="big",
                            value=numpy_helper.from_array(np.array([1.0], np.float32)))]
    elif op == "Range":
        made = [h.make_node("Cast", ["n"], ["limit"], name="limit", to=T.FLOAT),
                h.make_node("Squeeze", ["limit"], ["limit0"], name="squeeze"),
                h.make_node("Range", ["zero", "limit0", "one"], ["big"], name="big")]
    else:
        made = [h.make_node(op, ["x", "n"], ["big"], name="big")]
    nodes = [*made, h.make_node("ReduceSum", ["big"], ["s"], name="sum", keepdims=0),
             h.make_node("Add", ["x", "s"], ["y"], name="add")]
    n = h.make_tensor_value_info("n", T.INT64, [1] if op == "Range" else [2])
    x = h.make_tensor_value_info("x", T.FLOAT, [1] if op == "Range" else [1, 1])
    return model(nodes, [x, n], [h.make_tensor_value_info("y", T.FLOAT, [1] if op == "Range" else [1, 1])],
                 [const("zero", 0.0), const("one", 1.0)] if op == "Range" else [])


@pytest.mark.parametrize("engine", ["numpy", "onnxruntime"])
@pytest.mark.parametrize("op,huge,small", [
    ("ConstantOfShape", [200_000, 100_000], [3, 4]), ("Expand", [200_000, 100_000], [3, 4]),
    ("Tile", [20_000_000_000], [12]), ("Range", [20_000_000_000], [12])])
def test_a_tensor_past_the_budget_is_refused_before_it_is_made(op, huge, small, engine, tmp_path, capsys):
    """An input whose value sizes a tensor (20,000,000,000 elements: 75 GiB) is one line and exit 2, refused before
    the allocation; the same model with a small size runs."""
    if op == "Tile":
        huge, small = [1, huge[0]], [1, small[0]]
    path = save(_sized_by_input(op), tmp_path / "m.onnx")
    shape = (1,) if op == "Range" else (1, 1)
    inputs = {"x": np.ones(shape, np.float32)}
    big = _npz(tmp_path, **inputs, n=np.array(huge[-1:] if op == "Range" else huge, np.int64))
    assert main([str(path), "--trace", "--trace-engine", engine, "--inputs", big]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error" not in err
    # a Range's float limit of 2e10 is inf in float16: the emulated run, which comes first, is refused for that
    made = "an unbounded number of" if op == "Range" else "20,000,000,000"
    assert f"node 'big' ({op}) would make a tensor of {made} elements" in err
    np.savez(tmp_path / "small.npz", **inputs, n=np.array(small[-1:] if op == "Range" else small, np.int64))
    assert main([str(path), "--trace", "--trace-engine", engine, "--inputs", str(tmp_path / "small.npz")]) == 0


def test_dim_with_several_models_applies_where_a_model_has_it(tmp_path):
    """One model alone: a --dim naming none of its dims is a typo (exit 2). Several models, whose dims differ: each
    takes the names it has, static and traced alike."""
    from fixtures.PA909_angle_error import _rope_of_seq

    seq = save(_rope_of_seq(), tmp_path / "seq.onnx")
    fixed = save(chain_model([("Relu", ["x"], "r")]), tmp_path / "fixed.onnx")
    assert main([str(fixed), "--dim", "seq=4096"]) == 2
    for extra in ((), ("--trace",)):
        code, report = run_json([seq, fixed], "--dim", "seq=4096", "--select", "PA217,PA909", *extra,
                                out_dir=tmp_path)
        assert report["errors"] == [] and code == 0
        found = {(r["rule_id"], r["values"].get("angle_bound")) for r in report["results"]}
        assert found == ({("PA217", 4096.0), ("PA909", 4096.0)} if extra else {("PA217", 4096.0)})


@pytest.mark.parametrize("engine", ["numpy", "onnxruntime"])
def test_a_range_onnxruntime_would_allocate_is_refused_first(engine, tmp_path, capsys):
    """Found by benchmarks/fuzz_hostile.py: a Range to 2**31 from an int64 input ran inside an onnxruntime segment,
    which allocated 8 GB. Sized by a non-constant input, it runs on numpy, which refuses it before allocating."""
    from tests.fuzzing_surfaces import _SIZED

    path = tmp_path / "sized.onnx"
    path.write_bytes(_SIZED)
    inputs = _npz(tmp_path, x=np.ones(1, np.float32), n=np.array([3, 1000], np.int64), m=np.array(2 ** 31, np.int64))
    assert main([str(path), "--trace", "--trace-engine", engine, "--inputs", inputs]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "node 'range' (Range) would make a tensor of" in err


def _endless_loop():
    """A Loop of 2**62 iterations whose condition stays true: its session would run for centuries."""
    from onnx import numpy_helper

    body = h.make_graph([h.make_node("Identity", ["cond_in"], ["cond_out"]),
                         h.make_node("Add", ["acc_in", "one"], ["acc_out"])], "body",
                        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond_in", T.BOOL, []),
                         h.make_tensor_value_info("acc_in", T.FLOAT, [1])],
                        [h.make_tensor_value_info("cond_out", T.BOOL, []),
                         h.make_tensor_value_info("acc_out", T.FLOAT, [1])],
                        [numpy_helper.from_array(np.array([1.0], np.float32), "one")])
    return model([h.make_node("Loop", ["M", "cond", "x"], ["y"], name="loop", body=body)],
                 [h.make_tensor_value_info("x", T.FLOAT, [1])], [h.make_tensor_value_info("y", T.FLOAT, [1])],
                 [numpy_helper.from_array(np.array(2 ** 62, np.int64), "M"),
                  numpy_helper.from_array(np.array(True), "cond")])


@pytest.mark.parametrize("command", [[], ["keep-list", "--for", "onnxruntime"]])
@pytest.mark.requires("onnxruntime")
def test_a_traced_run_past_its_timeout_stops(command, tmp_path, capsys):
    """--timeout bounds a model's traced run, inside an onnxruntime session too (RunOptions.terminate): one line
    naming the node, exit 2, seconds after the limit rather than never."""
    import time

    path = save(_endless_loop(), tmp_path / "loop.onnx")
    args = [*command[:1], str(path), *command[1:], "--trace", "--timeout", "1"]
    start = time.monotonic()
    assert main(args) == 2
    assert time.monotonic() - start < 60
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "traced mode stopped after 1 s at node 'loop' (Loop) (--timeout" in err


def test_an_op_type_that_is_not_utf8_is_one_line_when_traced(tmp_path, capsys):
    """Found by benchmarks/fuzz_hostile.py: an op type whose bytes are not UTF-8 reached the reference evaluator's
    node builder, which raised UnicodeEncodeError (an internal error); now the node has no kernel, in one line."""
    m = chain_model([("Relu", ["x"], "r"), ("Softmax", ["r"], "probs")], dtype="fp32")
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString().replace(b"Softmax", b"Sof\xf4max"))
    assert main([str(path), "--trace", "--trace-engine", "numpy"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error" not in err and "traced mode has no kernel for node 'probs'" in err


def test_inputs_without_trace_run_traced_mode_and_say_so(capsys, tmp_path):
    """--inputs is read by traced mode only: check and keep-list given it without --trace run traced mode on it,
    with one line on stderr, instead of auditing statically and dropping the user's data unsaid."""
    model = save(chain_model([("Mul", ["x", "k"], "scaled")], dtype="fp32", consts={"k": 300.0}),
                 tmp_path / "scaled.onnx")
    loud = tmp_path / "loud.npz"
    np.savez(loud, x=np.full((2, 8), 1000.0, np.float32))
    note = "precaudit: note: --inputs without --trace: running traced mode on them (the static audit reads no inputs)\n"
    code, report = run_json([model], "--inputs", str(loud), out_dir=tmp_path)
    assert code == 1 and capsys.readouterr().err == note
    assert [(f["rule_id"], f["node_name"]) for f in report["results"]] == [("PA901", "scaled"), ("PA906", "scaled")]
    assert main(["keep-list", str(model), "--for", "onnxruntime", "--inputs", str(loud)]) == 0
    captured = capsys.readouterr()
    assert captured.err == note and f"verified on inputs from {loud}" in captured.out
    assert main([str(model)]) == 0 and capsys.readouterr().err == ""  # no inputs: the static audit, unchanged


def test_a_node_that_cannot_run_on_guessed_dims_names_them_and_dim(capsys, tmp_path):
    """A Reshape to (-1, 7) of an input of symbolic length n: the synthesized n=1 cannot fold; the one line names
    the dims precaudit chose and --dim, which runs it."""
    from onnx import numpy_helper

    graph = h.make_graph([h.make_node("Reshape", ["x", "shape"], ["r"], name="fold"),
                          h.make_node("Relu", ["r"], ["y"], name="act")], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, ["n"])], [h.make_tensor_value_info("y", T.FLOAT, [None, 7])],
                         [numpy_helper.from_array(np.array([-1, 7], np.int64), "shape")])
    path = save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), tmp_path / "fold.onnx")
    assert main([str(path), "--trace", "--trace-engine", "numpy"]) == 2
    assert capsys.readouterr().err == (
        f"precaudit: {path}: traced mode cannot run node 'fold' (Reshape): ValueError: cannot reshape array of size 1 "
        "into shape (7) (precaudit guessed the symbolic dims n=1: set them with --dim NAME=SIZE)\n")
    assert main([str(path), "--trace", "--dim", "n=14"]) == 0
