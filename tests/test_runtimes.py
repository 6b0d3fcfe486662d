"""The runtime models (--runtime): names, versions, facts with sources, the page generated from them, and the
verdicts that flip between runtimes on the graphs each fact is about."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.onnx_builders import decomposed_layernorm, fused_norm, save
from precaudit.runtime import RUNTIME_NAMES, runtime_classes, runtime_named
from precaudit.runtime.listing import runtimes_page
from tests.helpers import run_json

DOCS = Path(__file__).resolve().parent.parent / "docs" / "runtimes.md"


def test_the_committed_runtimes_page_is_what_the_models_generate():
    assert DOCS.read_text() == runtimes_page(), "regenerate: precaudit runtimes --write-page docs/runtimes.md"


def test_every_runtime_has_its_versions_and_every_fact_a_source():
    classes = runtime_classes()
    assert tuple(classes) == RUNTIME_NAMES
    for cls in classes.values():
        assert cls.versions and list(cls.versions) == sorted(cls.versions, key=lambda v: tuple(map(int, v.split("."))))
        assert cls.facts and all(f.source and f.says for f in cls.facts)
        assert len({f.key for f in cls.facts}) == len(cls.facts)


@pytest.mark.parametrize("spec, version, asked", [("ort-cuda", "1.32", None), ("ort-cuda@1.26", "1.26", None),
                                                  ("ort-cuda@1.24", "1.26", "1.24"), ("ort-cuda@1.29", "1.27", "1.29"),
                                                  ("tensorrt@11", "11", None), ("tensorrt@10.16", "10", "10.16")])
def test_a_version_is_judged_as_the_nearest_modelled_one_not_after_it(spec, version, asked):
    runtime = runtime_named(spec)
    assert (runtime.version, runtime.asked) == (version, asked)


@pytest.mark.parametrize("spec, problem", [("ort-gpu", "unknown runtime 'ort-gpu'; choose one of ort-cpu, ort-cuda,"),
                                           ("ort-cuda@latest", "'ort-cuda@latest': the version must be numbers")])
def test_an_unknown_runtime_or_version_is_one_line_exit_2(spec, problem, tmp_path, capsys):
    from precaudit.cli import main

    path = save(decomposed_layernorm(1e-5, dtype="fp16")[0], tmp_path / "ln.onnx")
    assert main([str(path), "--runtime", spec]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"precaudit: --runtime: {problem}")


def test_a_version_between_the_modelled_ones_is_a_warning_line(tmp_path, capsys):
    from precaudit.cli import main

    path = save(decomposed_layernorm(1e-5, dtype="fp16")[0], tmp_path / "ln.onnx")
    main([str(path), "--runtime", "ort-cuda@1.24"])
    assert capsys.readouterr().err.splitlines() == [
        "precaudit: warning: ort-cuda@1.24 is not a modelled version: judged as ort-cuda@1.26, the nearest modelled "
        "version not after it (modelled: 1.26, 1.27, 1.32)"]


# ---- verdicts that flip between runtimes, each on the graph its fact is about ----------------------------------

def _findings(path: Path, tmp_path: Path, *args: str) -> set[tuple[str, str]]:
    _, report = run_json([path], *args, out_dir=tmp_path)
    assert report["errors"] == []
    return {(r["rule_id"], r["node_name"]) for r in report["results"] if r["severity"] in ("error", "warning")}


def test_skip_layer_norm_in_float16_flips_with_the_onnxruntime_cuda_version(tmp_path):
    """SkipLayerNormalization (eps 1e-12 by default) on float16: onnxruntime CUDA before 1.27 sums x² and holds eps
    in float16 (#29034, fixed by #28682); CPU and CUDA 1.27 compute in float32."""
    path = save(fused_norm("SkipLayerNormalization", dtype="fp16", domain="com.microsoft"), tmp_path / "skip.onnx")
    assert _findings(path, tmp_path) == set()
    assert _findings(path, tmp_path, "--runtime", "ort-cpu") == set()
    assert _findings(path, tmp_path, "--runtime", "ort-cuda@1.26") == {("PA101", "norm"), ("PA208", "norm")}
    assert _findings(path, tmp_path, "--runtime", "ort-cuda@1.27") == set()
    _, report = run_json([path], "--runtime", "ort-cuda@1.26", out_dir=tmp_path)
    values = next(r for r in report["results"] if r["rule_id"] == "PA101")["values"]
    assert (values["runtime"], values["compute_fact"], values["compute_dtype"]) == \
        ("ort-cuda@1.26", "skip-layer-norm-fp16-accumulator", "float16")
    assert values["compute_source"].startswith("onnxruntime contrib_ops/cuda/bert/skip_layer_norm_impl.cu")


def test_a_decomposed_float16_layernorm_is_safe_on_onnxruntime_cpu_and_not_on_tensorrt_11(tmp_path):
    """onnxruntime CPU runs each float16 op of the chain in float32 (x² never overflows there); TensorRT 11 runs
    exactly what the graph says: Pow in float16."""
    path = save(decomposed_layernorm(1e-5, dtype="fp16")[0], tmp_path / "ln.onnx")
    assert _findings(path, tmp_path, "--runtime", "ort-cpu") == set()
    assert _findings(path, tmp_path, "--runtime", "tensorrt@11") == {("PA102", "add_eps"), ("PA208", "add_eps")}


def test_stash_type_1_is_ignored_on_directml(tmp_path):
    """A fused float16 LayerNormalization with stash_type=1 keeps float32 statistics on CPU; DirectML never reads
    stash_type (#17692) and squares in float16, and its eps 1e-12 is 0.0 there."""
    path = save(fused_norm("LayerNormalization", dtype="fp16", epsilon=1e-12, stash_type=1), tmp_path / "ln.onnx")
    assert _findings(path, tmp_path, "--runtime", "ort-cpu") == set()
    assert _findings(path, tmp_path, "--runtime", "ort-dml") == {("PA101", "norm"), ("PA208", "norm")}


def test_a_float32_graph_with_eps_1e12_is_fine_on_cpu_and_not_on_qnn(tmp_path):
    """--dtype fp32 on onnxruntime CPU runs float32; QNN's HTP computes float32 ops in float16 (QAIRT 2.35+)."""
    path = save(decomposed_layernorm(1e-12, dtype="fp32")[0], tmp_path / "ln.onnx")
    assert _findings(path, tmp_path, "--dtype", "fp32", "--runtime", "ort-cpu") == set()
    assert _findings(path, tmp_path, "--dtype", "fp32", "--runtime", "ort-qnn") == \
        {("PA101", "add_eps"), ("PA208", "add_eps")}


def test_a_float32_graph_converted_to_float16_keeps_its_stored_zero_eps_on_onnxruntime_cpu(tmp_path):
    """The conversion stores eps 1e-12 as float16 0.0; onnxruntime CPU computes the Add in float32 but reads the
    0.0: PA101 stays, and says the smallest normal float16 is the floor."""
    path = save(decomposed_layernorm(1e-12, dtype="fp32")[0], tmp_path / "ln.onnx")
    _, report = run_json([path], "--runtime", "ort-cpu", out_dir=tmp_path)
    [finding] = report["results"]
    assert finding["rule_id"] == "PA101" and finding["values"]["compute_dtype"] == "float32"
    assert "stored as float16: 0" in finding["message"] and "6.104e-05, the smallest normal float16" in finding["fix"]


def test_a_runtime_that_does_not_run_the_model_says_so(tmp_path, capsys):
    from precaudit.cli import main

    path = save(decomposed_layernorm(1e-5, dtype="fp16")[0], tmp_path / "ln.onnx")
    assert main([str(path), "--runtime", "coreml"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"precaudit: {path}: --runtime coreml: Core ML (coremltools FLOAT16) runs PyTorch modules, not ONNX files: "
        "audit the model.py:factory itself"]


def test_a_decomposed_layernorm_fused_by_onnxruntime_cuda_keeps_float32_statistics(tmp_path):
    """onnxruntime's LayerNormFusion turns the chain into one LayerNormalization on CUDA (float32 statistics); on
    WebGPU only from opset 17 (#31626: a whisper export at opset 14 squared |x - mean| 795 in float16)."""
    old = save(decomposed_layernorm(1e-5, dtype="fp16", opset=14)[0], tmp_path / "ln14.onnx")
    new = save(decomposed_layernorm(1e-5, dtype="fp16", opset=17)[0], tmp_path / "ln17.onnx")
    assert _findings(old, tmp_path, "--runtime", "ort-cuda") == set()
    assert _findings(old, tmp_path, "--runtime", "ort-webgpu") == {("PA102", "add_eps"), ("PA208", "add_eps")}
    assert _findings(new, tmp_path, "--runtime", "ort-webgpu") == set()
    _, report = run_json([old], "--runtime", "ort-cuda", "--select", "ALL", out_dir=tmp_path)
    assert report["results"] == []


def test_openvino_gpu_keeps_a_small_eps_division_and_its_constants_in_float32(tmp_path):
    """fp16 compression's MarkDivWithEps keeps x / sqrt(var + eps) in float32 when eps ≤ 6.1e-5, eps included:
    1e-12 survives; with eps 1e-3 the LayerNorm is not marked and squares in float16."""
    small = save(decomposed_layernorm(1e-12, dtype="fp32")[0], tmp_path / "small.onnx")
    large = save(decomposed_layernorm(1e-3, dtype="fp32")[0], tmp_path / "large.onnx")
    assert _findings(small, tmp_path, "--runtime", "openvino-gpu") == set()
    assert _findings(large, tmp_path, "--runtime", "openvino-gpu") == {("PA208", "add_eps")}


def test_the_deployment_matrix_lays_every_runtime_side_by_side(tmp_path):
    """check --runtime all: one row per hazard, one cell per runtime that runs an ONNX file, with the fact."""
    import json

    from precaudit.cli import main

    path = save(decomposed_layernorm(1e-12, dtype="fp32")[0], tmp_path / "ln.onnx")
    out = tmp_path / "matrix.json"
    assert main([str(path), "--runtime", "all", "-f", "json", "-o", str(out)]) == 1
    matrix = json.loads(out.read_text())
    assert matrix["runtimes"] == ["ort-cpu@1.32", "ort-cuda@1.32", "ort-webgpu@1.32", "ort-dml@1.32", "ort-qnn@2.35",
                                  "tensorrt@11", "openvino-cpu@2026.4", "openvino-gpu@2026.4"]
    cells = {(r["rule_id"], r["node"]): {c: v["severity"] for c, v in r["cells"].items()} for r in matrix["rows"]}
    assert cells[("PA101", "add_eps")] == {**{c: "error" for c in matrix["runtimes"]}, "openvino-gpu@2026.4": "ok"}
    assert cells[("PA208", "add_eps")] == {"ort-cpu@1.32": "ok", "ort-cuda@1.32": "ok", "ort-webgpu@1.32": "ok",
                                           "ort-dml@1.32": "warning", "ort-qnn@2.35": "warning",
                                           "tensorrt@11": "warning", "openvino-cpu@2026.4": "ok",
                                           "openvino-gpu@2026.4": "ok"}
    dml = next(r for r in matrix["rows"] if r["rule_id"] == "PA208")["cells"]["ort-dml@1.32"]
    assert dml["fact"] == "layer-norm-fusion-stash-ignored" and dml["reason"].startswith("onnxruntime DirectML 1.32: a "
                                                                                         "decomposed LayerNorm is fused")


def test_the_whisper_case_is_a_silent_finite_failure_on_webgpu_and_not_on_cuda(tmp_path):
    """#31626: an opset-14 float16 LayerNorm, |x - mean| about 800 (whisper reached 795): on WebGPU the chain runs
    unfused in float16, the variance is +inf, every row 0, and the output has no inf and no NaN: PA911, with the Pow
    named. onnxruntime CUDA fuses it (float32 statistics) and CPU runs it in float32: the same inputs are fine."""
    import numpy as np

    path = save(decomposed_layernorm(1e-5, dtype="fp16", opset=14)[0], tmp_path / "whisper_ln.onnx")
    rows = np.random.default_rng(0).standard_normal((2, 8)) * 800
    np.savez(tmp_path / "x.npz", x=rows.astype(np.float16))
    args = ("--trace", "--inputs", str(tmp_path / "x.npz"), "--select", "PA9")
    _, report = run_json([path], *args, "--runtime", "ort-webgpu", out_dir=tmp_path)
    [silent] = [r for r in report["results"] if r["rule_id"] == "PA911"]
    assert (silent["values"]["cause_node"], silent["values"]["rel_error"]) == ("pow", 1.0)
    assert _findings(path, tmp_path, *args, "--runtime", "ort-cuda") == set()
    assert _findings(path, tmp_path, *args, "--runtime", "ort-cpu") == set()


def test_the_runtimes_command_lists_every_model_and_writes_the_page(tmp_path, capsys):
    import json

    from precaudit.cli import main

    assert main(["runtimes", "-f", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)["runtimes"]
    assert [r["name"] for r in listed] == list(RUNTIME_NAMES)
    assert all(f["source"] and f["how"] in ("read", "measured", "read and measured") for r in listed for f in r["facts"])
    assert main(["runtimes", "--write-page", str(tmp_path / "runtimes.md")]) == 0
    assert (tmp_path / "runtimes.md").read_text() == runtimes_page()


def test_the_eps_command_lists_and_diffs(tmp_path, capsys):
    import json

    from precaudit.cli import main

    old = save(decomposed_layernorm(1e-12, dtype="fp32")[0], tmp_path / "old.onnx")
    new = save(decomposed_layernorm(1e-5, dtype="fp32")[0], tmp_path / "new.onnx")
    assert main(["eps", str(old), "--runtime", "ort-cpu", "-f", "json"]) == 0
    [entry] = json.loads(capsys.readouterr().out)["eps"]
    assert (entry["node"], entry["value"], entry["dtype"], entry["held"]) == ("add_eps", 0.0, "float32", "float16")
    assert main(["eps", str(old), str(new), "--diff"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{old} → {new}: 1 change",
        "  add_eps (Add): 1e-12 → 0 in float16 [zero]  became  1e-05 → 1.001e-05 in float16 [subnormal]"]
    assert main(["eps", str(old), "--diff"]) == 2
