"""-j N: audit several models in parallel processes, merged in input order exactly as one process would give.

Each model is audited alone in a worker forked from a clean server process that has imported precaudit once (not
from this process: torch and onnxruntime keep threads and state a fork would copy half-way), which sends back its AuditResult and the identities of the files it read, so that -o still
refuses every input. A worker that dies (a factory calling os._exit, a crash in a C extension) is that model's
error: the models that were waiting with it are retried, each in a worker of its own.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from . import files
from .audit_models import audit_models
from .result import AuditResult
from .errors import InputError

__all__ = ["audit_in_parallel", "default_jobs"]


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def audit_in_parallel(paths: list[str], jobs: int, debug: bool = False, **kwargs: Any) -> AuditResult:
    """audit_models(paths, **kwargs), with up to `jobs` models at a time in worker processes."""
    kwargs = {**kwargs, "debug": debug}
    if jobs <= 1 or len(paths) <= 1:
        return audit_models(paths, **kwargs)
    per_model: list[tuple[AuditResult, list] | None] = [None] * len(paths)
    broken = _run_pool(paths, range(len(paths)), min(jobs, len(paths)), debug, kwargs, per_model)
    for i in broken:  # alone now: a worker that dies again died of this model
        if _run_pool(paths, [i], 1, debug, kwargs, per_model):
            died = InputError(paths[i], "the process auditing it died (a crash in native code, or the model's code "
                                        "called os._exit)")
            per_model[i] = (AuditResult(errors=[died]), [])
    return _merged(per_model)


def _run_pool(paths: list[str], which, workers: int, debug: bool, kwargs: dict, out: list) -> list[int]:
    """Audit paths[i] for i in which; fills out[i]; returns the indexes whose worker pool broke under them."""
    import concurrent.futures as cf  # with its logging and multiprocessing: 25 ms no single-model run should pay
    import multiprocessing

    broken = []
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["precaudit.audit_models"])  # imported once in the server, not once per worker
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_quiet_worker,
                                initargs=(debug,)) as pool:
        futures = {i: pool.submit(_audit_one, paths[i], kwargs) for i in which}
        for i, future in futures.items():
            try:
                out[i] = future.result()
            except cf.process.BrokenProcessPool:
                broken.append(i)
    return broken


def _quiet_worker(debug: bool) -> None:
    if not debug:  # the parent silences library warnings the same way (cli.main)
        warnings.simplefilter("ignore")


def _audit_one(path: str, kwargs: dict) -> tuple[AuditResult, list]:
    files.start_run()
    result = audit_models([path], **kwargs)
    return result, files.read_so_far()


def _merged(per_model: list) -> AuditResult:
    merged = AuditResult()
    for result, read in per_model:
        merged.findings.extend(result.findings)
        merged.errors.extend(result.errors)
        merged.models.extend(result.models)
        merged.traces.update(result.traces)
        merged.dtype_maps.update(result.dtype_maps)
        merged.quantized.update(result.quantized)
        files.add_read(read)
    return merged
