"""Traced mode at LLM scale: wall time and peak memory of `--trace` on Llama-shaped fp16 models, against their weights.

Writes in a temporary folder (never committed, deleted after each model) Llama-shaped fp16 decoders with random
N(0, 0.02) weights streamed to external data by benchmarks/llama_onnx.py, then runs in a separate process each

  static    precaudit model.onnx -f json -o report.json                              (the floor: no weight is read)
  traced    precaudit model.onnx --trace --dim batch=1 -f json -o report.json       (one batch of 16 tokens)

and prints wall time, peak RSS (VmHWM, read inside the child: ru_maxrss of a forked child would count the parent's
memory from before exec), the weights on disk and peak RSS / weights, and the traced time per layer beyond the
static audit: over all layers (the embedding and the LM head included), and per layer added since the last model
of the same width (what depth costs: constant when time grows linearly with it). Shapes: 1b (TinyLlama-1.1B: 22 layers, hidden
2048, 2.2 GB), 7b (Llama-7B: 32 layers, hidden 4096, 13.5 GB), and 7b-N (the 7B width at N layers: time and memory
against depth). A 7B model needs 14 GB free on the temporary folder's disk; the run refuses to start without it.

    python benchmarks/trace_memory.py [--shapes 1b,7b] [--repeat 2] [--tmp DIR]
    python benchmarks/trace_memory.py --shapes 7b-8,7b-16,7b      # depth: 8, 16 and 32 layers of width 4096
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llama_onnx import SHAPES, LlamaShape, write_llama

_CHILD = """
import sys
from precaudit.cli import main
code = main(sys.argv[1:])
# VmHWM is this process's own peak; ru_maxrss would include the forked parent's memory from before exec
print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")))
sys.exit(0 if code in (0, 1) else code)
"""


def shape_named(name: str) -> LlamaShape:
    base, _, layers = name.partition("-")
    shape = {"1b": SHAPES["tinyllama-1.1b"], "7b": SHAPES["llama-7b"]}[base]
    if layers:
        shape = LlamaShape(int(layers), shape.hidden, shape.intermediate, shape.heads, shape.kv_heads, shape.vocab,
                           shape.eps)
    return shape


def run(args: list[str], repeat: int) -> tuple[float, float]:
    """Best wall time (s) and largest peak RSS (GB, 10^9 bytes as the weights) of precaudit ARGS in a child
    process, over `repeat` runs."""
    best, peak = float("inf"), 0.0
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"precaudit {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
        best, peak = min(best, wall), max(peak, int(proc.stdout.split()[-1]) * 1024 / 1e9)  # kB → GB
    return best, peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="1b,7b", help="comma-separated: 1b, 7b, 7b-N (N layers of the 7B width)")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each command; the best time is shown")
    parser.add_argument("--tmp", type=Path, default=None, help="where to write the models (default: the system's)")
    args = parser.parse_args()
    print(f"{'model':8s} {'layers':>6s} {'nodes':>6s} {'weights':>8s} | {'static':>15s} | {'traced':>15s} | "
          f"{'peak/weights':>12s} | {'s/layer':>7s} | {'s/added layer':>13s}")
    last: dict[int, tuple[int, float]] = {}  # per width: layers and traced time beyond static of the last model
    for name in args.shapes.split(","):
        shape = shape_named(name)
        need = shape.parameters() * 2
        folder = Path(tempfile.mkdtemp(prefix="precaudit-trace-memory-", dir=args.tmp))
        try:
            free = shutil.disk_usage(folder).free
            if free < need * 1.05:
                raise SystemExit(f"{name}: {need / 1e9:.1f} GB of weights, {free / 1e9:.1f} GB free in {folder}")
            model = write_llama(folder / name, shape, weights="random")
            os.sync()  # the weights on disk before timing: the kernel flushing them meanwhile would slow the runs
            weights = (model.parent / "model.weights").stat().st_size
            report = folder / "report.json"
            s_wall, s_peak = run([str(model), "-f", "json", "-o", str(report)], args.repeat)
            t_wall, t_peak = run([str(model), "--trace", "--dim", "batch=1", "-f", "json", "-o", str(report)],
                                 args.repeat)
            trace = json.loads(report.read_text())["trace"][0]
            nodes = sum(trace["nodes"].values())
            cost = t_wall - s_wall
            before = last.get(shape.hidden)
            added = f"{(cost - before[1]) / (shape.layers - before[0]):11.2f} s" \
                if before and shape.layers > before[0] else f"{'':>11s} -"
            last[shape.hidden] = (shape.layers, cost)
            print(f"{name:8s} {shape.layers:6d} {nodes:6d} {weights / 1e9:5.1f} GB | {s_wall:6.1f} s {s_peak:4.2f} GB | "
                  f"{t_wall:6.1f} s {t_peak:4.2f} GB | {t_peak * 1e9 / weights:11.2f}x | "
                  f"{cost / shape.layers:5.2f} s | {added}", flush=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
