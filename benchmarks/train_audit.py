"""The training audit at GPT-2-small scale: wall time and peak memory of `precaudit train --trace` against one plain
float32 training step of the same model, measured in the same run.

The model is transformers' GPT2LMHeadModel from its default config (124M parameters, random init, seed 0), the
batch 4 x 128 tokens with labels (the model returns its loss), the optimizer AdamW(lr 1e-4). Each measurement runs
in its own process and reads its own peak RSS (VmHWM):

  plain     one float32 forward + backward + AdamW step, as a user's training loop runs it (the baseline; the
            import of torch and transformers and building the model are counted in neither side's time: each side
            reports the time after its model exists)
  static    precaudit train's audit, --regime R             (the captured graph's rules, no step)
  traced    precaudit train's audit, --regime R --trace     (one step in float32 and one emulated in the regime)

(The audit runs in the measuring process, given the factory's objects as precaudit.train_audit passes them: the
command line runs it in a worker process, whose time and memory the parent cannot read as its own.)

Each child runs its work twice: cold (the process's first touch of its memory: on a VM whose host has taken idle
pages back, page faults can make this several times slower, for both sides alike) and warm. It prints both times,
the peak GB and the ratios to the plain step (goal: traced <= 4x the time, <= 3x the memory), then where the
traced audit's time goes (the phases timed one after another in this process).

    python benchmarks/train_audit.py [--regime amp-fp16] [--layers 12] [--batch 4] [--tokens 128] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def make():
    """The training factory: GPT-2 small with labels, AdamW. Sizes from the environment (set by the parent)."""
    import torch
    import transformers

    layers = int(os.environ.get("PRECAUDIT_BENCH_LAYERS", "12"))
    batch = int(os.environ.get("PRECAUDIT_BENCH_BATCH", "4"))
    tokens = int(os.environ.get("PRECAUDIT_BENCH_TOKENS", "128"))
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=layers)  # n_embd 768, 12 heads, vocab 50257: 124M at 12 layers
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, config.vocab_size, (batch, tokens))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, {"input_ids": ids, "labels": ids}, optimizer


_PEAK = "print(json.dumps({'seconds': seconds, 'peak_gb': next(int(l.split()[1]) for l in open('/proc/self/status') " \
        "if l.startswith('VmHWM:')) * 1024 / 1e9}))"

_PLAIN = f"""
import json, sys, time
sys.path.insert(0, {str(HERE.parent)!r})
from train_audit import make
model, batch, optimizer = make()
model.train()
seconds = []
for _ in range(2):  # cold (the process's first touch of its memory), then warm
    start = time.perf_counter()
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    seconds.append(time.perf_counter() - start)
{_PEAK}
"""

# the audit's time counts from after the factory returned (as the plain step's does), through its report; run twice
# in one process, cold and warm, as the plain step is. The objects go to the audit as the API passes them: the
# command line would run the factory in a worker process of its own, whose time and memory this process cannot
# read (the report and the work are the same)
_AUDIT = f"""
import json, sys, time
sys.path.insert(0, {str(HERE.parent)!r})
from train_audit import make
from precaudit.report.json import render_json
from precaudit.pipeline import run_train_audit
from precaudit.train.audit import TrainOptions
regime, trace = sys.argv[1], sys.argv[2] == "--trace"
seconds = []
for _ in range(2):
    made = make()
    start = time.perf_counter()
    outcome = run_train_audit({str(HERE) + ":make"!r}, TrainOptions(regime=regime, trace=trace), made=made)
    render_json(outcome)
    seconds.append(time.perf_counter() - start)
    assert not outcome.result.errors, outcome.result.errors
{_PEAK}
"""


def child(code: str, args: list[str], env: dict) -> dict:
    run = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    if run.returncode != 0:
        raise SystemExit(f"child failed ({run.returncode}): {run.stderr.strip()[-600:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def best(code: str, args: list[str], env: dict, repeat: int) -> dict:
    runs = [child(code, args, env) for _ in range(repeat)]
    return {"cold": min(r["seconds"][0] for r in runs), "warm": min(r["seconds"][1] for r in runs),
            "peak_gb": max(r["peak_gb"] for r in runs)}


def phases(regime: str) -> list[tuple[str, float]]:
    """Where the traced audit's time goes: its parts timed one after another in this process."""
    from precaudit.train.audit import _forward_sites
    from precaudit.train.capture import capture
    from precaudit.train.collapsed import collapsed_row
    from precaudit.train.factory import setup_of
    from precaudit.train.regimes import regime_named
    from precaudit.train.sites import static_sites
    from precaudit.train.step import run_steps

    reg = regime_named(regime)
    setup = setup_of(f"{HERE}:make", make())
    out = []

    def clock(label, fn):
        start = time.perf_counter()
        value = fn()
        out.append((label, time.perf_counter() - start))
        return value

    forward = clock("forward graph capture + sites", lambda: _forward_sites(setup, reg, {}))
    clock("static training sites", lambda: static_sites(setup, reg, forward, None))
    clock("one torch.export capture (train mode)", lambda: capture(setup, reg))
    clock("the step: its capture, reference, regime (emulated)", lambda: run_steps(setup, reg))
    clock("the collapsed-row step: capture, float32 and regime", lambda: collapsed_row(setup, reg))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regime", default="amp-fp16")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-phases", action="store_true", help="skip the in-process breakdown")
    args = parser.parse_args()
    env = {**os.environ, "PRECAUDIT_BENCH_LAYERS": str(args.layers), "PRECAUDIT_BENCH_BATCH": str(args.batch),
           "PRECAUDIT_BENCH_TOKENS": str(args.tokens)}
    os.environ.update(env)
    print(f"GPT-2 ({args.layers} layers, batch {args.batch} x {args.tokens} tokens), regime {args.regime}, "
          f"{os.cpu_count()} cores")
    plain = best(_PLAIN, [], env, args.repeat)
    static = best(_AUDIT, [args.regime, "--static"], env, args.repeat)
    traced = best(_AUDIT, [args.regime, "--trace"], env, args.repeat)
    print(f"{'':8s} {'cold s':>8s} {'warm s':>8s} {'peak GB':>8s} {'cold x':>7s} {'warm x':>7s} {'memory x':>9s}")
    for label, r in (("plain", plain), ("static", static), ("traced", traced)):
        print(f"{label:8s} {r['cold']:8.2f} {r['warm']:8.2f} {r['peak_gb']:8.2f} {r['cold'] / plain['cold']:7.2f} "
              f"{r['warm'] / plain['warm']:7.2f} {r['peak_gb'] / plain['peak_gb']:9.2f}")
    ratio = traced["warm"] / plain["warm"]
    print(f"goal: traced <= 4x the time (warm: {ratio:.1f}x, {'met' if ratio <= 4 else 'not met'}), <= 3x the memory "
          f"({traced['peak_gb'] / plain['peak_gb']:.1f}x, {'met' if traced['peak_gb'] <= 3 * plain['peak_gb'] else 'not met'})")
    if not args.no_phases:
        print("where the traced audit's time goes (in-process, one after another):")
        for label, seconds in phases(args.regime):
            print(f"  {label:52s} {seconds:8.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
