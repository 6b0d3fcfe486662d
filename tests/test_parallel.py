"""-j N: models audited in worker processes give the report one process gives, byte for byte, in input order."""

from __future__ import annotations

import pytest

from fixtures.onnx_builders import decomposed_layernorm, fused_norm, save, save_with_external
from precaudit.cli import main


@pytest.fixture
def models(tmp_path):
    """Four models: two with findings, one clean, one that cannot be read (its error must stay in its place)."""
    paths = [save(fused_norm("LayerNormalization", epsilon=1e-12, stash_type=0), tmp_path / "a.onnx"),
             save(fused_norm("LayerNormalization", epsilon=1e-12), tmp_path / "clean.onnx")]
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    m, _ = decomposed_layernorm(1e-5, dtype="fp32", eps_at="external")
    (tmp_path / "ext").mkdir()
    external = save_with_external(m, tmp_path / "ext" / "d.onnx", "eps")
    return [*paths, broken, external]


@pytest.mark.parametrize("fmt", ["text", "json", "sarif", "junit"])
def test_report_is_the_same_as_one_process(models, tmp_path, capsys, fmt):
    reports, errors = [], []
    for jobs in ("1", "2", "4"):
        out = tmp_path / f"report-{jobs}.{fmt}"
        assert main([*map(str, models), "--format", fmt, "-o", str(out), "-j", jobs]) == 2  # the broken model
        reports.append(out.read_bytes())
        errors.append(capsys.readouterr().err)
    assert reports[0] == reports[1] == reports[2]
    assert errors[0] == errors[1] == errors[2]
    assert errors[0].count("\n") == 1 and "broken.onnx" in errors[0]


def test_report_refuses_a_file_only_a_worker_read(models, tmp_path, capsys):
    """The external data of the last model is read in a worker; -o over it is still refused."""
    data = tmp_path / "ext" / "d.data"
    before = data.read_bytes()
    assert main([*map(str, models), "-o", str(data), "-j", "2"]) == 2
    assert "refusing to write the report over one of the inputs" in capsys.readouterr().err
    assert data.read_bytes() == before


@pytest.mark.slow  # a PyTorch capture or training step: seconds
@pytest.mark.requires("torch")
def test_a_worker_that_dies_is_that_models_error(tmp_path, capsys):
    source = tmp_path / "model.py"
    source.write_text("import os\nimport torch\n\ndef dies():\n    os._exit(3)\n\n"
                      "def norm():\n    return torch.nn.LayerNorm(8), (torch.randn(2, 8),)\n")
    good = save(fused_norm("LayerNormalization", epsilon=1e-12, stash_type=0), tmp_path / "a.onnx")
    out = tmp_path / "report.txt"
    assert main([f"{source}:dies", str(good), f"{source}:norm", "-j", "2", "-o", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"precaudit: {source}:dies: the process auditing it exited with code 3 before it gave a result "
                   "(os._exit or a signal in the user's code, or a crash in native code)"]
    report = out.read_text()
    assert "PA101" in report and "2 models" in report


def test_one_process_holds_one_models_graph_at_a_time(models, monkeypatch, capsys):
    """-j 1 over many models: each graph (a web of reference cycles the paused collector leaves) is freed before
    the next model loads, so memory is one model's, not the sum of all before it."""
    import weakref

    from precaudit import audit_models as audit

    loaded, alive_at_load = [], []
    real = audit.load_graph

    def watched(*args, **kwargs):
        alive_at_load.append(sum(ref() is not None for ref in loaded))
        graph = real(*args, **kwargs)
        loaded.append(weakref.ref(graph))
        return graph
    monkeypatch.setattr(audit, "load_graph", watched)
    assert main([*map(str, models), "-j", "1"]) == 2  # the broken model among them
    capsys.readouterr()
    assert len(alive_at_load) == len(models) >= 3 and alive_at_load == [0] * len(models)


@pytest.mark.parametrize("failure", [RuntimeError("boom\nsecond line"), MemoryError(), SystemExit(3)])
def test_an_unexpected_failure_is_that_models_error(models, tmp_path, capsys, monkeypatch, failure):
    """A bug (or a MemoryError, or model code calling exit) in one model's audit is its error entry: the other
    models are audited and reported, exit 2, one line naming the model."""
    import json

    from precaudit import audit_models

    real = audit_models.collect_sites

    def failing(graph, resolver, patterns):
        if graph.path.endswith("a.onnx"):
            raise failure
        return real(graph, resolver, patterns)

    monkeypatch.setattr(audit_models, "collect_sites", failing)
    out = tmp_path / "report.json"
    first, second = models[0], models[3]  # a.onnx fails; d.onnx (external data) has a finding
    assert main([str(first), str(second), "--format", "json", "-o", str(out), "-j", "1"]) == 2
    report = json.loads(out.read_text())
    assert [e["file"] for e in report["errors"]] == [str(first)]
    err = capsys.readouterr().err
    alone = tmp_path / "alone.json"
    assert main([str(second), "--format", "json", "-o", str(alone), "-j", "1"]) == 0  # warnings only
    assert report["results"] == json.loads(alone.read_text())["results"] != []  # the other model's findings, all
    assert err.count("\n") == 1 and str(first) in err and "internal error auditing this model" in err
    assert ("boom second line" in err) == isinstance(failure, RuntimeError)
    assert ("exit(3)" in err) == isinstance(failure, SystemExit)
