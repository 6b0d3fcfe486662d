"""Every fixture case audited by this checkout and by another (an earlier commit, `git worktree add`), in text,
JSON and SARIF: which reports differ, and how. A refactor should leave every report byte-identical; a change that
is meant prints here, case by case, for its commit message.

    python benchmarks/report_diff.py --before ../before [--formats text,json,sarif] [--show 3]

Each case is built once, into one folder both checkouts read (so paths in the reports agree), and each run is a
fresh process with PYTHONPATH set to its checkout.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

_RUN = "import sys; from precaudit.cli import main; sys.exit(main(sys.argv[1:]))"


def _report(tree: Path, model: Path, args: list[str], fmt: str, out: Path) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", _RUN, str(model), *args, "--format", fmt, "-o", str(out)],
                          env=env, capture_output=True, text=True, cwd=out.parent)
    text = out.read_text() if out.exists() else ""
    if out.exists():
        out.unlink()
    return done.returncode, text + (f"\n[stderr] {done.stderr}" if done.stderr else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--formats", default="text,json,sarif")
    parser.add_argument("--show", type=int, default=3, help="diff lines shown per differing report")
    parser.add_argument("--only", default="", help="run only cases whose module:name contains this")
    args = parser.parse_args()
    here = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(here))
    fixtures = here / "fixtures"
    modules = sorted(p.stem for p in fixtures.glob("PA*.py"))
    cases = [(m, c) for m in modules for c in importlib.import_module(f"fixtures.{m}").CASES]
    formats = args.formats.split(",")
    same = differ = 0
    with tempfile.TemporaryDirectory() as scratch:
        for module, case in cases:
            label = f"{module}:{case.name}"
            if args.only and args.only not in label:
                continue
            folder = Path(scratch) / label.replace(":", "_")
            folder.mkdir()
            model = case.build(folder)
            run_args = ["--dtype", case.dtype, *case.args]
            for fmt in formats:
                out = folder / f"report.{fmt}"
                a = _report(args.before.resolve(), model, run_args, fmt, out)
                b = _report(here, model, run_args, fmt, out)
                if a == b:
                    same += 1
                    continue
                differ += 1
                print(f"{label} [{fmt}] exit {a[0]} -> {b[0]}")
                diff = [d for d in difflib.unified_diff(a[1].splitlines(), b[1].splitlines(), lineterm="", n=0)
                        if d[:1] in "+-" and not d.startswith(("+++", "---"))]
                for line in diff[:args.show]:
                    print(f"    {line[:160]}")
    print(f"{same} reports identical, {differ} differ ({len(formats)} formats)")


if __name__ == "__main__":
    main()
