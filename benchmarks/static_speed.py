"""Static audit speed and memory against the floor: reading the graph with onnx.load(load_external_data=False).

Builds in a temporary folder (never committed) Llama-shaped fp16 decoders at 50, 100 and 200 layers (about 100
nodes a layer, weights as sparse external data that a static audit never reads) and a TinyLlama-1.1B-shaped model
with 2.2 GB of external data, the largest decoder again with a typed value_info for every value (as the dynamo
exporter writes one: precaudit then skips onnx's shape inference), and a float32 chain of 2,500 decomposed
LayerNorms with eps 1e-12 (20,000 nodes, 5,000 findings in fp16: the rules and the report at scale), then times
in separate processes, best of --repeat:

  floor     python -c "onnx.load(model, load_external_data=False)"
  audit     precaudit model.onnx --dtype fp16 -o report.txt (the console entry point; the default text report)

and prints wall time and peak RSS (VmHWM of each process) of both, their ratios, and the audit's time per node
at each size (constant when the audit is linear in node count); then the largest decoder audited with --runtime for
the runtimes whose models do the most per node, each against the audit without it; then, in this process, where an
audit of the largest decoder spends its time per node, phase by phase (best of --repeat each, the collector off as
the audit runs): onnx's own shape inference (C++), precaudit's IR build, the dtype resolver, the sites and the
rules, beside the least any Python IR costs (one object per node and per value, linked, nothing else read).

Both run with Python's bytecode cached (in the temporary folder; one run first fills it), as an installed package
runs: in a source checkout under PYTHONDONTWRITEBYTECODE (this machine's setting) every audit would compile
precaudit's sources again, about 50 ms (onnx, installed, has its bytecode). --no-bytecode-cache measures without it.

    python benchmarks/static_speed.py [--layers 50,100,200] [--repeat 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llama_onnx import SHAPES, LlamaShape, write_llama

_PEAK = ("next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:'))")
_FLOOR = f"import onnx, sys; onnx.load(sys.argv[1], load_external_data=False); print({_PEAK})"
# the console entry point, as `precaudit MODEL --dtype fp16 -o REPORT` runs (main() exits; the peak is printed at exit)
_AUDIT = (f"import atexit, sys; sys.argv = ['precaudit', sys.argv[1], '--dtype', 'fp16', '-o', sys.argv[2], "
          f"*sys.argv[3:]]; atexit.register(lambda: print({_PEAK})); from precaudit.cli import main; main()")
# --runtime costs (issue: within 5 % of the audit without it): the runtimes whose models do the most per node
_RUNTIMES = ("ort-cpu", "ort-cuda@1.26", "openvino-gpu", "tensorrt")


def write_norm_chain(folder: Path, layers: int) -> Path:
    """A float32 graph of `layers` MatMul + decomposed LayerNorm blocks (8 nodes each) with eps 1e-12, as the
    TorchScript exporter writes nn.LayerNorm at opset 14: audited for fp16 every block is two findings (PA101, the
    eps rounds to 0; PA208, the variance can overflow), so this measures the rules and the report at scale."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(parents=True, exist_ok=True)
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1e-12, np.float32), "eps"),
             numpy_helper.from_array(np.random.default_rng(0).normal(0, 0.1, (64, 64)).astype(np.float32), "w")]
    nodes, x = [], "x"
    for i in range(layers):
        p = f"/layers.{i}/norm/"
        nodes += [helper.make_node("MatMul", [x, "w"], [p + "mm"], name=f"/layers.{i}/fc/MatMul"),
                  helper.make_node("ReduceMean", [p + "mm"], [p + "mean"], name=p + "ReduceMean", axes=[-1]),
                  helper.make_node("Sub", [p + "mm", p + "mean"], [p + "d"], name=p + "Sub"),
                  helper.make_node("Pow", [p + "d", "two"], [p + "d2"], name=p + "Pow"),
                  helper.make_node("ReduceMean", [p + "d2"], [p + "var"], name=p + "ReduceMean_1", axes=[-1]),
                  helper.make_node("Add", [p + "var", "eps"], [p + "ve"], name=p + "Add"),
                  helper.make_node("Sqrt", [p + "ve"], [p + "std"], name=p + "Sqrt"),
                  helper.make_node("Div", [p + "d", p + "std"], [p + "out"], name=p + "Div")]
        x = p + "out"
    graph = helper.make_graph(nodes, "norms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], producer_name="pytorch")
    onnx.save(model, str(folder / "model.onnx"))
    return folder / "model.onnx"


def measure(code: str, args: list[str], repeat: int, env: dict | None = None) -> tuple[float, float]:
    """Best wall time (s) and the peak RSS (MB) of a child process running code (exit 0, or 1 for findings)."""
    best, peak = float("inf"), 0.0
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
        wall = time.perf_counter() - start
        if proc.returncode not in (0, 1):
            raise SystemExit(f"failed: {proc.stderr.strip()[-500:]}")
        best = min(best, wall)
        peak = max(peak, int(proc.stdout.split()[-1]) / 1024)
    return best, peak


def _best(repeat: int, work) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def _least_ir(graph) -> None:
    """The least a Python IR of the graph costs: each node and each value one precaudit object, linked to what it
    reads and makes, typed from a name -> type map; nothing else is read (no attribute, no initializer)."""
    from precaudit.ir import Node, Value

    types = {vi.name: vi.type for vi in graph.value_info}
    scope = {init.name: Value(init.name) for init in graph.initializer}
    scope.update((vi.name, Value(vi.name)) for vi in graph.input)
    for proto in graph.node:
        node = Node(proto.name, proto.op_type)
        for name in proto.input[:]:
            read = scope[name]
            read.consumers.append(node)
            node.inputs.append(read)
        for name in proto.output[:]:
            made = scope[name] = Value(name, producer=node)
            declared = types.get(name)
            if declared is not None:
                made.dtype = declared.tensor_type.elem_type
            node.outputs.append(made)


def phases(path: Path, repeat: int) -> None:
    """Where the static audit of path spends its time, per node, each phase timed alone in this process."""
    import gc

    import onnx

    from precaudit.analysis.collect import collect_sites
    from precaudit.deployment import Deployment
    from precaudit.frontends.onnx_builder import build_graph
    from precaudit.rules.engine import apply_rules
    from precaudit.rules.loader import load_rules

    data = path.read_bytes()
    inferred = onnx.shape_inference.infer_shapes(data, strict_mode=False)
    rules = load_rules()
    patterns = {rule.id: rule.pattern for rule in rules if rule.pattern is not None}
    graph = build_graph(str(path), path.parent, inferred)
    state: dict = {}

    def timed_after_fresh(work, resolver: bool = True) -> float:
        """work timed on a new graph (its facts are memoized on its values: a second run would find them)."""
        best = float("inf")
        for _ in range(repeat):
            state["graph"] = build_graph(str(path), path.parent, inferred)
            if resolver:
                state["resolver"] = Deployment.named("fp16").resolver(state["graph"])
            start = time.perf_counter()
            work()
            best = min(best, time.perf_counter() - start)
        return best

    gc.disable()
    try:
        steps = [
            ("onnx shape inference (C++)", _best(repeat, lambda: onnx.shape_inference.infer_shapes(data))),
            ("least Python IR (reference)", _best(repeat, lambda: _least_ir(inferred.graph))),
            ("precaudit IR build", _best(repeat, lambda: build_graph(str(path), path.parent, inferred))),
            ("dtype resolver", timed_after_fresh(lambda: Deployment.named("fp16").resolver(state["graph"]),
                                                 resolver=False)),
            ("sites", timed_after_fresh(lambda: state.update(
                sites=collect_sites(state["graph"], state["resolver"], patterns)))),
            ("rules", _best(repeat, lambda: apply_rules(rules, state["sites"], str(path)))),
        ]
    finally:
        gc.enable()
    nodes = len(graph.nodes)
    print(f"where the time goes on {path.parent.name} ({nodes} nodes), in this process:")
    for label, seconds in steps:
        print(f"  {label:30s} {seconds * 1e3:6.1f} ms  {seconds / nodes * 1e6:5.1f} us per node")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="50,100,200")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="build the models here and keep them")
    parser.add_argument("--no-bytecode-cache", action="store_true", help="run the children as the environment says")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="precaudit-static-speed-"))
    env = None
    if not args.no_bytecode_cache:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")

    import onnx

    shape = SHAPES["tinyllama-1.1b"]
    models = [(f"Llama-shaped, {n} layers", write_llama(root / f"layers{n}", LlamaShape(
        n, shape.hidden, shape.intermediate, shape.heads, shape.kv_heads, shape.vocab)))
        for n in map(int, args.layers.split(","))]
    largest = models[-1][1]
    declared = root / "declared" / "model.onnx"  # the largest, with a value_info for every value as dynamo writes
    declared.parent.mkdir(exist_ok=True)
    (declared.parent / "model.weights").unlink(missing_ok=True)  # (a --keep folder from an earlier run)
    os.link(largest.parent / "model.weights", declared.parent / "model.weights")
    onnx.save(onnx.shape_inference.infer_shapes(onnx.load(str(largest), load_external_data=False)), str(declared))
    models.append((f"{models[-1][0]}, every type declared", declared))
    models.append(("LayerNorm chain, 5,000 findings", write_norm_chain(root / "norms", 2500)))
    big = write_llama(root / "tinyllama", shape)
    models.append((f"TinyLlama-1.1B-shaped, {(big.parent / 'model.weights').stat().st_size / 1e9:.1f} GB external",
                   big))

    if env is not None:  # fill the bytecode cache
        measure(_FLOOR, [str(models[0][1])], 1, env)
        measure(_AUDIT, [str(models[0][1]), str(models[0][1].parent / "report.txt")], 1, env)
    print(f"{'model':44s} {'nodes':>6s} | {'floor':>14s} | {'precaudit':>14s} | {'ratio wall/RSS':>15s} | per node")
    rows = []
    for label, path in models:
        nodes = len(onnx.load(str(path), load_external_data=False).graph.node)
        f_wall, f_rss = measure(_FLOOR, [str(path)], args.repeat, env)
        a_wall, a_rss = measure(_AUDIT, [str(path), str(path.parent / "report.txt")], args.repeat, env)
        rows.append((nodes, a_wall))
        print(f"{label:44s} {nodes:6d} | {f_wall:5.2f} s {f_rss:4.0f} MB | {a_wall:5.2f} s {a_rss:4.0f} MB | "
              f"{a_wall / f_wall:5.2f}x / {a_rss / f_rss:4.2f}x | {a_wall / nodes * 1e6:5.0f} us "
              f"({(a_wall - f_wall) / nodes * 1e6:4.0f} us beyond the floor)")
    largest_label, largest_path = models[-4]  # the largest Llama-shaped decoder
    plain, _ = measure(_AUDIT, [str(largest_path), str(largest_path.parent / "report.txt")], args.repeat, env)
    for runtime in _RUNTIMES:
        wall, rss = measure(_AUDIT, [str(largest_path), str(largest_path.parent / "report.txt"), "--runtime", runtime],
                            args.repeat, env)
        print(f"{largest_label} --runtime {runtime:14s}: {wall:5.2f} s {rss:4.0f} MB, "
              f"{wall / plain:5.3f}x the audit without --runtime ({plain:.2f} s, measured again alongside)")
    phases(largest_path, args.repeat)
    llama = rows[:-3]  # linearity: what each added node costs between consecutive sizes of the same graph
    for (n0, t0), (n1, t1) in itertools.pairwise(llama):
        print(f"{n0} -> {n1} nodes: {(t1 - t0) / (n1 - n0) * 1e6:.0f} us per added node")
    return 0


if __name__ == "__main__":
    sys.exit(main())
