"""--manifest FILE: scan a list of checkpoints, -j at a time, one JSON line per checkpoint appended as each
finishes; --resume skips those the results file already has a line for.

A line is written only for a scan that finished: a report, or the one-line verdict on bad input (exit_code 2,
"error"). A checkpoint whose worker died, or that an interrupt stopped, has no line, so --resume scans it again.
Each line is written whole and flushed before the next, by this process alone; a line a crash cut short is not a
line --resume trusts, and the next one starts on a new line.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TextIO

from ..errors import InputError
from ..files import MiB, check_output, note_read, open_regular, read_text

__all__ = ["ManifestRun", "read_manifest", "run_manifest"]

MANIFEST_LIMIT = 64 * MiB


@dataclass
class ManifestRun:
    scanned: int = 0
    skipped: int = 0
    died: int = 0
    worst: int = 0  # the highest exit code of any checkpoint, resumed ones included


def read_manifest(path: str) -> list[tuple[str, str]]:
    """(entry as written, path to scan) per checkpoint: one a line, blank lines and # comments skipped, relative
    paths taken from the manifest's folder, each checkpoint once."""
    folder = os.path.dirname(path)
    entries: dict[str, str] = {}
    for line in read_text(path, MANIFEST_LIMIT, what="the manifest").splitlines():
        entry = line.strip()
        if entry and not entry.startswith("#"):
            entries.setdefault(entry, os.path.join(folder, entry))
    return list(entries.items())


def _done(results: str | None) -> tuple[dict[str, int], bool]:
    """The checkpoints the results file has a whole line for, with their exit codes; whether it ends mid-line.
    Read line by line: a results file grows with every checkpoint's per-tensor counts."""
    if results is None or not os.path.exists(results):
        return {}, False
    done: dict[str, int] = {}
    line = b""
    with open_regular(results) as fh:
        for line in fh:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line a crash cut short
            if isinstance(record, dict) and isinstance(record.get("checkpoint"), str):
                code = record.get("exit_code")
                done[record["checkpoint"]] = code if isinstance(code, int) else 2
    return done, bool(line) and not line.endswith(b"\n")


def scan_line(entry: str, path: str) -> dict[str, Any]:
    """One checkpoint's JSON line: its report, or the bad-input verdict."""
    from .scanner import scan

    try:
        report = scan(path)
    except InputError as exc:
        return {"checkpoint": entry, "path": path, "exit_code": 2, "error": str(exc)}
    return {**report.to_dict(), "checkpoint": entry, "path": path, "exit_code": report.exit_code}


def _lines(todo: list[tuple[str, str]], jobs: int, run: ManifestRun, say: Callable[[str], None]
           ) -> Iterator[dict[str, Any]]:
    if jobs <= 1 or len(todo) <= 1:
        for entry, path in todo:
            yield scan_line(entry, path)
        return
    import concurrent.futures as cf
    import multiprocessing

    context = multiprocessing.get_context("forkserver")  # no fork of a process holding threads and open files
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = {pool.submit(scan_line, entry, path): entry for entry, path in todo}
        for future in cf.as_completed(futures):
            try:
                yield future.result()
            except cf.process.BrokenProcessPool:
                run.died += 1
                say(str(InputError(futures[future], "the process scanning it died; --resume scans it again")))


def run_manifest(manifest: str, results: str | None, resume: bool, jobs: int, say: Callable[[str], None]
                 ) -> ManifestRun:
    """Scan every checkpoint of the manifest not yet in results; append a line for each as it finishes. say()
    prints one line on stderr."""
    todo = read_manifest(manifest)
    _note_inputs(path for _, path in todo)
    if results is not None:
        check_output(results, what="the results file")
        if not resume and os.path.exists(results) and os.path.getsize(results):
            raise InputError(results, "exists: pass --resume to continue it, or name a new file")
    done, cut = _done(results) if resume else ({}, False)
    run = ManifestRun(skipped=sum(1 for entry, _ in todo if entry in done))
    run.worst = max((done[entry] for entry, _ in todo if entry in done), default=0)
    todo = [(entry, path) for entry, path in todo if entry not in done]
    out: TextIO
    with (open(results, "a", encoding="utf-8") if results is not None else _stdout()) as out:
        if cut:
            out.write("\n")
        from ..report.json import strict_json

        for line in _lines(todo, jobs, run, say):
            out.write(json.dumps(strict_json(line), allow_nan=False) + "\n")
            out.flush()
            run.scanned += 1
            run.worst = max(run.worst, int(line["exit_code"]))
    if run.died:
        run.worst = 2
    return run


def _note_inputs(paths: Iterable[str]) -> None:
    """Record every checkpoint file the manifest names before any is read, so that a results file that is one of
    them (a shard, an index, a config) is refused before a line is appended to it."""
    for path in paths:
        folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
        note_read(path)
        if path.endswith(".json") or os.path.isdir(path):
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                if name.endswith((".safetensors", ".json")):
                    note_read(os.path.join(folder, name))
        else:
            note_read(os.path.join(folder, "config.json"))


class _stdout:
    """sys.stdout as a context manager that leaves it open."""

    def __enter__(self) -> TextIO:
        return sys.stdout

    def __exit__(self, *exc: object) -> None:
        sys.stdout.flush()
