"""The Python API: precaudit.audit / keep_list / fix give what the commands give, from a path, an
onnx.ModelProto or an nn.Module, and write nothing the caller did not ask for."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import onnx
import pytest

import precaudit
from fixtures import fix_models
from fixtures.keep_list_models import ffn_overflow_transformer
from fixtures.onnx_builders import fused_norm, save
from precaudit.cli import main
from tests.helpers import SCHEMA

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tiny_block_fp16.onnx"


def _cli_findings(tmp_path: Path, *args: str) -> tuple[int, list[tuple[str, str, str]]]:
    out = tmp_path / "cli.json"
    code = main([*args, "--format", "json", "-o", str(out)])
    return code, [(r["rule_id"], r["node_name"], r["message"]) for r in json.loads(out.read_text())["results"]]


def test_audit_of_a_path_is_the_commands_audit(tmp_path):
    code, cli = _cli_findings(tmp_path, str(EXAMPLE))
    report = precaudit.audit(str(EXAMPLE))
    assert report.exit_code == code == 1 and not report.ok
    assert [(f.rule_id, f.node_name, f.message) for f in report.findings] == cli
    assert report.models == [str(EXAMPLE)] and report.errors == []
    doc = json.loads(report.to_json())
    jsonschema.Draft7Validator(SCHEMA).validate(doc)
    assert [(r["rule_id"], r["node_name"], r["message"]) for r in doc["results"]] == cli
    assert report.to_text().endswith(f"Found 6 findings in 1 model ({EXAMPLE}): 1 error, 5 warnings, 0 info.\n")
    assert json.loads(report.to_sarif())["version"] == "2.1.0"
    assert report._repr_html_().startswith("<div class=\"precaudit-report\">")  # a notebook gets a fragment


def test_a_model_proto_is_audited_by_name_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    proto = onnx.load(str(EXAMPLE))
    report = precaudit.audit(proto, config=None)
    assert report.models == [f"<onnx.ModelProto {proto.graph.name}>"]
    assert {f.model for f in report.findings} == {report.models[0]}
    assert [(f.rule_id, f.node_name) for f in report.findings] == \
        [(f.rule_id, f.node_name) for f in precaudit.audit(str(EXAMPLE)).findings]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.requires("torch")
def test_an_nn_module_with_example_inputs(tmp_path, monkeypatch):
    import torch

    from fixtures.torch_src.hazards import HandLayerNorm

    monkeypatch.chdir(tmp_path)
    report = precaudit.audit(HandLayerNorm(), example_inputs=torch.randn(2, 8), config=None)
    assert report.models == ["<HandLayerNorm>"]
    source = Path(__file__).resolve().parent.parent / "fixtures" / "torch_src" / "hazards.py"
    line = next(i for i, text in enumerate(source.read_text().splitlines(), 1) if "torch.sqrt(var + self.eps)" in text)
    assert [(f.rule_id, Path(f.source_file).name, f.source_line) for f in report.findings] == \
        [("PA101", "hazards.py", line), ("PA208", "hazards.py", line)]
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(precaudit.InputError, match="needs example_inputs"):
        precaudit.audit(HandLayerNorm())
    with pytest.raises(precaudit.InputError) as caught:
        precaudit.audit(HandLayerNorm(), example_inputs=[torch.randn(2, 8)])
    assert str(caught.value) == ("example_inputs: auditing an nn.Module needs example_inputs= (a tensor or a tuple of "
                                 "tensors), got list")


def test_errors_raise_or_are_entries(tmp_path):
    with pytest.raises(precaudit.InputError, match="unknown dtype 'fp12'"):
        precaudit.audit(str(EXAMPLE), dtype="fp12")
    with pytest.raises(precaudit.InputError, match=r"expected a path, a list of paths, an onnx\.ModelProto or a torch"):
        precaudit.audit(42)
    report = precaudit.audit(str(tmp_path / "missing.onnx"))
    assert report.exit_code == 2 and [e.problem for e in report.errors] == ["no such file"]


def test_keep_list_and_fix_from_python(tmp_path):
    keep = precaudit.keep_list(ffn_overflow_transformer(tmp_path / "ffn.onnx"), "onnxruntime", trace=True)
    assert [n.name for n in keep.nodes] == ["/layers.1/ffn/wo/MatMul", "/layers.1/ffn/Add",
                                            "/layers.1.ffn_norm/LayerNormalization"]
    assert keep.verified and keep.exit_code == 3  # synthesized inputs only
    assert "node_block_list=['/layers.1/ffn/wo/MatMul'" in keep.code()
    model = fix_models.hot_softmax(tmp_path / "hot.onnx")
    result = precaudit.fix(model, tmp_path / "hot.fixed.onnx")
    assert result.written and result.exit_code == 3 and [r.kind for r in result.plan.repairs] == ["max-shift"]
    assert json.loads(result.to_json())["written"] is True


def test_importing_precaudit_loads_no_pipeline():
    import subprocess
    import sys

    code = ("import sys, precaudit; print(precaudit.__version__); "
            "print(sorted(m for m in sys.modules if m.startswith(('onnx', 'numpy', 'precaudit.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == [precaudit.__version__, "['precaudit.version']"]  # the version's own module, nothing else


def test_the_api_names_are_the_functions_after_every_subpackage_loads():
    """A subpackage named like a function (precaudit/fix/ once) is set on the package when imported and hides it."""
    import importlib

    from precaudit import api

    for module in ("precaudit.fixer.run", "precaudit.audit_models", "precaudit.keeplist", "precaudit.pipeline"):
        importlib.import_module(module)
    assert precaudit.audit is api.audit and precaudit.fix is api.fix and precaudit.keep_list is api.keep_list


# ---- every argument checked before any model is read --------------------------------------------------------------

DTYPES = "fp16, bf16, fp8-e4m3, fp8-e5m2, fp32, fp64, mxfp8, mxfp4, nvfp4"
CONVERTERS = "plain, onnxconverter-common, onnxruntime, olive, modelopt"
FOR = ("onnxconverter-common, onnxruntime, olive, modelopt, openvino, pytorch, torch-tensorrt, modelopt-quant, tensorrt, "
       "coreml, qnn, dml, webgpu")
TRACE_FIELDS = "dims, engine, inputs, progress, ranges, samples, seed, timeout"
PATH = "must be a path (str or os.PathLike)"
PATHS = "must be a list of paths (str or os.PathLike)"
STRINGS = "must be a list of strings"


def _trace_rows(name: str) -> list[tuple[dict, str]]:
    """A TraceOptions field wrong in type and in value, as trace= (audit, keep_list) or inputs= (fix) gives it."""
    rows = [({"engine": 1}, "['engine']: must be one of auto, onnxruntime, numpy, got 1"),
            ({"engine": "gpu"}, "['engine']: must be one of auto, onnxruntime, numpy, got 'gpu'"),
            ({"samples": True}, "['samples']: must be a whole number, got True"),
            ({"samples": 1.5}, "['samples']: must be a whole number, got 1.5"),
            ({"samples": 0}, "['samples']: must be at least 1, got 0"),
            ({"seed": "0"}, "['seed']: must be a whole number, got '0'"),
            ({"seed": -1}, "['seed']: must be at least 0, got -1"),
            ({"dims": [("batch", 2)]}, "['dims']: must be a dict of dim name to size, got [('batch', 2)]"),
            ({"dims": {"batch": 0}}, "['dims']: 'batch' must be a whole number >= 1, got 0"),
            ({"dims": {"batch": True}}, "['dims']: 'batch' must be a whole number >= 1, got True"),
            ({"ranges": {"x": 5}}, "['ranges']: 'x' must be a pair of finite numbers LO <= HI, got 5"),
            ({"ranges": {"x": (1, 0)}}, "['ranges']: 'x' must be a pair of finite numbers LO <= HI, got (1, 0)"),
            ({"ranges": {"x": (0, math.inf)}}, "['ranges']: 'x' must be a pair of finite numbers LO <= HI, got (0, inf)"),
            ({"timeout": "60"}, "['timeout']: must be a number, got '60'"),
            ({"timeout": math.nan}, "['timeout']: must be a finite number, got nan"),
            ({"timeout": -1}, "['timeout']: must be at least 0, got -1"),
            ({"inputs": "a.npz"}, f"['inputs']: {PATHS}, got the string 'a.npz' (write ['a.npz'])"),
            ({"progress": 1}, "['progress']: must be true or false, got 1"),
            ({"bogus": 1}, f": unknown option 'bogus' (choose from {TRACE_FIELDS})")]
    return [({name: value}, f"{name}{message}") for value, message in rows]


BAD_ARGUMENTS = [("audit", kwargs, message) for kwargs, message in [
    ({"model": 42}, "model: expected a path, a list of paths, an onnx.ModelProto or a torch.nn.Module, got int"),
    ({"model": ""}, f"model: {PATH}, got ''"),
    ({"model": []}, "model: an empty list names no model"),
    ({"model": ["a.onnx", 5]}, f"model: {PATHS}, got ['a.onnx', 5]"),
    ({"dtype": 16}, "dtype: must be a string, got 16"),
    ({"dtype": "fp12"}, f"dtype: unknown dtype 'fp12'; choose one of {DTYPES}"),
    ({"select": "PA1"}, f"select: {STRINGS}, got the string 'PA1' (write ['PA1'])"),
    ({"select": [1]}, f"select: {STRINGS}, got [1]"),
    ({"select": ["PA999"]}, "select: 'PA999' matches no rule id, name or id prefix (see `precaudit rules`)"),
    ({"ignore": "PA1"}, f"ignore: {STRINGS}, got the string 'PA1' (write ['PA1'])"),
    ({"ignore": ["eps-underflw"]}, "ignore: 'eps-underflw' matches no rule id, name or id prefix (see `precaudit rules`)"),
    ({"keep_fp32": 5}, f"keep_fp32: {STRINGS}, got 5"),
    ({"keep_fp32": "Softmax"}, f"keep_fp32: {STRINGS}, got the string 'Softmax' (write ['Softmax'])"),
    ({"converter": 5}, f"converter: must be one of {CONVERTERS}, got 5"),
    ({"converter": "tflite"}, f"converter: must be one of {CONVERTERS}, got 'tflite'"),
    ({"autocast": True}, "autocast: must be one of cuda, cpu, got True"),
    ({"autocast": "tpu"}, "autocast: must be one of cuda, cpu, got 'tpu'"),
    ({"trace": 5}, "trace: must be True, .npz paths or a dict of TraceOptions fields, got int"),
    ({"trace": [5]}, f"trace: {PATHS}, got [5]"),
    *_trace_rows("trace"),
    ({"config": 5}, 'config: must be "pyproject", None or the path of a pyproject.toml, got 5'),
    ({"config": "missing.toml"}, "missing.toml: no such configuration file"),
    ({"baseline": 5}, f"baseline: {PATH}, got 5"),
    ({"baseline": ""}, f"baseline: {PATH}, got ''"),
    ({"fail_on": 1}, "fail_on: must be one of error, warning, info, never, got 1"),
    ({"fail_on": "sometimes"}, "fail_on: must be one of error, warning, info, never, got 'sometimes'"),
    ({"rules": "org.yaml"}, f"rules: {PATHS}, got the string 'org.yaml' (write ['org.yaml'])"),
    ({"rules": [5]}, f"rules: {PATHS}, got [5]"),
    ({"preview": "yes"}, "preview: must be true or false, got 'yes'"),
    ({"check_weights": 1}, "check_weights: must be true or false, got 1"),
    ({"example_inputs": (1,)},
     "example_inputs: only a torch.nn.Module model takes them (a path or an ONNX model has its own inputs)"),
    ({"trust_pickle": "no"}, "trust_pickle: must be true or false, got 'no'"),
]] + [("keep_list", kwargs, message) for kwargs, message in [
    ({"model": ["a.onnx", "b.onnx"]}, "model: expected a path, an onnx.ModelProto or a torch.nn.Module, got list"),
    ({"model": 42}, "model: expected a path, an onnx.ModelProto or a torch.nn.Module, got int"),
    ({"for_": None}, f"for_: must be one of {FOR}, got None"),
    ({"for_": "tvm"}, f"for_: must be one of {FOR}, got 'tvm'"),
    ({"dtype": "fp12"}, f"dtype: unknown dtype 'fp12'; choose one of {DTYPES}"),
    ({"keep_fp32": "Softmax"}, f"keep_fp32: {STRINGS}, got the string 'Softmax' (write ['Softmax'])"),
    *_trace_rows("trace"),
    ({"tolerance": "x"}, "tolerance: must be a number, got 'x'"),
    ({"tolerance": True}, "tolerance: must be a number, got True"),
    ({"tolerance": math.nan}, "tolerance: must be a finite number, got nan"),
    ({"tolerance": 0}, "tolerance: must be above 0, got 0"),
    ({"tolerance": -1}, "tolerance: must be above 0, got -1"),
    ({"max_runs": 2.5}, "max_runs: must be a whole number, got 2.5"),
    ({"max_runs": True}, "max_runs: must be a whole number, got True"),
    ({"max_runs": 0}, "max_runs: must be at least 1, got 0"),
    ({"config": 5}, 'config: must be "pyproject", None or the path of a pyproject.toml, got 5'),
    ({"rules": [5]}, f"rules: {PATHS}, got [5]"),
]] + [("fix", kwargs, message) for kwargs, message in [
    ({"model": 5}, "model: expected a path or an onnx.ModelProto, got int"),
    ({"output": 5}, f"output: {PATH}, got 5"),
    ({"output": ""}, f"output: {PATH}, got ''"),
    ({"dtype": 16}, "dtype: must be a string, got 16"),
    ({"dtype": "fp32"}, "dtype fp32: fix repairs what a narrower dtype breaks; choose fp16, bf16 or an fp8 format"),
    ({"dry_run": "yes"}, "dry_run: must be true or false, got 'yes'"),
    ({"inputs": True}, "inputs: must be .npz paths or a dict of TraceOptions fields, got True"),
    ({"inputs": 5}, "inputs: must be True, .npz paths or a dict of TraceOptions fields, got int"),
    *_trace_rows("inputs"),
    ({"tolerance": "x"}, "tolerance: must be a number, got 'x'"),
    ({"tolerance": math.inf}, "tolerance: must be a finite number, got inf"),
    ({"tolerance": 0}, "tolerance: must be above 0, got 0"),
    ({"data_floor": True}, "data_floor True: choose keep, subnormal, normal or a number"),
    ({"data_floor": "x"}, "data_floor 'x': choose keep, subnormal, normal or a number"),
    ({"data_floor": 1.0},
     "data_floor 1.0: choose a value from 5.96e-08 (the smallest subnormal float16) to 1e-3"),
    ({"min_eps": "x"}, "min_eps: must be a number, got 'x'"),
    ({"min_eps": 1e-9}, "min_eps 1e-09: choose a value from 6.104e-05 (the smallest normal float16) to 1e-3 (larger "
                        "eps dominate ordinary variances)"),
    ({"keep_fp32": 5}, f"keep_fp32: {STRINGS}, got 5"),
    ({"converter": "tflite"}, f"converter: must be one of {CONVERTERS}, got 'tflite'"),
    ({"select": "PA1"}, f"select: {STRINGS}, got the string 'PA1' (write ['PA1'])"),
    ({"select": ["PA999"]}, "select: 'PA999' matches no rule id, name or id prefix (see `precaudit rules`)"),
    ({"ignore": [1]}, f"ignore: {STRINGS}, got [1]"),
    ({"trace": 1}, "trace: must be true or false, got 1"),
    ({"config": 5}, 'config: must be "pyproject", None or the path of a pyproject.toml, got 5'),
    ({"rules": "org.yaml"}, f"rules: {PATHS}, got the string 'org.yaml' (write ['org.yaml'])"),
]] + [("train_audit", kwargs, message) for kwargs, message in [
    ({"model": 5}, "model: expected a factory spec (model.py:make) or a torch.nn.Module, got int"),
    ({"model": ""}, f"model: {PATH}, got ''"),
    ({"select": "PA4"}, f"select: {STRINGS}, got the string 'PA4' (write ['PA4'])"),
    ({"ignore": [1]}, f"ignore: {STRINGS}, got [1]"),
    ({"rules": "org.yaml"}, f"rules: {PATHS}, got the string 'org.yaml' (write ['org.yaml'])"),
    ({"fail_on": "sometimes"}, "fail_on: must be one of error, warning, info, never, got 'sometimes'"),
    ({"baseline": 5}, f"baseline: {PATH}, got 5"),
]]


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A repository folder with no pyproject: the arguments alone decide."""
    (tmp_path / ".git").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _call(function: str, tmp_path: Path, kwargs: dict):
    """The function with the one wrong argument. audit, keep_list and train_audit get a model that does not exist:
    had they read it, the answer would be a Report entry or 'no such file', not the argument's error. fix gets a
    model it repairs and an output it would write."""
    kwargs = dict(kwargs)
    missing = str(tmp_path / "missing.onnx")
    if function == "fix":
        model = kwargs.pop("model", fix_models.layernorm(tmp_path / "ln.onnx"))
        return precaudit.fix(model, kwargs.pop("output", tmp_path / "ln.fixed.onnx"), **kwargs)
    if function == "keep_list":
        return precaudit.keep_list(kwargs.pop("model", missing), kwargs.pop("for_", "onnxruntime"), **kwargs)
    if function == "train_audit":
        return precaudit.train_audit(kwargs.pop("model", str(tmp_path / "missing.py") + ":make"), **kwargs)
    return precaudit.audit(kwargs.pop("model", missing), **kwargs)


@pytest.mark.parametrize("function,kwargs,message", BAD_ARGUMENTS,
                         ids=[f"{f}-{'-'.join(map(str, k))}-{i}" for i, (f, k, _) in enumerate(BAD_ARGUMENTS)])
def test_a_wrong_argument_is_one_line_naming_it_before_any_model_is_read(project, function, kwargs, message):
    with pytest.raises(precaudit.InputError) as caught:
        _call(function, project, kwargs)
    assert str(caught.value) == message
    assert "\n" not in message and len(message) < 200
    assert sorted(p.name for p in project.iterdir()) == sorted({".git", "ln.onnx"} if function == "fix" else {".git"})


def test_a_bare_string_for_a_list_is_refused_not_read_as_its_characters(project):
    """select="PA1" once selected the rules 'P', 'A' and '1' (and failed on 'A'); a tuple of strings is a list."""
    model = save(fused_norm("LayerNormalization", epsilon=1e-12, stash_type=0), project / "ln.onnx")
    with pytest.raises(precaudit.InputError, match=r"^select: must be a list of strings, got the string 'PA1'"):
        precaudit.audit(model, select="PA1")
    assert [(f.rule_id, f.node_name) for f in precaudit.audit(model, select=("PA1",)).findings] == [("PA101", "norm")]


def test_the_matching_good_values_still_work(project):
    import numpy as np

    from precaudit.options import TraceOptions

    model = save(fused_norm("LayerNormalization", epsilon=1e-12, stash_type=0), project / "ln.onnx")
    report = precaudit.audit(model, "fp16", select=("PA1",), ignore=[], keep_fp32=(), converter="plain",
                             autocast=None, fail_on="never", baseline=None, rules=(), preview=False,
                             check_weights=True, config=None, trust_pickle=False,
                             trace={"engine": "numpy", "samples": np.int64(2), "seed": np.int64(3), "dims": {},
                                    "ranges": {"x": (-1, 1)}, "timeout": 60, "inputs": ()})
    assert [(f.rule_id, f.node_name) for f in report.findings] == [("PA101", "norm")] and report.exit_code == 0
    run = report.outcome.result.traces[str(model)]
    assert (run.samples, run.seed, run.engine) == (2, 3, "numpy")
    report = precaudit.audit([model, Path("ln.onnx")], trace=TraceOptions(samples=2, engine="numpy"), select=["PA101"])
    assert [(f.rule_id, f.model) for f in report.findings] == [("PA101", str(model)), ("PA101", "ln.onnx")]
    (project / "pyproject.toml").write_text('[tool.precaudit]\nfail-on = "never"\n')
    assert precaudit.audit(model, config=project / "pyproject.toml").exit_code == 0
    assert precaudit.audit(model, config=None).exit_code == 1
    keep = precaudit.keep_list(model, "onnxruntime", tolerance=0.02, max_runs=np.int64(5), trace={"engine": "numpy"})
    assert [n.name for n in keep.nodes] == ["norm"]
    result = precaudit.fix(fix_models.layernorm(project / "dln.onnx"), project / "dln.fixed.onnx", "fp16",
                           data_floor=1e-7, min_eps=1e-4, tolerance=0.05, inputs={"samples": 1, "seed": 0},
                           select=("PA1",))
    assert result.written and [(r.kind, r.after) for r in result.plan.repairs] == \
        [("eps-raise", "eps 0.0001 (new initializer 'add_eps/precaudit_eps', float32)")]
    assert (project / "dln.fixed.onnx").is_file()


def test_report_rendering_arguments_are_checked(project):
    model = save(fused_norm("LayerNormalization", epsilon=1e-12, stash_type=0), project / "ln.onnx")
    report = precaudit.audit(model)
    with pytest.raises(precaudit.InputError, match=r"^color: must be true or false, got 'no'$"):
        report.to_text(color="no")
    assert "PA101" in report.to_text(color=False, group=False)


# ---- the command line refuses what the API refuses, in the same words --------------------------------------------

AGREEMENT = [  # (API call, command-line arguments after the model, how each names the value, the problem)
    ("audit", {"dtype": "fp12"}, ["--dtype", "fp12"], ("dtype", "--dtype"),
     f"unknown dtype 'fp12'; choose one of {DTYPES}"),
    ("audit", {"converter": "tflite"}, ["--converter", "tflite"], ("converter", "--converter"),
     f"must be one of {CONVERTERS}, got 'tflite'"),
    ("audit", {"autocast": "tpu"}, ["--autocast", "tpu"], ("autocast", "--autocast"),
     "must be one of cuda, cpu, got 'tpu'"),
    ("audit", {"fail_on": "sometimes"}, ["--fail-on", "sometimes"], ("fail_on", "Invalid value for '--fail-on'"),
     "must be one of error, warning, info, never, got 'sometimes'"),
    ("audit", {"select": ["PA999"]}, ["--select", "PA999"], ("select", "--select"),
     "'PA999' matches no rule id, name or id prefix (see `precaudit rules`)"),
    ("audit", {"trace": {"engine": "gpu"}}, ["--trace", "--trace-engine", "gpu"], ("trace['engine']", "--trace-engine"),
     "must be one of auto, onnxruntime, numpy, got 'gpu'"),
    ("audit", {"trace": {"dims": {"batch": 0}}}, ["--trace", "--dim", "batch=0"], ("trace['dims']", "--dim"),
     "'batch' must be a whole number >= 1, got 0"),
    ("audit", {"trace": {"ranges": {"x": (3.0, 1.0)}}}, ["--trace", "--range", "x=3:1"], ("trace['ranges']", "--range"),
     "'x' must be a pair of finite numbers LO <= HI, got (3.0, 1.0)"),
    ("keep_list", {"for_": "tvm"}, ["--for", "tvm"], ("for_", "--for"), f"must be one of {FOR}, got 'tvm'"),
    ("keep_list", {"tolerance": 0}, ["--for", "onnxruntime", "--tolerance", "0"], ("tolerance", "--tolerance"),
     "must be above 0, got 0"),
    ("fix", {"data_floor": "x"}, ["--data-floor", "x"], ("data_floor", "--data-floor"),
     "'x': choose keep, subnormal, normal or a number"),
    ("fix", {"select": ["PA999"]}, ["--select", "PA999"], ("select", "--select"),
     "'PA999' matches no rule id, name or id prefix (see `precaudit rules`)"),
]


@pytest.mark.parametrize("function,kwargs,args,names,problem", AGREEMENT,
                         ids=[f"{a[0]}-{a[3][1]}" for a in AGREEMENT])
def test_the_command_line_refuses_the_same_values(project, capsys, function, kwargs, args, names, problem):
    with pytest.raises(precaudit.InputError) as caught:
        _call(function, project, kwargs)
    api_name, cli_name = names
    separator = " " if function == "fix" and "data_floor" in kwargs else ": "
    assert str(caught.value) == f"{api_name}{separator}{problem}"
    model = project / "ln.onnx" if function == "fix" else project / "missing.onnx"
    command = {"audit": [], "keep_list": ["keep-list"], "fix": ["fix", "-o", str(project / "out.onnx")]}[function]
    assert main([*command, str(model), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{cli_name}{separator}{problem}" in err, err
    assert not (project / "out.onnx").exists()


def test_a_pyproject_value_is_refused_in_the_same_words(project, capsys):
    (project / "pyproject.toml").write_text('[tool.precaudit]\nconverter = "tflite"\n')
    with pytest.raises(precaudit.InputError) as caught:
        precaudit.audit(str(project / "missing.onnx"))
    assert str(caught.value) == f"pyproject.toml: [tool.precaudit] converter: must be one of {CONVERTERS}, got 'tflite'"


@pytest.mark.parametrize("options", [{}, {"trace": True}, {"dtype": "bf16"}, {"autocast": "cpu"}],
                         ids=["static", "traced", "bf16", "autocast"])
@pytest.mark.requires("torch")
def test_auditing_an_nn_module_leaves_it_as_it_was(options):
    """The caller's module keeps its parameters, buffers, their dtypes and its training mode (issue 37: it came back
    half precision and in eval mode)."""
    import torch
    module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.LayerNorm(8)).train()
    before = {name: (t.dtype, t.detach().clone()) for name, t in module.state_dict().items()}
    report = precaudit.audit(module, **{"dtype": "fp16", **options}, example_inputs=torch.randn(4, 8))
    assert report.errors == []
    after = module.state_dict()
    assert {n: t.dtype for n, t in after.items()} == {n: d for n, (d, _) in before.items()}
    assert all(torch.equal(after[n], t) for n, (_, t) in before.items())
    assert all(m.training for m in module.modules())


@pytest.mark.requires("onnxruntime")
def test_keep_list_of_a_modelproto_prints_a_snippet_that_runs_on_it(tmp_path, monkeypatch):
    """No scratch path in the snippet (it was deleted when keep_list returned): the caller's ModelProto is the
    variable `model`, and the snippet run as printed with it converts and writes OUTPUT_PATH."""
    from fixtures.onnx_builders import decomposed_layernorm

    proto = decomposed_layernorm(1e-12, dtype="fp32")[0]
    keep = precaudit.keep_list(proto, "onnxruntime")
    snippet = keep.code()
    assert "precaudit-" not in snippet and "onnx.load(" not in snippet
    assert "# model: the onnx.ModelProto you passed to precaudit.keep_list()" in snippet
    assert keep.to_text().splitlines()[0].startswith("<onnx.ModelProto ")
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, "<snippet>", "exec"), {"model": proto})
    import onnx

    written = onnx.load(str(tmp_path / "model.fp16.onnx"))
    assert {n.name for n in written.graph.node} >= {"mean", "sub", "pow", "var", "add_eps", "sqrt", "div"}


@pytest.mark.requires("torch")
def test_keep_list_takes_a_module_as_audit_does():
    import torch

    class Norm(torch.nn.Module):
        def forward(self, x):
            mean = x.mean(-1, keepdim=True)
            return (x - mean) / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + 1e-12)

    module = torch.nn.Sequential(torch.nn.Linear(8, 8), Norm())
    keep = precaudit.keep_list(module, "pytorch", example_inputs=torch.randn(2, 8))
    assert keep.to_json() and [n for n in keep.code().splitlines() if n.startswith("KEEP_FP32")] == \
        ["KEEP_FP32 = ['1']"]
    assert all(p.dtype == torch.float32 for p in module.parameters())


def test_fix_takes_a_modelproto_and_results_print_short(tmp_path):
    """fix() of an in-memory model writes OUTPUT and names the object; repr() of a Report, a KeepList and a
    FixResult is one short line (the dataclasses' were 6,000 to 13,000 characters)."""
    from fixtures.onnx_builders import decomposed_layernorm

    proto = decomposed_layernorm(1e-12, dtype="fp32")[0]
    proto.graph.name = "ln"
    result = precaudit.fix(proto, output=tmp_path / "fixed.onnx")
    assert result.written and (tmp_path / "fixed.onnx").exists() and result.model == "<onnx.ModelProto ln>"
    assert repr(result) == (f"<precaudit.FixResult <onnx.ModelProto ln> → {tmp_path / 'fixed.onnx'}: 1 repairs, "
                            f"written, 1 of 2 findings fixed, exit code {result.exit_code}>")
    keep = precaudit.keep_list(proto, "onnxruntime")
    assert repr(keep) == f"<precaudit.KeepList <onnx.ModelProto ln> --for onnxruntime: 7 nodes kept, static, " \
                         f"exit code {keep.exit_code}>"
    assert len(repr(precaudit.audit(proto))) < 300


def test_to_text_says_why_a_model_could_not_be_audited(tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    text = precaudit.audit(str(broken)).to_text()
    assert text.splitlines()[-1].startswith(f"could not audit {broken}: ")
