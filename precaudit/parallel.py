"""-j N: audit several models in parallel processes, merged in input order exactly as one process would give.

Each model is audited alone in a worker forked from a clean server process that has imported precaudit once (not
from this process: torch and onnxruntime keep threads and state a fork would copy half-way), which sends back its AuditResult and the identities of the files it read, so that -o still
refuses every input. A worker that dies (a factory calling os._exit, a crash in a C extension) is that model's
error: the models that were waiting with it are retried, each in a worker of its own.

run_isolated runs one piece of the user's code (precaudit train's factory and step) in such a worker, alone, with a
time limit: a factory that sleeps, exits, forks or prints cannot hang the run, end it without a report, report
twice or write into the report.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from .audit_models import _internal_error, audit_models
from .errors import InputError
from .files import add_read, note_imported, read_so_far, start_run
from .result import AuditResult

__all__ = ["audit_in_parallel", "default_jobs", "run_isolated"]

T = TypeVar("T")


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def audit_in_parallel(paths: list[str], jobs: int, debug: bool = False, timeout: float | None = None,
                      **kwargs: Any) -> AuditResult:
    """audit_models(paths, **kwargs), with up to `jobs` models at a time in worker processes. One at a time, a model
    whose own code runs (a model.py:factory) is audited in a worker of its own all the same, stopped after timeout
    seconds (None: no limit): its os._exit, fork, print or endless loop cannot end or hang the run without a report,
    report twice or write into the report."""
    kwargs = {**kwargs, "debug": debug}
    if jobs <= 1 or len(paths) <= 1:
        if not any(_runs_code(p) for p in paths):
            return audit_models(paths, **kwargs)
        return _merged([_isolated_audit(p, kwargs, timeout) if _runs_code(p) else (audit_models([p], **kwargs), [])
                        for p in paths])
    if any(_runs_code(p) for p in paths):  # each model in a worker of its own, which a time limit may end alone
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(jobs, len(paths))) as threads:
            return _merged(list(threads.map(
                lambda p: _isolated_audit(p, kwargs, timeout if _runs_code(p) else None), paths)))
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

    broken = []
    context = _context("precaudit.audit_models")
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_quiet_worker,
                                initargs=(debug,)) as pool:
        futures = {i: pool.submit(_audit_one, paths[i], kwargs) for i in which}
        for i, future in futures.items():
            try:
                out[i] = future.result()
            except cf.process.BrokenProcessPool:
                broken.append(i)
    return broken


def _context(preload: str):
    """The forkserver every worker is forked from; preload is imported once in the server, not once per worker (the
    first caller's: the server starts once per process)."""
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([preload])
    return context


def _quiet_worker(debug: bool) -> None:
    os.dup2(2, 1)  # what a model's code prints (print() and native code alike) goes to stderr: stdout is the report's
    if not debug:  # the parent silences library warnings the same way (cli.main)
        warnings.simplefilter("ignore")


def _runs_code(path: str) -> bool:
    """A model.py:factory or package.module:factory: importing and calling it runs the model's own code (a module the
    API registered is the caller's object, already running in this process)."""
    from .frontends.torch_objects import factory_spec

    return factory_spec(path) is not None


def _isolated_audit(path: str, kwargs: dict, timeout: float | None) -> tuple[AuditResult, list]:
    """One model audited by run_isolated; what stops it (an exit, a crash, the time limit) is that model's error."""
    from .frontends.torch_input import check_torch_installed

    try:
        if _runs_code(path):
            check_torch_installed(path)
        result, _ = run_isolated(_audit_one, (path, kwargs), path, "auditing it", timeout, kwargs.get("debug", False),
                                 preload="precaudit.audit_models")
    except InputError as exc:
        return AuditResult(errors=[exc]), []
    return result, []


def _audit_one(path: str, kwargs: dict) -> tuple[AuditResult, list]:
    start_run()
    result = audit_models([path], **kwargs)
    return result, read_so_far()


def _merged(per_model: list) -> AuditResult:
    merged = AuditResult()
    for result, read in per_model:
        merged.findings.extend(result.findings)
        merged.errors.extend(result.errors)
        merged.models.extend(result.models)
        merged.traces.update(result.traces)
        merged.dtype_maps.update(result.dtype_maps)
        merged.quantized.update(result.quantized)
        add_read(read)
    return merged


def run_isolated(function: Callable[..., T], args: tuple, file: str, doing: str, timeout: float | None,
                 debug: bool = False, preload: str = "precaudit.audit_models") -> T:
    """function(*args) in a worker of its own, forked from the server -j's workers come from (preload: the module it
    imports once), and its result. What the worker raises comes back as one InputError for file, as does a worker
    that dies without a result or runs past timeout seconds (None: no limit; it is killed, with whatever it
    forked); doing says what it ran. The worker's stdout is its stderr: what the user's code prints never reaches
    the report. The files it read are added to this run's (-o refuses each)."""
    import multiprocessing
    from multiprocessing.connection import wait

    context = _context(preload)
    receive, send = context.Pipe(duplex=False)
    # this process's folder, import path and multiprocessing start method, not the server's (it started once, maybe
    # elsewhere; its start method would register every lock the user's code makes, tqdm's in torch.fx too, with a
    # tracker that prints a warning for each one a killed worker leaves)
    start_method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    here = (os.getcwd(), list(sys.path), start_method)  # (the first start method is the platform's default)
    worker = context.Process(target=_isolated, args=(send, function, args, file, debug, here), daemon=True)
    worker.start()
    send.close()  # the worker holds the only writing end: its death is an end of file here
    grace = 0.0
    try:
        if not wait([receive, worker.sentinel], timeout):
            raise InputError(file, f"{doing} stopped after {timeout:g} s (--timeout; 0 for no limit)")
        try:
            done, value, read = receive.recv() if receive.poll() else _died(worker, file, doing)
        except EOFError:
            done, value, read = _died(worker, file, doing)
        grace = 5.0  # a worker that gave its result ends by itself, its exit handlers run
    finally:
        _end(worker, grace)
        receive.close()
    add_read(read)
    if not done:
        raise value
    return value


def _isolated(send, function: Callable, args: tuple, file: str, debug: bool, here: tuple[str, list[str], str]
              ) -> None:
    import multiprocessing

    os.setpgid(0, 0)  # a process group of its own: what the user's code forks is killed with it (_end)
    os.dup2(2, 1)  # print() and native code writing to fd 1 alike land on stderr: stdout is the report's
    cwd, sys.path[:], start_method = here
    os.chdir(cwd)
    multiprocessing.set_start_method(start_method, force=True)
    _quiet_worker(debug)
    start_run()
    pid = os.getpid()
    try:
        outcome: tuple[bool, Any] = (True, function(*args))
    except InputError as exc:
        outcome = (False, exc)
    except (Exception, SystemExit) as exc:  # as audit_models says an unexpected failure: that model's error
        if debug:
            import traceback

            traceback.print_exc()
        outcome = (False, _internal_error(file, exc))
    if os.getpid() != pid:
        os._exit(0)  # a copy of this process the user's code forked: the worker reports, once
    note_imported()
    sys.stdout.flush()
    sys.stderr.flush()
    send.send((*outcome, read_so_far()))


def _died(worker, file: str, doing: str) -> tuple[bool, Any, list]:
    """(False, the error, no files read): what a worker that ended without a result gives."""
    worker.join()
    code = worker.exitcode
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown"
        ended = f"was killed by signal {-code} ({name})"
    else:
        ended = f"exited with code {code}"
    return False, InputError(file, f"the process {doing} {ended} before it gave a result (os._exit or a signal in "
                                   "the user's code, or a crash in native code)"), []


def _end(worker, grace: float) -> None:
    """After grace seconds, the worker and every process in its group killed, where still running; the worker
    reaped."""
    worker.join(grace)
    for kill in (lambda: os.killpg(worker.pid, signal.SIGKILL), worker.kill):
        # ended already, or (killpg) killed before it made its group: worker.kill() reaches it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill()
    worker.join()
