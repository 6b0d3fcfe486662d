"""Fuzz precaudit with hostile inputs: mutated models (fields and bytes), rule files, output paths, names in every
renderer, baselines, pyproject values, several models per run and traced inputs that size a tensor.

Each case runs in a worker process that a watchdog replaces when it hangs (no answer within --timeout seconds),
dies (a crash in a C extension) or grows past --rss-mb of peak memory. A case fails when it ends in a traceback,
an exit code outside those its command has (0/1/2; keep-list and fix also 3), exit 2 with other than one stderr
line per failing model, stderr on exit 0/1, an input file changed, an output that does not parse back, a hang, a
crash, or memory past the bound. Prints the counts per kind and outcome, and every failing case (its mutations, arguments
and stderr) so it can be replayed. Exits 1 if any case failed.

    python benchmarks/fuzz_hostile.py [--cases 1000] [--timeout 60] [--rss-mb 1024] [--seed 0] [--show-internal]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import os
import resource
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from tests.fuzzing import Case, any_case, run_case  # noqa: E402


def _work(case: Case) -> tuple[int | None, str, str | None, float]:
    """In the worker: run one case in a fresh folder; its outcome (with what the case's own checks found: an input
    changed, an output that does not parse back) and the worker's peak RSS so far (MB)."""
    with tempfile.TemporaryDirectory(prefix="precaudit-fuzz-") as folder:
        outcome = run_case(case, Path(folder))
    return outcome.code, outcome.stderr, outcome.extra, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Watchdog:
    """One worker process at a time; replaced after a hang, a crash or too much memory."""

    def __init__(self, timeout: float, rss_mb: float):
        self.timeout, self.rss_mb = timeout, rss_mb
        self.pool = self._new()

    def _new(self) -> cf.ProcessPoolExecutor:
        return cf.ProcessPoolExecutor(max_workers=1)

    def _restart(self) -> None:
        for proc in list(getattr(self.pool, "_processes", {}).values()):
            proc.kill()
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.pool = self._new()

    def run(self, case: Case) -> tuple[str, str, int | None]:
        """(verdict, stderr, exit code): verdict is ok, internal, or what went wrong."""
        from tests.fuzzing import Outcome

        future = self.pool.submit(_work, case)
        try:
            code, stderr, extra, peak = future.result(timeout=self.timeout)
        except cf.TimeoutError:
            self._restart()
            return "hang", "", None
        except cf.process.BrokenProcessPool:
            self._restart()
            return "crash", "", None
        outcome = Outcome(code, stderr, case.codes, extra, case.models)
        if peak > self.rss_mb:
            self._restart()
            return f"memory {peak:.0f} MB", stderr, code
        problem = outcome.problem()
        if problem:
            return problem, stderr, code
        return ("internal" if outcome.internal else "ok"), stderr, code


def _save(folder: Path, case: Case, stderr: str) -> None:
    """The case's files, its arguments and what it printed: replay with `cd folder && precaudit ARGS`."""
    import json
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in case.files.items():
        (folder / name).write_bytes(data)
    (folder / "case.json").write_text(json.dumps({"args": case.args, "notes": case.notes, "stderr": stderr}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--rss-mb", type=float, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show-internal", action="store_true", help="print every 'internal error' line too")
    parser.add_argument("--save", type=Path, help="write each failing (or internal-error) case's files here")
    args = parser.parse_args()

    dog = Watchdog(args.timeout, args.rss_mb)
    counts: collections.Counter = collections.Counter()
    codes: collections.Counter = collections.Counter()
    failures: list[tuple[str, Case, str]] = []
    exits: collections.Counter = collections.Counter()

    @settings(max_examples=args.cases, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @seed(args.seed)
    @given(case=any_case())
    def fuzz(case: Case) -> None:
        verdict, stderr, code = dog.run(case)
        exits[code] += 1
        counts[(case.kind, "ok" if verdict in ("ok", "internal") else "FAIL")] += 1
        if verdict == "internal":
            codes[stderr.partition("internal error:")[2].strip()[:90]] += 1
        if verdict not in ("ok", "internal") or (verdict == "internal" and args.show_internal):
            failures.append((verdict, case, stderr))
            if args.save:
                _save(args.save / str(len(failures)), case, stderr)
            print(f"[{verdict}] {case.kind} {case.notes} {case.args}\n    {stderr.strip()[:400]}", flush=True)

    fuzz()
    dog._restart()
    total = sum(counts.values())
    print(f"\n{total} cases, seed {args.seed} (timeout {args.timeout:.0f} s, memory bound {args.rss_mb:.0f} MB per worker)")
    for kind in sorted({kind for kind, _ in counts}):
        ok, bad = counts[(kind, "ok")], counts[(kind, "FAIL")]
        print(f"  {kind:6s} {ok + bad:5d} cases: {ok:5d} within the contract, {bad:3d} failing")
    print("  exit codes: " + ", ".join(f"{code}: {n}" for code, n in sorted(exits.items(), key=str)))
    internal = sum(codes.values())
    print(f"  internal errors (one line, exit 2, but a bug): {internal}")
    for where, n in codes.most_common(10):
        if n:
            print(f"    {n:4d}  {where}")
    hard = [f for f in failures if f[0] not in ("ok", "internal")]
    print(f"  failing cases: {len(hard)}")
    return 1 if hard else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
