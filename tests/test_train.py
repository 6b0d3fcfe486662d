"""precaudit train beyond the fixtures: the Python API, bad input as one line and exit 2, the arithmetic the rules
state, and the emulation against a real bfloat16 CPU run."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import precaudit  # noqa: E402
from fixtures.train_models import adam_eps_1e_8, adamw_lr_1e_5, spec  # noqa: E402
from precaudit.cli import main  # noqa: E402

pytestmark = pytest.mark.slow  # PyTorch captures and real steps: seconds each


def test_api_takes_objects_and_finds_what_the_command_finds():
    model, x, loss_fn, optimizer = adam_eps_1e_8()
    report = precaudit.train_audit(model, x, loss_fn, optimizer, regime="fp16", trace=True, select=["PA401", "PA454"])
    assert report.errors == []
    assert sorted((f.rule_id, f.node_name) for f in report.findings) == [("PA401", "Adam.eps"),
                                                                         ("PA454", "optimizer step")]
    assert report.exit_code == 1
    # the user's model and optimizer were not stepped
    fresh, *_ = adam_eps_1e_8()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))


def _one_line_error(capsys, *args: str) -> str:
    code = main(["train", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "Traceback" not in err[0]
    return err[0]


def test_output_that_is_no_scalar_loss(tmp_path, capsys):
    src = tmp_path / "m.py"
    src.write_text("import torch\ndef make():\n    return torch.nn.Linear(4, 3), torch.randn(2, 4)\n")
    line = _one_line_error(capsys, f"{src}:make")
    assert "the model's output is a (2, 3) float32 tensor, not a scalar float loss" in line


def test_loss_that_depends_on_no_parameter(tmp_path, capsys):
    src = tmp_path / "m.py"
    src.write_text("import torch\ndef make():\n    m = torch.nn.Linear(4, 3)\n"
                   "    return m, torch.randn(2, 4), lambda out: (out.detach() ** 2).sum()\n")
    line = _one_line_error(capsys, f"{src}:make", "--trace")
    assert "the loss does not depend on any parameter" in line


def test_module_name_torch_cannot_write_as_source(tmp_path, capsys):
    """torch.fx writes the captured program as Python source and cannot quote a module named with a quote: one
    line naming the step that failed, not an internal error."""
    src = tmp_path / "m.py"
    src.write_text("import torch\ndef make():\n    m = torch.nn.Sequential()\n"
                   "    m.add_module('a\"b', torch.nn.Linear(4, 1))\n"
                   "    return m, torch.randn(2, 4), lambda out: out.square().mean()\n")
    line = _one_line_error(capsys, f"{src}:make", "--trace")
    assert "building the captured program (torch.export's ExportedProgram.module()) failed: SyntaxError" in line


def test_optimizer_it_does_not_model(tmp_path, capsys):
    src = tmp_path / "m.py"
    src.write_text("import torch\ndef make():\n    m = torch.nn.Linear(4, 1)\n"
                   "    return m, torch.randn(2, 4), lambda out: out.sum(), torch.optim.RMSprop(m.parameters())\n")
    line = _one_line_error(capsys, f"{src}:make")
    assert "the optimizer RMSprop is not one the audit models; it models torch.optim's SGD, Adam, AdamW" in line


def test_unknown_regime(capsys):
    line = _one_line_error(capsys, spec("adam_eps_1e_8"), "--regime", "fp8")
    assert "unknown regime 'fp8'; choose from amp-fp16, amp-bf16, bf16, fp16" in line


def test_pa402_counts_exactly_the_updates_that_round_back():
    """Independently of the audit: w ± lr both rounding back to w in bfloat16 (ml_dtypes, from float64)."""
    model, *_ = adamw_lr_1e_5()
    expected = 0
    for p in model.parameters():
        w = p.detach().numpy().astype(ml_dtypes.bfloat16)
        wide = w.astype(np.float64)
        expected += int(((((wide + 1e-5).astype(ml_dtypes.bfloat16)) == w)
                         & (((wide - 1e-5).astype(ml_dtypes.bfloat16)) == w)).sum())
    report = precaudit.train_audit(spec("adamw_lr_1e_5"), regime="bf16", select=["PA402"])
    (finding,) = report.findings
    assert finding.values["absorbed_elements"] == expected == 3876


def test_rule_examples_arithmetic():
    f16 = np.float16
    assert f16(1e-8) == 0  # PA401
    assert f16(1e-3 * 1e-3 * 1e-3) == 0  # PA401: (1 - 0.999) * g**2 for g = 1e-3
    assert 1 / (2 * math.sqrt(1e-12)) == pytest.approx(5e5)  # PA403
    assert 1 / (2 * math.sqrt(float(f16(1e-5)))) == pytest.approx(158, abs=0.5)
    bf = ml_dtypes.bfloat16
    assert float(np.array(0.02, dtype=bf)) + 1e-5 == pytest.approx(0.02, abs=1e-4)
    assert np.array(np.array(0.02, dtype=bf).astype(np.float64) + 1e-5).astype(bf) == np.array(0.02, dtype=bf)  # PA402
    assert pytest.approx(6.1e-5, rel=1e-3) == 2.0 ** -6 * 2.0 ** -7 / 2


def test_emulated_bf16_agrees_with_a_real_bf16_cpu_step():
    """Ground truth: model.to(bfloat16) stepped with PyTorch's own CPU kernels leaves the same weights unchanged
    (to within a few elements where the two roundings of a sum differ) as the emulation says."""
    from precaudit.train.factory import setup_of
    from precaudit.train.regimes import REGIMES
    from precaudit.train.step import run_steps

    model, x, loss_fn, optimizer = adamw_lr_1e_5()
    result = run_steps(setup_of("adamw", (model, x, loss_fn, optimizer)), REGIMES["bf16"])
    real = adamw_lr_1e_5()[0].to(torch.bfloat16)
    before = [p.detach().clone() for p in real.parameters()]
    opt = torch.optim.AdamW(real.parameters(), lr=1e-5, weight_decay=0.0, foreach=False)
    loss_fn(real(x.to(torch.bfloat16))).backward()
    opt.step()
    real_absorbed = [int((p.detach() == b).sum()) for p, b in zip(real.parameters(), before)]
    emulated = [s.absorbed for s in result.params]
    assert [s.name for s in result.params] == [n for n, _ in real.named_parameters()]
    for got, want in zip(emulated, real_absorbed):
        assert abs(got - want) <= max(2, want // 100), (emulated, real_absorbed)


def test_window_counts_exponents_as_frexp_does():
    """The loss-scale window's bottom from float32's exponent bits equals the one from frexp, zeros, negative and
    subnormal float32 values included; its top is the largest power of two that keeps the backward's max finite."""
    from precaudit.dtypes import FORMATS
    from precaudit.train.stats import KEEP_FRACTION
    from precaudit.train.stats import window as _window

    torch.manual_seed(0)
    g = torch.randn(50_000) * torch.logspace(-12, -3, 50_000)
    g[::9] = 0.0
    g[::13] = -g[::13]
    g[:40] = 1e-40  # float32 subnormals
    grads = {"a": g[:20_000].clone(), "b": g[20_000:].clone().reshape(100, 300), "c": None}
    smallest, largest = _window(grads, 3.0, FORMATS["fp16"])
    nonzero = g[g != 0]
    exps = torch.frexp(nonzero).exponent
    lost_at = sorted(exps.tolist())[int((1 - KEEP_FRACTION) * nonzero.numel())]  # the first exponent not allowed
    assert smallest == 2.0 ** (-24 - lost_at)
    assert largest == 2.0 ** 14  # 3 * 2**14 = 49152 < 65504 <= 3 * 2**15
    assert _window({"a": torch.zeros(8)}, 0.0, FORMATS["fp16"]) == (None, None)


def test_gradient_counts_are_exact_with_reused_scratch_and_without_a_mask():
    """Elements lost to 0 and subnormal at the scale, among the reference's nonzero ones: -0.0 is 0, a NaN is not;
    the same counts where every reference element is nonzero (no mask), and from scratch tensors left larger and
    dirty by a previous parameter."""
    from precaudit.dtypes import FORMATS
    from precaudit.train.stats import Scratch, lost_share, subnormal_share

    fp16 = FORMATS["fp16"]
    scratch = Scratch()
    big = torch.ones(1000)
    assert lost_share(big != 0, big, 1000, scratch) == 0.0 and subnormal_share(None, big, 1.0, 1000, fp16, scratch) == 0
    g_ref = torch.tensor([1.0, 2.0, 0.0, 3.0, -4.0, 5.0, 6.0, 7.0])
    g = torch.tensor([0.0, 2.0, 0.0, -0.0, math.nan, 1e-9, 3e-8, 1.0])
    assert lost_share(g_ref != 0, g, 7, scratch) == 2 / 7  # the 0.0 and the -0.0; not the reference's own 0
    assert subnormal_share(g_ref != 0, g, 1024.0, 7, fp16, scratch) == 2 / 7  # 1e-9 and 3e-8, times 1024
    assert lost_share(None, g, 8, scratch) == 3 / 8
    assert lost_share(None, g.half(), 8) == 4 / 8  # 1e-9 is 0 in float16 too
    assert subnormal_share(None, g, 1024.0, 8, fp16, scratch) == 2 / 8


def test_all_finite_is_exact_where_a_sum_overflows():
    from precaudit.train.emulate import all_finite

    assert all_finite(torch.tensor([3e38, 3e38]))  # the sum overflows, every element is finite
    assert not all_finite(torch.tensor([1.0, float("nan")]))
    assert not all_finite(torch.tensor([1.0, float("-inf")]))
    assert not all_finite(torch.tensor([60000.0, float("inf")], dtype=torch.float16))
    assert all_finite(torch.tensor([60000.0, 60000.0], dtype=torch.float16))
    assert all_finite(torch.tensor([]))


def test_emulated_ops_on_reused_upcast_buffers_round_as_on_fresh_copies():
    """The emulation's float32 copies of large float16 inputs come from buffers reused from op to op: a transposed
    or permuted input is copied with its own strides, so each op's float16 output is bit-identical to the op on
    .float()'s copies rounded once, however often the buffers are reused; an output that holds a buffer's memory
    keeps it (the buffer is not handed to the next op)."""
    from precaudit.train.emulate import Recorder, RoundingMode, _Scratch

    torch.manual_seed(0)
    a = (torch.randn(300, 400) * 1e-3).half()
    b = torch.randn(300, 500).half()
    c = torch.randn(20, 30, 200).half()
    want = [a.t().float().mm(b.float()).half(), (a.float() * b.float()[:, :400]).half(),
            c.permute(2, 0, 1).float().softmax(-1).half()]
    mode = RoundingMode(Recorder())
    with mode:
        for _ in range(3):  # the second and third runs take the first's buffers
            got = [a.t().mm(b), a * b[:, :400], c.permute(2, 0, 1).softmax(-1)]
            assert all(g.dtype == torch.float16 and g.stride() == w.stride() and torch.equal(g.view(torch.int16),
                       w.view(torch.int16)) for g, w in zip(got, want))
    assert mode._scratch.free  # it did reuse buffers
    scratch, taken = _Scratch(), []
    copy = scratch.upcast(a, taken)
    scratch.give_back(taken, [copy.view(-1)])  # an op that returned (a view of) its input's copy
    assert scratch.free == {}
    scratch.give_back(taken, [copy.sum()])
    assert [t.numel() for t in scratch.free[a.numel()]] == [a.numel()]


def test_emulated_fp16_agrees_with_a_real_fp16_cpu_step():
    """Ground truth in float16: model.half() stepped with PyTorch's own CPU kernels. Adam's eps 1e-8 is 0 there:
    the real step and the emulated one turn the same weights, element for element, into inf/NaN, and the
    emulation names the step's addcdiv_ as where it began (the forward and backward are finite)."""
    from precaudit.train.factory import setup_of
    from precaudit.train.regimes import REGIMES
    from precaudit.train.step import run_steps

    model, x, loss_fn, optimizer = adam_eps_1e_8()
    result = run_steps(setup_of("adam", (model, x, loss_fn, optimizer)), REGIMES["fp16"])
    real = adam_eps_1e_8()[0].half()
    opt = torch.optim.Adam(real.parameters(), lr=1e-3, eps=1e-8, foreach=False)
    loss_fn(real(x.half())).backward()
    opt.step()
    real_bad = [~torch.isfinite(p.detach()) for p in real.parameters()]
    emulated_bad = [~torch.isfinite(p.detach()) for _, p in result.module.named_parameters()]
    assert [int(b.sum()) for b in real_bad] == [int(b.sum()) for b in emulated_bad]
    assert all(bool((a == b).all()) for a, b in zip(real_bad, emulated_bad))
    assert sum(int(b.sum()) for b in real_bad) > 0
    event = result.first_step
    assert (event.op, event.phase, event.dtype) == ("aten.addcdiv_.default", "optimizer step", "float16")
    assert result.first_unscaled is None and not result.regime_finite and result.ref_finite


def _real_absorbed_per_step(make, steps: int) -> list[int]:
    """Per parameter, the element updates a real float32 AdamW step made that the same step on model.to(bfloat16)
    with PyTorch's CPU kernels left bit-identical, summed over the steps (each step against the weights before it)."""
    runs = []
    for dtype in (torch.float32, torch.bfloat16):
        model, x, loss_fn, _ = make()
        model = model.to(dtype)
        runs.append((model, x.to(dtype), loss_fn, torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0,
                                                                    foreach=False)))
    counts = [0] * len(list(runs[0][0].parameters()))
    for step in range(steps):
        before = [[p.detach().clone() for p in model.parameters()] for model, *_ in runs]
        for model, x, loss_fn, opt in runs:
            torch.manual_seed(step)
            loss_fn(model(x)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        for i, (ref, low, ref_b, low_b) in enumerate(zip(runs[0][0].parameters(), runs[1][0].parameters(), *before)):
            counts[i] += int(((ref.detach() != ref_b) & (low.detach() == low_b)).sum())
    return counts


def test_more_steps_count_each_steps_absorbed_updates_as_real_bf16_steps_do():
    """--steps 3: the float32 and the regime's weights are stepped three times each, and each step's updates that
    bf16 weights leave bit-identical are counted against the weights before that step: three real float32 and bf16
    CPU steps give the same counts (to within a few elements where two roundings of a sum differ), three times
    one step's here (sub-half-ulp updates never add up)."""
    from precaudit.train.factory import setup_of
    from precaudit.train.regimes import REGIMES
    from precaudit.train.step import run_steps

    one = run_steps(setup_of("adamw", adamw_lr_1e_5()), REGIMES["bf16"], steps=1)
    three = run_steps(setup_of("adamw", adamw_lr_1e_5()), REGIMES["bf16"], steps=3)
    assert three.steps == 3 and one.steps == 1
    real = _real_absorbed_per_step(adamw_lr_1e_5, 3)
    assert real[1] == real[3] == 0  # the biases start at 0: every update lands
    for got, want in zip([s.absorbed for s in three.params], real):
        assert abs(got - want) <= max(2, want // 100), ([s.absorbed for s in three.params], real)
    for o, t in zip(one.params, three.params):
        assert t.ref_changed == 3 * o.ref_changed
        assert abs(t.absorbed - 3 * o.absorbed) <= max(2, o.absorbed // 50)


def test_train_reads_the_pyprojects_tool_precaudit(tmp_path, monkeypatch, capsys):
    """The same configuration as check: a [tool.precaudit] ignore and fail-on apply to precaudit train too."""
    import json

    (tmp_path / "pyproject.toml").write_text('[tool.precaudit]\nignore = ["PA401"]\nfail-on = "never"\n')
    (tmp_path / ".git").mkdir()
    monkeypatch.chdir(tmp_path)
    factory = spec("adam_eps_1e_8")
    assert main(["train", factory, "--regime", "fp16", "-f", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "PA401" not in {r["rule_id"] for r in report["results"]}
    assert report["settings"]["config_file"] == "pyproject.toml" and report["settings"]["fail_on"] == "never"
    (tmp_path / "pyproject.toml").write_text("[tool.precaudit]\n")
    assert main(["train", factory, "--regime", "fp16", "-f", "json"]) == 1
    assert "PA401" in {r["rule_id"] for r in json.loads(capsys.readouterr().out)["results"]}
