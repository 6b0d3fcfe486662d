"""Start-up cost of the command line: wall time and peak RSS of short runs, each in a fresh process, best of
--repeat, against the floor of the same interpreter importing onnx (what any ONNX audit must load).

  python       python -c pass
  import onnx  python -c "import onnx"
  --version    precaudit --version                      (imports nothing but the package's version)
  rules        precaudit rules --format json             (the typer app and the rule files, no model)
  1-node       precaudit tiny.onnx -o report.txt         (a one-node model: everything a small audit loads)

--compare DIR times a second checkout's precaudit (its folder on PYTHONPATH) the same way, in the same run, so the
two are compared on one machine in one minute: e.g. a `git worktree add` of the commit before a change.

    python benchmarks/startup.py [--repeat 7] [--compare ../before]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_PEAK = "next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:'))"
_MAIN = ("import atexit, sys; from precaudit.cli import main; "
         f"atexit.register(lambda: sys.stderr.write('PEAK ' + {_PEAK} + chr(10))); "
         "sys.argv = ['precaudit', *sys.argv[1:]]; main()")


def _tiny(folder: Path) -> Path:
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h

    graph = h.make_graph([h.make_node("Relu", ["x"], ["y"], name="relu")], "tiny",
                         [h.make_tensor_value_info("x", T.FLOAT, [1, 4])], [h.make_tensor_value_info("y", T.FLOAT, [1, 4])])
    path = folder / "tiny.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), str(path))
    return path


def _time(argv: list[str], env: dict, repeat: int) -> tuple[float, int]:
    best, peak = float("inf"), 0
    for _ in range(repeat):
        start = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        elapsed = time.perf_counter() - start
        best = min(best, elapsed)
        lines = [line for line in done.stderr.splitlines() if line.startswith("PEAK ")]
        if lines:
            peak = int(lines[-1].split()[1])
    return best, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--compare", type=Path, help="another checkout's folder, timed the same way")
    args = parser.parse_args()
    here = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        model = _tiny(folder)
        report = folder / "report.txt"
        python = [sys.executable]
        floors = {"python": [*python, "-c", f"print({_PEAK}, file=__import__('sys').stderr, end='')"],
                  "import onnx": [*python, "-c", "import onnx"]}
        runs = {"--version": ["--version"], "rules": ["rules", "--format", "json"],
                "1-node": [str(model), "-o", str(report)]}
        trees = {"this": here, **({"compare": args.compare.resolve()} if args.compare else {})}
        # bytecode cached (in the scratch folder), as an installed package runs: under PYTHONDONTWRITEBYTECODE every
        # run would compile precaudit's sources again; one run per command first fills the cache
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
        for name, argv in floors.items():
            wall, _ = _time(argv, env, args.repeat)
            print(f"{name:<12} {wall * 1000:7.1f} ms")
        base = _time(floors["import onnx"], env, args.repeat)[0]
        for label, tree in trees.items():
            tree_env = {**env, "PYTHONPATH": str(tree)}
            for name, argv in runs.items():
                if report.exists():
                    report.unlink()
                _time([*python, "-c", _MAIN, *argv], tree_env, 1)
                wall, peak = _time([*python, "-c", _MAIN, *argv], tree_env, args.repeat)
                print(f"{label:<8} {name:<10} {wall * 1000:7.1f} ms  {wall / base:5.2f}x import onnx  "
                      f"peak {peak / 1024:6.1f} MB")


if __name__ == "__main__":
    main()
