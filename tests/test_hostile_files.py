"""Files from a stranger's pull request: nothing the run reads is overwritten, nothing hangs or reads without bound.

Each broken or hostile file must give one stderr line naming the file and exit 2; the runs that could hang or
use memory go through a child process with a timeout and report its peak RSS.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from fixtures.onnx_builders import decomposed_layernorm, fused_norm, model, save, save_with_external, tensor
from precaudit.cli import main
from tests.helpers import run_cli_process, run_json

RSS_BOUND_MB = 400  # an ONNX audit of a tiny model, whatever the files around it claim


def _one_error_line(err: str, *needles: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def underflow(tmp_path) -> Path:
    return save(fused_norm("LayerNormalization", epsilon=1e-12, stash_type=0), tmp_path / "model.onnx")


@pytest.fixture
def external_eps(tmp_path) -> Path:
    """An fp32 decomposed LayerNorm whose eps 1e-12 lives in model.data (underflows when run in fp16)."""
    m, _ = decomposed_layernorm(1e-12, dtype="fp32", eps_at="external")
    return save_with_external(m, tmp_path / "model.onnx", "eps")


# ---- -o never goes over an input ---------------------------------------------------------------------------------


def _unchanged(path: Path):
    before = path.read_bytes()
    return lambda: path.read_bytes() == before


def test_report_refuses_a_hard_link_to_the_model(underflow, tmp_path, capsys):
    link = tmp_path / "report.json"
    os.link(underflow, link)
    same = _unchanged(underflow)
    assert main([str(underflow), "-f", "json", "-o", str(link)]) == 2
    _one_error_line(capsys.readouterr().err, str(link), "refusing to write the report over one of the inputs")
    assert same()


def test_report_refuses_a_symlink_to_the_model(underflow, tmp_path, capsys):
    link = tmp_path / "report.txt"
    link.symlink_to(underflow)
    same = _unchanged(underflow)
    assert main([str(underflow), "-o", str(link)]) == 2
    _one_error_line(capsys.readouterr().err, "is a symlink: precaudit writes no output through one")
    assert same()


@pytest.mark.parametrize("command", ["check", "fix", "keep-list", "baseline"])
def test_no_output_lands_on_an_input_through_a_missing_folder_a_symlink_or_a_fifo(underflow, tmp_path, capsys,
                                                                                command):
    """x/../model.onnx through a folder that does not exist stats as new but was resolved onto the model; a
    symlink at the output pointed at it; a FIFO was replaced. The folder is resolved as the OS opens it, the name
    in it may be no symlink and only a regular file: each is one line and exit 2, and the model is unchanged."""
    import os

    model = tmp_path / "model.onnx"
    model.write_bytes(underflow.read_bytes())
    same = _unchanged(model)
    link = tmp_path / "out.onnx"
    link.symlink_to(model)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target, says in ((tmp_path / "missing" / ".." / "model.onnx", "its folder does not exist"),
                         (link, "is a symlink"), (fifo, "is a FIFO (named pipe)")):
        args = {"check": [str(model), "-o", str(target)],
                "fix": ["fix", str(model), "-o", str(target)],
                "keep-list": ["keep-list", str(model), "--for", "onnxruntime", "-o", str(target)],
                "baseline": [str(model), "--write-baseline", str(target)]}[command]
        assert main(args) == 2, (command, target)
        _one_error_line(capsys.readouterr().err, says)
        assert same() and fifo.exists() and link.is_symlink()


def test_report_refuses_the_models_external_data(external_eps, tmp_path, capsys):
    data = tmp_path / "model.data"
    same = _unchanged(data)
    assert main([str(external_eps), "-o", str(data)]) == 2
    _one_error_line(capsys.readouterr().err, f"{data}: refusing to write the report over one of the inputs "
                                             f"(external data of {external_eps})")
    assert same()


def test_report_refuses_external_data_a_static_audit_never_reads(tmp_path, capsys):
    """A big weight is not read by a static audit; it is still the user's file."""
    m, _ = decomposed_layernorm(1e-5, dtype="fp32")
    m.graph.initializer.append(numpy_helper.from_array(np.ones((64, 64), np.float32), "w"))
    m.graph.node.append(h.make_node("MatMul", ["y", "w"], ["z"], name="mm"))
    path = save_with_external(m, tmp_path / "big.onnx", "w")
    data = tmp_path / "big.data"
    same = _unchanged(data)
    assert main([str(path), "-o", str(data)]) == 2
    _one_error_line(capsys.readouterr().err, "refusing", f"external data of {path})")
    assert same()


def test_report_refuses_a_rule_file_in_a_rules_folder(underflow, tmp_path, capsys):
    folder = tmp_path / "rules"
    folder.mkdir()
    rule = folder / "PA101.yaml"
    rule.write_text("id: PA101\nseverity: warning\n")
    same = _unchanged(rule)
    assert main([str(underflow), "--rules", str(folder), "-o", str(rule)]) == 2
    _one_error_line(capsys.readouterr().err, "refusing")
    assert same()


def test_report_refuses_the_baseline_but_the_baseline_may_be_refreshed(underflow, tmp_path, capsys):
    baseline = tmp_path / "baseline.json"
    assert main([str(underflow), "--write-baseline", str(baseline)]) == 0
    capsys.readouterr()
    same = _unchanged(baseline)
    assert main([str(underflow), "--baseline", str(baseline), "-o", str(baseline)]) == 2
    _one_error_line(capsys.readouterr().err, "refusing")
    assert same()
    # refreshing it in place is how a baseline is kept up to date
    assert main([str(underflow), "--baseline", str(baseline), "--write-baseline", str(baseline)]) == 0
    assert json.loads(baseline.read_text())["findings"]


def test_baseline_refuses_the_model(underflow, capsys):
    same = _unchanged(underflow)
    assert main([str(underflow), "--write-baseline", str(underflow)]) == 2
    _one_error_line(capsys.readouterr().err, "refusing to write the baseline")
    assert same()


def test_report_refuses_the_traced_inputs(tmp_path, capsys):
    m, _ = decomposed_layernorm(1e-5, dtype="fp32")
    path = save(m, tmp_path / "m.onnx")
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.ones((2, 8), np.float32))
    same = _unchanged(inputs)
    assert main([str(path), "--trace", "--inputs", str(inputs), "-o", str(inputs)]) == 2
    _one_error_line(capsys.readouterr().err, "refusing")
    assert same()


@pytest.mark.requires("torch")
def test_report_refuses_a_factorys_source_and_what_it_imports(tmp_path, capsys):
    (tmp_path / "blocks.py").write_text("import torch\nclass Net(torch.nn.Module):\n"
                                        "    def forward(self, x):\n        return torch.log(torch.softmax(x, -1))\n")
    source = tmp_path / "model.py"
    source.write_text("import torch\nfrom blocks import Net\n\ndef make():\n    return Net(), (torch.randn(2, 8),)\n")
    for target in (source, tmp_path / "blocks.py"):
        same = _unchanged(target)
        assert main([f"{source}:make", "-o", str(target)]) == 2
        _one_error_line(capsys.readouterr().err, "refusing")
        assert same()


def test_report_replaces_an_old_report_through_a_rename(underflow, tmp_path):
    """A reader of the previous report (or a hard link to it) keeps the old bytes; the path gets the new ones."""
    out = tmp_path / "report.json"
    out.write_text("old")
    keep = tmp_path / "kept.json"
    os.link(out, keep)
    assert main([str(underflow), "-f", "json", "-o", str(out)]) == 1
    assert json.loads(out.read_text())["results"]
    assert keep.read_text() == "old"


# ---- only regular files, never a hang -------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/urandom", "fifo", "dir"])
def test_model_that_is_not_a_regular_file(tmp_path, target):
    path = tmp_path / "model.onnx"
    if target == "fifo":
        os.mkfifo(path)
    elif target == "dir":
        path.mkdir()
    else:
        path.symlink_to(target)
    code, _, err, _ = run_cli_process([path], tmp_path, timeout=60)
    assert code == 2
    _one_error_line(err, str(path), "not a regular file")


@pytest.mark.parametrize("target", ["fifo", "/dev/zero"])
def test_external_data_that_is_not_a_regular_file(external_eps, tmp_path, target):
    data = tmp_path / "model.data"
    data.unlink()
    if target == "fifo":
        os.mkfifo(data)
    else:
        data.symlink_to(target)
    code, _, err, _ = run_cli_process([external_eps], tmp_path, timeout=60)
    assert code == 2
    _one_error_line(err, str(external_eps), "initializer 'eps'")


def _no_length_eps(tmp_path: Path, offset: int, tail: int) -> Path:
    """A model whose eps lives in weights.bin at offset with no `length`, followed by tail more bytes (sparse)."""
    m, _ = decomposed_layernorm(1e-12, dtype="fp32", eps_at="external")
    eps = next(i for i in m.graph.initializer if i.name == "eps")
    with open(tmp_path / "weights.bin", "wb") as fh:  # sparse: 3 GiB on paper, a few bytes on disk
        fh.seek(offset)
        fh.write(np.float32(1e-12).tobytes())
        fh.truncate(offset + 4 + tail)
    eps.ClearField("raw_data")
    eps.data_location = T.EXTERNAL
    del eps.external_data[:]
    for key, value in (("location", "weights.bin"), ("offset", str(offset))):
        entry = eps.external_data.add()
        entry.key, entry.value = key, value
    path = tmp_path / "model.onnx"
    onnx.save(m, str(path))
    return path


def test_a_scalar_eps_with_no_length_in_front_of_64_mib_is_a_size_mismatch(tmp_path):
    """No `length`: the data runs to the end of the file (onnx.load reads it so, then cannot reshape 64 MiB into a
    scalar), so a scalar eps followed by 64 MiB more is refused, one line, without reading the file."""
    path = _no_length_eps(tmp_path, 3 << 30, 64 << 20)
    code, _, err, peak = run_cli_process([path], tmp_path)
    assert code == 2
    _one_error_line(err, str(path), "initializer 'eps': external data has no length, so it runs from offset "
                                    f"{3 << 30} to the end of 'weights.bin' ({4 + (64 << 20)} bytes), but dims [] "
                                    "hold 4 bytes")
    assert peak < RSS_BOUND_MB, f"peak RSS {peak:.0f} MB"


def test_a_scalar_eps_with_no_length_at_the_end_of_a_3_gib_file_reads_only_its_bytes(tmp_path):
    path = _no_length_eps(tmp_path, 3 << 30, 0)
    report_file = tmp_path / "report.json"
    code, _, err, peak = run_cli_process([path, "-f", "json", "-o", report_file], tmp_path)
    assert code == 1, err
    report = json.loads(report_file.read_text())
    [finding] = [r for r in report["results"] if r["rule_id"] == "PA101"]
    assert finding["node_name"] == "add_eps" and finding["values"]["eps"] == pytest.approx(1e-12)
    assert peak < RSS_BOUND_MB, f"peak RSS {peak:.0f} MB"


# ---- tensor entries that lie ----------------------------------------------------------------------------------


def _eps_model(tmp_path: Path, edit) -> Path:
    m, _ = decomposed_layernorm(1e-12, dtype="fp32")
    eps = next(i for i in m.graph.initializer if i.name == "eps")
    edit(eps, tmp_path)
    path = tmp_path / "model.onnx"
    onnx.save(m, str(path))
    return path


def _external(offset: str | None = None, length: str | None = None, location: str = "model.data"):
    def edit(eps: onnx.TensorProto, folder: Path) -> None:
        (folder / "model.data").write_bytes(eps.raw_data * 4)
        eps.ClearField("raw_data")
        eps.data_location = T.EXTERNAL
        for key, value in (("location", location), ("offset", offset), ("length", length)):
            if value is not None:
                entry = eps.external_data.add()
                entry.key, entry.value = key, value
    return edit


def _dims(*dims: int):
    def edit(eps: onnx.TensorProto, _folder: Path) -> None:
        del eps.dims[:]
        eps.dims.extend(dims)
    return edit


@pytest.mark.parametrize("edit,problem", [
    (_dims(2 ** 32, 2 ** 32), "need 73786976294838206464 bytes of data, the file holds 4"),
    (_dims(3), "need 12 bytes of data, the file holds 4"),
    (_dims(-1, 4), "negative dim"),
    (_external(offset="-4"), "offset '-4' is not a non-negative integer"),
    (_external(offset="abc"), "offset 'abc' is not a non-negative integer"),
    (_external(length=str(2 ** 62)), "disagrees with dims"),
    (_external(offset="14"), "fewer than offset 14 + 4 bytes"),
    (_external(location="../outside.data"), "leaves the model's folder"),
    (_external(location="/etc/passwd"), "leaves the model's folder"),
], ids=["dims-wrap-64-bit", "dims-vs-data", "negative-dim", "offset-negative", "offset-text", "length-2^62",
        "offset-past-end", "location-parent", "location-absolute"])
def test_tensor_entries_that_disagree(tmp_path, capsys, edit, problem):
    path = _eps_model(tmp_path, edit)
    assert main([str(path)]) == 2
    _one_error_line(capsys.readouterr().err, str(path), "initializer 'eps'", problem)


def test_wrapping_dims_on_a_weight_never_read_statically_still_refuse(tmp_path, capsys):
    """A weight of 2^64 elements is not read by a static audit, but its dims already say the file is broken."""
    m, _ = decomposed_layernorm(1e-5, dtype="fp32")
    w = numpy_helper.from_array(np.ones(16, np.float32), "w")
    del w.dims[:]
    w.dims.extend([2 ** 32, 2 ** 32])
    m.graph.initializer.append(w)
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    assert main([str(path)]) == 2
    _one_error_line(capsys.readouterr().err, "initializer 'w'", "bytes of data")


# ---- invalid graphs ---------------------------------------------------------------------------------------------


def _graph(nodes, inputs=("x",)) -> onnx.ModelProto:
    return model(nodes, [tensor(i, "fp16") for i in inputs], [tensor("y", "fp16")])


@pytest.mark.parametrize("nodes", [
    [h.make_node("Add", ["x", "b"], ["a"], name="first"), h.make_node("Relu", ["a"], ["b"], name="second"),
     h.make_node("Log", ["a"], ["y"], name="log")],
    [h.make_node("Log", ["nowhere"], ["y"], name="log")],
    [h.make_node("Log", ["a"], ["y"], name="log"), h.make_node("Relu", ["x"], ["a"], name="late")],
], ids=["cycle", "missing-input", "out-of-order"])
def test_invalid_graph_is_one_line_and_exit_2(tmp_path, capsys, nodes):
    path = tmp_path / "bad.onnx"
    onnx.save(_graph(nodes), str(path))
    assert main([str(path)]) == 2
    _one_error_line(capsys.readouterr().err, str(path), "the graph is invalid")


def test_body_reading_an_undefined_name_is_invalid(tmp_path, capsys):
    body = h.make_graph([h.make_node("Log", ["undefined_outer"], ["b"], name="inner_log")], "then",
                        [], [h.make_tensor_value_info("b", T.FLOAT16, [2, 8])])
    other = h.make_graph([h.make_node("Identity", ["x"], ["c"], name="inner_id")], "else",
                         [], [h.make_tensor_value_info("c", T.FLOAT16, [2, 8])])
    m = model([h.make_node("If", ["cond"], ["y"], name="if", then_branch=body, else_branch=other)],
              [h.make_tensor_value_info("cond", T.BOOL, []), tensor("x", "fp16")], [tensor("y", "fp16")])
    path = tmp_path / "bad.onnx"
    onnx.save(m, str(path))
    assert main([str(path)]) == 2
    _one_error_line(capsys.readouterr().err, "'undefined_outer'", "the graph is invalid")


# ---- .npz inputs ------------------------------------------------------------------------------------------------


@pytest.fixture
def traced_model(tmp_path) -> Path:
    m, _ = decomposed_layernorm(1e-5, dtype="fp32")
    return save(m, tmp_path / "m.onnx")


def _npz_with(path: Path, name: str, data: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(name, data)
    return path


def _npy_header(shape: tuple, descr: str = "<f4") -> bytes:
    import io
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


@pytest.mark.parametrize("member,data,problem", [
    ("x.txt", b"hello", "member 'x.txt' is not an .npy array"),
    ("x.npy", b"not an npy", "array 'x' has no valid .npy header"),
    ("x.npy", _npy_header((2 ** 40,)) + bytes(64), "header declares 4398046511104 bytes"),
    ("x.npy", _npy_header((2, 8), "|O") + bytes(16), "holds Python objects"),
], ids=["not-npy", "bad-header", "header-2^40-floats", "object-dtype"])
def test_npz_members_that_lie(traced_model, tmp_path, member, data, problem):
    npz = _npz_with(tmp_path / "in.npz", member, data)
    code, _, err, peak = run_cli_process([traced_model, "--trace", "--inputs", npz], tmp_path, timeout=60)
    assert code == 2
    _one_error_line(err, str(npz), problem)
    assert peak < RSS_BOUND_MB


def test_zip_bomb_npz_is_refused_before_it_inflates(traced_model, tmp_path):
    npz = tmp_path / "bomb.npz"  # 1.25 GiB of zeros in a few MB
    count = (5 << 28) // 4
    with zipfile.ZipFile(npz, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as z, \
            z.open("x.npy", "w", force_zip64=True) as f:
        f.write(_npy_header((count,)))
        chunk = bytes(64 << 20)
        for _ in range((count * 4) // len(chunk)):
            f.write(chunk)
    assert npz.stat().st_size < 16 << 20
    code, _, err, peak = run_cli_process([traced_model, "--trace", "--inputs", npz], tmp_path, timeout=60)
    assert code == 2
    _one_error_line(err, str(npz), "unpack to more than 1024 MiB")
    assert peak < RSS_BOUND_MB


def test_npz_from_numpy_still_runs(traced_model, tmp_path):
    npz = tmp_path / "in.npz"
    np.savez_compressed(npz, x=np.full((2, 8), 3.0, np.float32))
    _code, report = run_json([traced_model], "--trace", "--inputs", str(npz), out_dir=tmp_path)
    assert report["errors"] == [] and report["trace"][0]["inputs"]


# ---- where the report goes --------------------------------------------------------------------------------------


def test_stdout_on_dev_full_is_one_line(underflow, tmp_path):
    with open("/dev/full", "w") as full:
        code, _, err, _ = run_cli_process([underflow], tmp_path, stdout=full)
    assert code == 2
    _one_error_line(err, "standard output", "cannot write the report", "No space left on device")


def test_closed_stdout_is_one_line(underflow, tmp_path):
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "precaudit", str(underflow)], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=60,
                          preexec_fn=lambda: os.close(1))
    assert proc.returncode == 2
    _one_error_line(proc.stderr, "standard output", "cannot write the report")


@pytest.mark.parametrize("args,needle", [
    (["--format", "xml"], "Invalid value for '--format' / '-f': must be one of text, concise, json, sarif, github, junit, html, got 'xml'"),
    (["--dtype", "fp12"], "fp12"),
    (["--no-such-flag"], "--no-such-flag"),
    (["--samples", "0"], "--samples"),
])
def test_usage_errors_are_one_line(underflow, capsys, args, needle):
    assert main([str(underflow), *args]) == 2
    _one_error_line(capsys.readouterr().err, needle)


@pytest.mark.parametrize("attr,value,problem", [
    ("stash_type", "%s%s%n", "attribute 'stash_type' must be INT, the file has STRING"),
    ("epsilon", [1, 2], "attribute 'epsilon' must be FLOAT, the file has INTS"),
    ("axis", 1.5, "attribute 'axis' must be INT, the file has FLOAT"),
])
def test_attribute_of_the_wrong_type_is_an_invalid_model(tmp_path, capsys, attr, value, problem):
    m = fused_norm("LayerNormalization", epsilon=1e-12, stash_type=0)
    node = m.graph.node[0]
    kept = [a for a in node.attribute if a.name != attr]
    del node.attribute[:]
    node.attribute.extend([*kept, h.make_attribute(attr, value)])
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    assert main([str(path)]) == 2
    _one_error_line(capsys.readouterr().err, str(path), "node 'norm' (LayerNormalization)", problem)


def test_names_that_are_not_utf8_are_reported_visibly(tmp_path, capsys):
    """protobuf hands a string field that is not UTF-8 over as bytes; the audit goes on and prints it escaped."""
    m = fused_norm("LayerNormalization", epsilon=1e-12, stash_type=0, name="normQQQQ")
    data = m.SerializeToString().replace(b"normQQQQ", b"norm\xff\xfe\xfd\xfc")
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    assert main([str(path)]) == 1
    out = capsys.readouterr().out
    assert "PA101" in out and "node 'norm\\udcff\\udcfe\\udcfd\\udcfc' (LayerNormalization)" in out
    _code, report = run_json([path], out_dir=tmp_path)
    assert report["results"][0]["node_name"].startswith("norm")


def test_a_path_longer_than_the_file_system_allows_is_one_line(tmp_path, capsys):
    """ENAMETOOLONG from a model path, a rule path or a baseline path: one line naming the path, shortened, exit 2."""
    from precaudit.cli import main

    model = save(fused_norm("LayerNormalization", epsilon=1e-12), tmp_path / "m.onnx")
    long = "x" * 5000
    for args in ([f"{long}.onnx"], [str(model), "--rules", long], [str(model), "--baseline", long]):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "internal error" not in err and "File name too long" in err
        assert "...(500" in err and len(err) < 400
