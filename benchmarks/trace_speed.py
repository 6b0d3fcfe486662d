"""How much slower traced mode is than a plain onnxruntime float32 run of the same model and inputs.

Exports a randomly initialized transformers BertModel (TorchScript exporter, opset 14, so every LayerNorm is
decomposed), synthesizes one batch of token ids, and times in one process, on the same inputs:

  onnxruntime fp32          a plain CPU inference run of the exported model (the yardstick)
  emulation only            every intermediate rounded into float16 op by op, nothing measured
  traced mode, per sample   emulation + float32 reference + every measurement: what `--trace` adds per batch
                            (a batch with more to come: weights, and their rounded copies, kept within the budget)
  traced mode, first run    a one-batch run: the same plus the one-time setup (planning, onnxruntime sessions)

for both engines: onnxruntime (the default where it is installed) and the numpy kernels. For the onnxruntime engine
two more lines say where the time of a sample goes: the same traced run with its measurements skipped (the sessions
still return every value the measurements read: the floor that faster measuring cannot go below), and the CPU time
the measuring thread spends per sample beside the sessions (numpy passes over every returned value). Times are the
best of --repeat runs after a warm-up; the onnxruntime yardstick is the best of its three timings (before, between
and after the engines). The export goes in a temporary folder, deleted at the end. Needs torch, transformers and
onnxruntime.

    python benchmarks/trace_speed.py [--layers 12] [--hidden 768] [--seq 128] [--repeat 5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import sys
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path
from unittest import mock


def export_bert(path: Path, layers: int, hidden: int, seq: int) -> None:
    import torch
    import transformers as tf

    class LastHiddenState(torch.nn.Module):
        """Call the model by keyword (TorchScript passes positionals) and return its hidden states."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            return self.model(input_ids=input_ids, return_dict=False)[0]

    torch.manual_seed(0)
    config = tf.BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                           intermediate_size=4 * hidden, max_position_embeddings=max(512, seq), vocab_size=1000)
    module = LastHiddenState(tf.BertModel(config)).eval()
    ids = torch.randint(0, 1000, (1, seq))
    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (ids,), str(path), dynamo=False, opset_version=14,
                          input_names=["input_ids"], dynamic_axes={"input_ids": {0: "batch", 1: "sequence"}})


def best_of(repeat: int, fn) -> float:
    fn()  # warm-up: caches, kernels, sessions
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


@contextlib.contextmanager
def measuring(skip: bool, cpu: list[float]):
    """The onnxruntime engine's measuring thread, its CPU time added to cpu[0]; skip: values freed unmeasured."""
    from precaudit.trace.ort_engine import OrtSegments

    real = OrtSegments._measure_steps

    def measure_steps(self, start, end, emu, ref):
        begin = time.thread_time()
        if skip:
            for k in range(start, end):
                self.runner.free(self.plan.steps[k], emu, ref)
        else:
            real(self, start, end, emu, ref)
        cpu[0] += time.thread_time() - begin

    with mock.patch.object(OrtSegments, "_measure_steps", measure_steps):
        yield


def once(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="precaudit_trace_speed_"))
    try:
        return _measure(args, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # the export (350 MB at BERT-base) is no result


def _measure(args: argparse.Namespace, folder: Path) -> int:
    import onnxruntime as ort

    from precaudit.analysis.compute_dtype import DtypeResolver
    from precaudit.dtypes import FORMATS
    from precaudit.frontends.onnx import load_onnx
    from precaudit.trace.emulator import Emulator
    from precaudit.trace.inputs import synthesize_inputs
    from precaudit.trace.measure import attach_probes

    model = folder / "bert.onnx"
    export_bert(model, args.layers, args.hidden, args.seq)
    graph = load_onnx(str(model))
    resolver = DtypeResolver(graph, FORMATS["fp16"])
    feeds = synthesize_inputs(graph, {"batch": 1, "sequence": args.seq}, seed=0)

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    # the yardstick, timed again between the engines and after them: on a shared machine a neighbour's load can slow
    # one of its measurements, and a slow yardstick would flatter traced mode
    t_ort = best_of(args.repeat, partial(session.run, None, feeds))
    print(f"model: BertModel, {args.layers} layers, hidden {args.hidden}, sequence {args.seq}: "
          f"{len(graph.nodes)} nodes (TorchScript exporter, opset 14)")
    rows = []

    def traced(engine: str) -> Emulator:
        emulator = Emulator(graph, resolver, engine=engine)
        attach_probes(graph, resolver, emulator)  # the norm and op measurements --trace takes
        return emulator

    def first_run(engine: str) -> None:
        traced(engine).run(feeds, final=True)

    for engine in ("onnxruntime", "numpy"):
        # the first run first, before any other sessions of this engine exist: as the command line meets it (one
        # batch, the last: nothing kept for a next one)
        t_first = once(partial(first_run, engine))
        full = traced(engine)
        t_full = best_of(args.repeat, partial(full.run, feeds))
        ran_on = full.ran_on
        del full
        emulation = Emulator(graph, resolver, reference=False, engine=engine)
        t_emu = best_of(args.repeat, partial(emulation.run, feeds))
        del emulation
        split = {}
        if engine == "onnxruntime":  # (after the rows above: these runs must not make them slower)
            full = traced(engine)
            cpu = [0.0]
            with measuring(False, cpu):
                full.run(feeds)  # warm-up
                cpu[0] = 0.0
                for _ in range(args.repeat):
                    full.run(feeds)
            split["measure_cpu"] = cpu[0] / args.repeat
            with measuring(True, [0.0]):
                split["unmeasured"] = best_of(args.repeat, partial(full.run, feeds))
            del full
        t_ort = min(t_ort, best_of(args.repeat, partial(session.run, None, feeds)))
        rows.append((engine, t_emu, t_full, t_first, ran_on, split))
    print(f"onnxruntime fp32 (CPU)              {t_ort * 1000:9.1f} ms   (best of {3 * args.repeat})")
    for engine, t_emu, t_full, t_first, ran_on, split in rows:
        print(f"[{engine}] emulation only (fp16)  {t_emu * 1000:9.1f} ms   {t_emu / t_ort:5.2f}x onnxruntime")
        if split:
            t_unmeasured = split["unmeasured"]
            print(f"[{engine}] traced, unmeasured     {t_unmeasured * 1000:9.1f} ms   {t_unmeasured / t_ort:5.2f}x "
                  f"onnxruntime   (reference + emulation, every measured value returned, none read)")
            print(f"[{engine}] measuring thread       {split['measure_cpu'] * 1000:9.1f} ms   CPU per sample, beside "
                  f"the sessions")
        print(f"[{engine}] traced, per sample     {t_full * 1000:9.1f} ms   {t_full / t_ort:5.2f}x onnxruntime")
        print(f"[{engine}] traced, first run      {t_first * 1000:9.1f} ms   {t_first / t_ort:5.2f}x onnxruntime"
              f"   (nodes on onnxruntime / numpy: {ran_on['onnxruntime']} / {ran_on['numpy']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
