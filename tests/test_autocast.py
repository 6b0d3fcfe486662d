"""--autocast: a float32 module audited as torch.autocast runs it, next to the same module under model.half().

The fixtures (fixtures/torch_src/autocast_cases.py, hf_models.py) each have their exact findings in four runs:
autocast fp16 and bf16 (--autocast cuda), model.half() and model.to(bfloat16) (--dtype). The policy lists are
read from the installed torch; POLICY keeps torch 2.13's and the drift tests fail when torch's own change.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from precaudit.cli import main  # noqa: E402
from precaudit.frontends.autocast_policy import POLICY, POLICY_TORCH, registered_ops  # noqa: E402
from precaudit.options import TorchOptions  # noqa: E402
from tests.helpers import run_json  # noqa: E402

SRC = Path(__file__).resolve().parent.parent / "fixtures" / "torch_src"
CASES = SRC / "autocast_cases.py"
HF = SRC / "hf_models.py"

MODES = {
    "autocast-fp16": ("--autocast", "cuda"),
    "autocast-bf16": ("--autocast", "cuda", "--dtype", "bf16"),
    "half": (),  # --dtype fp16: model.half()
    "bf16": ("--dtype", "bf16"),
}
NONE: dict[str, tuple[str, ...]] = {mode: () for mode in MODES}


pytestmark = pytest.mark.slow  # PyTorch captures and real steps: seconds each


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def findings(tmp_path, spec: str, *args: str) -> list[dict]:
    _, report = run_json([spec], *args, out_dir=tmp_path)
    assert report["errors"] == []
    return report["results"]


def rule_ids(results: list[dict]) -> tuple[str, ...]:
    return tuple(sorted(r["rule_id"] for r in results))


# ---- the policy, read from torch ------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_torch_registers_the_tabled_autocast_lists(device):
    """Fails when torch's autocast lists change (a torch upgrade): update POLICY, the fixtures' expectations and
    docs/pytorch.md after reading the new aten/src/ATen/autocast_mode.cpp."""
    tabled = {f"aten::{op}" for ops in POLICY[device].values() for op in ops}
    live = registered_ops(device)
    assert live - tabled == set(), f"new in torch {torch.__version__} (tabled: {POLICY_TORCH})"
    assert tabled - live == set(), f"gone in torch {torch.__version__} (tabled: {POLICY_TORCH})"


def _probe(op_name: str, device: str, dtype: torch.dtype) -> torch.dtype | None:
    """The output dtype of an autocast kernel on fake tensors of one dtype, for ops whose arguments are easy to
    make (tensors of one shape, defaults elsewhere); None when no shape fits."""
    op, _, overload = op_name.partition(".")
    packet = getattr(torch.ops.aten, op)
    fn = getattr(packet, overload or "default")
    for shape in [(4, 4), (2, 4, 4), (2, 2, 4, 4), (4,)]:
        args = []
        for a in fn._schema.arguments:
            kind = str(a.type)
            if kind in ("Tensor", "Tensor?"):
                args.append(torch.empty(shape, dtype=dtype, device=device))
            elif a.has_default_value() or a.kwarg_only:
                break
            elif kind == "Tensor[]":
                args.append([torch.empty(shape, dtype=dtype, device=device)] * 2)
            elif kind in ("int", "SymInt"):
                args.append(-1)
            elif kind in ("int[]", "int[1]", "SymInt[]"):
                args.append([1])
            elif kind == "Scalar":
                args.append(2)
            elif kind == "str":
                args.append("ij,jk->ik")
            else:
                args.append(None)
        try:
            out = fn(*args)
        except Exception:
            continue
        out = out[0] if isinstance(out, (tuple, list)) else out
        return out.dtype
    return None


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_kernels_behave_as_their_tabled_policy(device):
    """Each op's kernel, run on fake tensors under autocast, casts as its policy says (where it can be probed)."""
    import logging

    from torch._subclasses.fake_tensor import FakeTensorMode

    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)  # the probes that do not fit
    checked = Counter()
    saved = torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)
    with FakeTensorMode(), torch.no_grad():
        torch.set_autocast_enabled(device, True)
        torch.set_autocast_dtype(device, torch.float16)
        try:
            for policy, ops in POLICY[device].items():
                for op in ops:
                    as32, as16 = _probe(op, device, torch.float32), _probe(op, device, torch.float16)
                    if as32 is None or as16 is None:
                        continue
                    if policy == "lower_precision_fp":
                        assert as32 == torch.float16, op
                    elif policy.startswith("fp32"):
                        assert as16 != torch.float16, op  # float32, or complex64 (fft), int64 (rank)
                    elif policy == "promote":
                        assert (as32, as16) == (torch.float32, torch.float16), op
                    checked[policy] += 1
        finally:
            torch.set_autocast_enabled(device, saved[0])
            torch.set_autocast_dtype(device, saved[1])
    assert checked["lower_precision_fp"] >= 5 and checked["fp32"] >= 5  # the probe really ran


# ---- the fixtures, four ways ----------------------------------------------------------------------------


STATIC = {
    # hand-written RMSNorm on a projection: under autocast x*x and mean have no rule, so they stay float16 as in
    # .half(); the eps 1e-6 is subnormal there
    "rmsnorm": {**NONE, "autocast-fp16": ("PA102", "PA208"), "half": ("PA102", "PA208")},
    "rmsnorm_upcast": NONE,
    # hand-written LayerNorm: autocast lifts pow (and with it the variance and its eps) to float32
    "layernorm": {**NONE, "half": ("PA102", "PA208")},
    # the overflow is in the float16 matmul before the float32 softmax: no static rule sees it (traced does)
    "attention": NONE,
    # finfo(float32).min on float16 (or bfloat16) scores: -inf in every low-precision run
    "masked_fill": {mode: ("PA209",) for mode in MODES},
    "disabled_region": NONE,
    "disabled_region_no_cast": {**NONE, "autocast-fp16": ("PA102", "PA208"), "half": ("PA102", "PA208")},
}


@pytest.mark.parametrize("mode", [m if m == "autocast-fp16" else pytest.param(m, marks=pytest.mark.slow) for m in MODES])
@pytest.mark.parametrize("case", STATIC)
def test_static_findings_per_mode(tmp_path, case, mode):
    assert rule_ids(findings(tmp_path, f"{CASES}:{case}", *MODES[mode])) == STATIC[case][mode]


def test_reasons_name_autocasts_policy(tmp_path):
    results = findings(tmp_path, f"{CASES}:rmsnorm", "--autocast", "cuda")
    assert {r["values"]["compute_reason"] for r in results} == {
        "mean has no autocast(cuda) rule: it runs in its input's float16, from linear at 'linear'"}
    assert {r["source_line"] for r in results} == {line_of(CASES, "eps 1e-6 meets the float16 variance")}
    half = findings(tmp_path, f"{CASES}:rmsnorm")
    assert {r["values"]["compute_reason"] for r in half} == {
        "--dtype fp16: the module was converted with model.to(float16)"}


def test_disabled_region_says_so(tmp_path):
    results = findings(tmp_path, f"{CASES}:disabled_region_no_cast", "--autocast", "cuda")
    assert {r["values"]["compute_reason"] for r in results} == {
        "autocast(cuda) is off here (autocast(enabled=False)): mean runs in its input's float16, from linear at "
        "'linear'"}


def test_mask_fill_reason(tmp_path):
    [result] = findings(tmp_path, f"{CASES}:masked_fill", "--autocast", "cuda")
    assert result["values"]["compute_reason"] == \
        "masked_fill has no autocast(cuda) rule: it runs in its input's float16, from matmul at 'matmul'"
    assert result["source_line"] == line_of(CASES, "float16 under autocast: -inf")


def _graph(spec: str, autocast: str | None = "cuda", target: str = "fp16"):
    from precaudit.frontends.torch_graph import load_torch_graph

    return load_torch_graph(spec, TorchOptions(autocast=autocast), target)


def _notes(graph, op_type: str) -> set[tuple[str, str]]:
    return {(v.dtype, v.dtype_note) for n in graph.nodes if n.op_type == op_type for v in n.outputs[:1]}


def test_every_float_value_says_why():
    graph = _graph(f"{CASES}:layernorm")
    floats = [v for n in graph.nodes for v in [*n.inputs, *n.outputs] if v is not None and v.dtype in ("fp16", "fp32")]
    assert floats and all(v.dtype_note for v in floats)
    assert _notes(graph, "linear") == {("fp16", "autocast(cuda) runs linear in float16")}
    assert _notes(graph, "Pow") == {("fp32", "autocast(cuda) lifts pow to float32")}
    # the Linear's float32 input and weights are cast first: the Cast nodes autocast inserts
    casts = [n for n in graph.nodes if n.op_type == "Cast" and "/autocast:" in n.name]
    assert {n.outputs[0].dtype for n in casts} == {"fp16", "fp32"}


def test_an_upcast_does_not_change_the_value_it_reads(tmp_path):
    """x.float() in a float32 capture would alias x: every later use of x would read the cast."""
    model = tmp_path / "model.py"
    model.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.proj = torch.nn.Linear(8, 8)\n"
        "    def forward(self, x):\n"
        "        h = self.proj(x)\n"
        "        wide = h.float()\n"
        "        return wide.exp(), h * h\n"
        "def make():\n"
        "    return M(), (torch.randn(2, 8),)\n")
    graph = _graph(f"{model}:make")
    [square] = [n for n in graph.nodes if n.op_type == "Mul"]
    assert square.outputs[0].dtype == "fp16"  # h is float16 under autocast; wide is float32, h is not
    [cast] = [n for n in graph.nodes if n.op_type == "Cast" and "/autocast:" not in n.name]
    assert cast.outputs[0].dtype == "fp32" and "the model's own cast to float32" in cast.outputs[0].dtype_note


def test_no_grad_block_is_lowered(tmp_path):
    """A `with torch.no_grad()` block is a region of its own in the program: its ops are audited too."""
    model = tmp_path / "model.py"
    model.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.proj = torch.nn.Linear(8, 8)\n"
        "    def forward(self, x):\n"
        "        h = self.proj(x)\n"
        "        with torch.no_grad():\n"
        "            v = (h * h).mean(-1, keepdim=True)\n"
        "        return h * torch.rsqrt(v + 1e-6)\n"
        "def make():\n"
        "    return M(), (torch.randn(2, 8),)\n")
    for mode in ("autocast-fp16", "half"):
        assert rule_ids(findings(tmp_path, f"{model}:make", *MODES[mode])) == ("PA102", "PA208")


@pytest.mark.requires("transformers")
def test_transformers_models_under_autocast():
    """Llama as autocast runs it: projections in float16, the residual stream float32 (a float16 + float32 add
    promotes), RMSNorm's pow lifted, the eager softmax with a float32 output."""
    graph = _graph(f"{HF}:llama")
    assert _notes(graph, "linear") == {("fp16", "autocast(cuda) runs linear in float16")}
    assert _notes(graph, "Pow") == {("fp32", "autocast(cuda) lifts pow to float32")}
    assert _notes(graph, "Softmax") == {("fp32", "autocast(cuda) runs softmax with a float32 output")}
    residual = {note for dtype, note in _notes(graph, "Add") if dtype == "fp32"}
    assert "add has no autocast(cuda) rule: type promotion runs it in float32" in residual


@pytest.mark.parametrize("model", ["llama", "bert", "t5"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.requires("transformers")
@pytest.mark.slow
def test_transformers_models_static_findings(tmp_path, model, mode):
    # well written for both: Llama and T5 upcast their RMSNorms, BERT's LayerNorm is fused (float32 statistics,
    # and autocast lifts layer_norm); masks are finfo(dtype).min of the embedding dtype, float32 under autocast,
    # added to float16 scores in float32
    assert rule_ids(findings(tmp_path, f"{HF}:{model}", *MODES[mode])) == ()


@pytest.mark.requires("transformers")
def test_library_op_points_at_the_modules_forward():
    graph = _graph(f"{HF}:t5")
    import transformers.models.t5.modeling_t5 as t5

    pow_ = next(n for n in graph.nodes if n.op_type == "Pow")
    source = Path(t5.__file__)
    assert Path(pow_.source_file).resolve() == source.resolve()
    assert pow_.source_line == line_of(source, "variance = hidden_states.to(torch.float32).pow(2)")
    assert pow_.call_site == (HF.relative_to(Path.cwd()).as_posix() if HF.is_relative_to(Path.cwd()) else str(HF),
                              line_of(HF, "# the call"))


# ---- traced mode ----------------------------------------------------------------------------------------


TRACED = {
    # the fp16 matmul overflows before autocast's float32 softmax sees it
    ("attention", "autocast-fp16"): ("PA901", "PA906"),
    ("attention", "autocast-bf16"): (),
    ("layernorm", "autocast-fp16"): (),
    ("layernorm", "half"): ("PA102", "PA208", "PA901", "PA911"),  # pow(x - mean, 2) overflows in float16: finite, wrong
    ("rmsnorm", "autocast-fp16"): ("PA102", "PA208", "PA901", "PA911"),
    ("disabled_region", "autocast-fp16"): (),
}


@pytest.mark.parametrize("case,mode", TRACED)
def test_traced_findings(tmp_path, case, mode):
    assert rule_ids(findings(tmp_path, f"{CASES}:{case}", "--trace", *MODES[mode])) == TRACED[(case, mode)]


def test_traced_reason_names_the_policy(tmp_path):
    results = findings(tmp_path, f"{CASES}:attention", "--trace", "--autocast", "cuda")
    overflow = next(r for r in results if r["rule_id"] == "PA901")
    assert overflow["source_line"] == line_of(CASES, "logits of 10⁵")
    assert "autocast(cuda) runs matmul in float16" in json.dumps(overflow["values"])


@pytest.mark.slow
@pytest.mark.requires("transformers")
def test_t5_clamp_saves_half_but_not_autocast(tmp_path):
    """T5's feed-forward output beyond 65504: under .half() T5Block clamps the float16 residual stream; under
    autocast the stream is float32, the clamp is skipped and the inf from the float16 wo reaches the output."""
    import transformers.models.t5.modeling_t5 as t5

    spec = f"{HF}:t5_loud_ff"
    autocast = findings(tmp_path, spec, "--trace", "--autocast", "cuda")
    assert rule_ids(autocast) == ("PA901", "PA906")
    assert rule_ids(findings(tmp_path, spec, "--trace")) == ("PA901",)
    assert rule_ids(findings(tmp_path, spec, "--trace", "--autocast", "cuda", "--dtype", "bf16")) == ()
    wo = Path(t5.__file__)
    for result in autocast:
        assert Path(result["source_file"]).resolve() == wo.resolve()
        assert result["source_line"] == line_of(wo, "hidden_states = self.wo(hidden_states)")
        [related] = result["related_locations"]
        assert related["file"].endswith("hf_models.py") and related["line"] == line_of(HF, "# the call")


@pytest.mark.requires("transformers")
def test_sarif_keeps_the_call_site(tmp_path):
    out = tmp_path / "r.sarif"
    main([f"{HF}:t5_loud_ff", "--trace", "--autocast", "cuda", "-f", "sarif", "-o", str(out), "--exit-zero"])
    result = json.loads(out.read_text())["runs"][0]["results"][0]
    [related] = result["relatedLocations"]
    assert related["physicalLocation"]["artifactLocation"]["uri"].endswith("hf_models.py")
    assert related["physicalLocation"]["region"]["startLine"] == line_of(HF, "# the call")


# ---- inputs and settings --------------------------------------------------------------------------------


def test_pt2_program_under_autocast(tmp_path):
    from fixtures.torch_src.autocast_cases import rmsnorm

    module, args = rmsnorm()
    torch.export.save(torch.export.export(module, args), str(tmp_path / "m.pt2"))
    assert rule_ids(findings(tmp_path, str(tmp_path / "m.pt2"), "--autocast", "cuda")) == ("PA102", "PA208")


def test_pyproject_autocast_key(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.precaudit]\nautocast = "cuda"\n')
    (tmp_path / ".git").mkdir()
    monkeypatch.chdir(tmp_path)
    assert rule_ids(findings(tmp_path, f"{CASES}:layernorm")) == ()  # autocast: pow lifted
    assert rule_ids(findings(tmp_path, f"{CASES}:layernorm", "--dtype", "bf16")) == ()
    (tmp_path / "pyproject.toml").write_text('[tool.precaudit]\nautocast = "gpu"\n')
    assert main([f"{CASES}:layernorm"]) == 2


@pytest.mark.parametrize("args,words", [
    (("--autocast", "cuda", "--dtype", "fp32"), "use it with --dtype fp16 or bf16"),
    (("--autocast", "tpu"), "--autocast: must be one of cuda, cpu, got 'tpu'"),
])
def test_bad_autocast_is_one_line(capsys, args, words):
    assert main([f"{CASES}:layernorm", *args]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and words in err[0]


def test_torchscript_is_refused_under_autocast(tmp_path, capsys):
    from fixtures.torch_src.autocast_cases import LayerNormAfterLinear

    torch.jit.save(torch.jit.trace(LayerNormAfterLinear(), (torch.randn(2, 4, 16),)), str(tmp_path / "m.pt"))
    assert main([str(tmp_path / "m.pt"), "--input-shape", "2,4,16", "--autocast", "cuda"]) == 2
    assert "--autocast needs the module's ATen program" in capsys.readouterr().err


def test_reports_say_the_module_ran_under_autocast(tmp_path, capsys):
    """The text header and the JSON settings name the autocast device: the same findings mean a different run."""
    assert main([f"{CASES}:rmsnorm", "--autocast", "cuda"]) in (0, 1)
    assert f"{CASES}:rmsnorm  (--dtype fp16 --autocast cuda)" in capsys.readouterr().out
    _, report = run_json([f"{CASES}:rmsnorm"], "--autocast", "cuda", out_dir=tmp_path)
    assert report["settings"]["autocast"] == "cuda"
    _, report = run_json([f"{CASES}:rmsnorm"], out_dir=tmp_path)
    assert report["settings"]["autocast"] is None


def test_a_multi_output_op_keeps_each_outputs_dtype(tmp_path):
    """broadcast_tensors of autocast's float16 linear output and a float32 tensor promotes nothing (each output
    keeps its input's dtype, as PyTorch runs it): no cast of the float32 input to float16 is made up."""
    model = tmp_path / "model.py"
    model.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.proj = torch.nn.Linear(8, 8)\n"
        "    def forward(self, x, y):\n"
        "        h, w = torch.broadcast_tensors(self.proj(x), y)\n"
        "        return h * h, w.exp()\n"
        "def make():\n"
        "    return M(), (torch.randn(2, 8), torch.randn(1, 8))\n")
    graph = _graph(f"{model}:make")
    [broadcast] = [n for n in graph.nodes if n.op_type == "broadcast_tensors"]
    assert [v.dtype for v in broadcast.inputs] == ["fp16", "fp32"]
    assert not [n for n in graph.nodes if n.op_type == "Cast" and n.name.startswith("broadcast_tensors/")]
