"""precaudit train --trace's findings as a user reads them: each cause reported with the parameters it costs, the
loss scale it was measured at, and a clean report that says what was checked."""

from __future__ import annotations

import pytest

from fixtures.train_models import spec
from precaudit.cli import main
from tests.helpers import run_json

pytestmark = [pytest.mark.requires("torch"), pytest.mark.slow]  # real training steps: seconds each


def _findings(tmp_path, factory: str, *args: str) -> dict[tuple[str, str], dict]:
    code, report = run_json(["train", spec(factory)], "--trace", *args, out_dir=tmp_path)
    assert report["errors"] == []
    assert code == (1 if any(r["severity"] == "error" for r in report["results"]) else 0)
    return {(r["rule_id"], r["node_name"]): r for r in report["results"]}


def test_unscaled_cross_entropy_loses_the_bias_direction_not_its_elements(tmp_path):
    """--loss-scale 1 on a mean cross-entropy over 4,096 tokens: the head's bias keeps every element (each a sum
    over the tokens) but, against its gradient at 2^33 (the largest scale whose backward is finite), points
    elsewhere: PA451 says so with both numbers."""
    found = _findings(tmp_path, "aux_loss_1e_3", "--select", "PA451", "--loss-scale", "1")
    assert set(found) == {("PA451", "embed.weight"), ("PA451", "head.weight"), ("PA451", "head.bias")}
    bias = found[("PA451", "head.bias")]["values"]
    assert (bias["underflow_scaled"], bias["loss_scale"], bias["best_scale"]) == (0.0, 1.0, 2.0 ** 33)
    assert bias["underflow_cosine"] == pytest.approx(0.3233, abs=5e-4)
    assert "its cosine is 0.3233" in found[("PA451", "head.bias")]["message"]
    embed = found[("PA451", "embed.weight")]["values"]
    assert embed["underflow_scaled"] == pytest.approx(0.285, abs=5e-4)


def test_two_causes_are_both_reported_each_naming_its_parameters(tmp_path):
    """A start too low and the underflow it costs: PA453 names the parameters that lose gradients at the start,
    and each has its own PA451. An empty window: PA452 names the parameters still lost at its top, each with its
    PA451 at the scale GradScaler backs off to."""
    found = _findings(tmp_path, "aux_loss_1e_3", "--select", "PA45", "--loss-scale", "1")
    assert set(found) == {("PA451", "embed.weight"), ("PA451", "head.weight"), ("PA451", "head.bias"),
                          ("PA453", "loss scale")}
    start = found[("PA453", "loss scale")]
    assert start["values"]["params_start"] == "'embed.weight', 'head.weight', 'head.bias'"
    assert "until then the gradients of 'embed.weight', 'head.weight', 'head.bias' lose to underflow" in \
        start["message"]
    found = _findings(tmp_path, "two_heads_empty_window", "--select", "PA45")
    assert set(found) == {("PA451", "branch.weight"), ("PA451", "branch.bias"), ("PA452", "loss scale")}
    assert "50.0% of the gradient elements are still 0, in 'branch.weight', 'branch.bias'" in \
        found[("PA452", "loss scale")]["message"]
    lost = found[("PA451", "branch.weight")]
    assert (lost["values"]["loss_scale"], lost["values"]["underflow_scaled"]) == (64.0, 1.0)
    assert "GradScaler's start 65536 overflows the backward; it backs off to 64" in lost["message"]


def test_a_denoiser_whose_start_overflows_reports_the_direction_lost_where_it_trains(tmp_path):
    """GradScaler's 2^16 overflows the denoiser's backward: the gradients are compared at 2^13, where it backs off
    to (and the largest finite scale): a direction lost there is lost at any scale (PA455), not the window."""
    found = _findings(tmp_path, "denoiser_sigma_0_1", "--select", "PA45")
    assert set(found) == {("PA455", "skip.weight"), ("PA455", "skip.bias"), ("PA455", "body.2.weight"),
                          ("PA455", "body.2.bias")}
    skip = found[("PA455", "skip.weight")]
    assert skip["values"]["cosine_best"] == pytest.approx(0.9756, abs=5e-4)
    assert "in amp-fp16 at loss scale 8192 (the largest that keeps the backward finite) has cosine 0.9756" in \
        skip["message"]


def test_a_clean_report_says_what_was_checked(tmp_path, capsys):
    args = ["train", spec("adam_eps_1e_4"), "--regime", "amp-bf16", "--select", "PA401,PA402,PA451,PA452,PA455"]
    assert main([*args, "--trace"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "checked: the forward graph as amp-bf16 runs it (0 rules), the optimizer and the backward's bounds "
        "(PA401, PA402); 1 amp-bf16 step traced against float32 on the factory's batch (seed 0, loss scale 1, "
        "4 parameters: PA451, PA455)",
        f"Found 0 findings in 1 model ({spec('adam_eps_1e_4')}): 0 errors, 0 warnings, 0 info."]
    assert main(args) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        "checked: the forward graph as amp-bf16 runs it (0 rules), the optimizer and the backward's bounds "
        "(PA401, PA402); no step traced (--trace runs one: PA451, PA455)")
    code, report = run_json(["train", spec("adam_eps_1e_4")], "--regime", "fp16", "--steps", "2", "--trace",
                            "--select", "PA45,PA1", out_dir=tmp_path)
    checked = report["settings"]["checked"]
    assert report["results"] == [] and code == 0
    assert {k: v for k, v in checked.items() if k != "text"} == {
        "regime": "fp16", "forward_rules": 8, "static_rules": [], "traced": True, "steps": 2, "seed": 0,
        "traced_rules": ["PA451", "PA452", "PA453", "PA454", "PA455", "PA456", "PA457"], "parameters": 4,
        "loss_scale": 1.0, "inputs": "the factory's batch"}


def test_a_static_scale_above_the_top_is_measured_at_the_top(tmp_path):
    """--regime fp16 --loss-scale 65536: no GradScaler backs the overflowing scale off, so the backward is run at
    the top (2^6) as well, where the branch weighted 1e-14 is still lost: the window is empty (PA452)."""
    found = _findings(tmp_path, "two_heads_empty_window", "--regime", "fp16", "--loss-scale", "65536",
                      "--select", "PA452")
    assert set(found) == {("PA452", "loss scale")}
    values = found[("PA452", "loss scale")]["values"]
    assert (values["scale_init"], values["scale_max"], values["lost_top"]) == (65536.0, 64.0, 0.5)
    assert values["params_top"] == "'branch.weight', 'branch.bias'"
