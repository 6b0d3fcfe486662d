"""`precaudit scales`: the command, parsing its own options, so that the command line registers it in one line:

    if args[0] == "scales": return scales_main(args[1:])

Exit codes: 0 clean, 1 error findings, 2 bad input (one line on stderr naming the file and the problem).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import NoReturn

from ..errors import InputError
from ..escape import log_line

__all__ = ["run_scales", "scales_main"]

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
FORMATS = ("text", "json", "sarif")

DESCRIPTION = """Check a quantized checkpoint's scales without loading it: a .safetensors file, a folder of shards,
or a model.safetensors.index.json. Reads the headers and the scale tensors only; recognises the ModelOpt
(NVFP4, FP8, MXFP8), compressed-tensors (NVFP4, MXFP4, FP8, int), transformers (MXFP4, FP8 blocks) and torchao
layouts; reports every scale tensor's exact NaN, inf, zero, subnormal and negative entries, global scales on the
wrong side of their convention, scale shapes that do not fit their weight, modules claimed by two quantization
groups, and quantized weights whose scales are missing."""


class UsageError(Exception):
    """The command line itself is wrong: one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _parser() -> _Parser:
    parser = _Parser(prog="precaudit scales", description=DESCRIPTION)
    parser.add_argument("checkpoint", nargs="?", metavar="CHECKPOINT",
                        help="A .safetensors file, a folder of shards, or a *.safetensors.index.json.")
    parser.add_argument("--format", "-f", choices=FORMATS, default="text", help="Report format (default: text).")
    parser.add_argument("--output", "-o", metavar="FILE",
                        help="Write the report (with --manifest: append the JSON lines) to FILE, not stdout.")
    parser.add_argument("--manifest", metavar="FILE",
                        help="Scan the checkpoints FILE lists, one a line (relative to FILE's folder); one JSON line "
                             "per checkpoint as each finishes.")
    parser.add_argument("--jobs", "-j", type=int, default=None, metavar="N",
                        help="With --manifest: scan N checkpoints at a time (default: the cores available).")
    parser.add_argument("--resume", action="store_true",
                        help="With --manifest -o FILE: skip the checkpoints FILE already has a line for.")
    parser.add_argument("--debug", action="store_true", help="Show a traceback on errors.")
    return parser


def _error(message: str) -> None:
    """One line on stderr, as precaudit's own (`precaudit: ...`, no `##[` a CI runner would act on)."""
    try:
        sys.stderr.write(log_line(f"precaudit: {message}\n"))
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass


def scales_main(args: list[str]) -> int:
    """`precaudit scales ARGS`: parse, scan, report; the exit code. Bad input and usage errors are one line on
    stderr and 2; anything unexpected propagates to precaudit's own main (which says it in one line)."""
    from ..files import start_run

    start_run()
    debug = "--debug" in args
    try:
        options = _parser().parse_args(args)
    except UsageError as exc:
        _error(f"scales: {exc} (precaudit scales --help shows the usage)")
        return EXIT_ERROR
    except SystemExit as exc:  # --help, printed already
        return EXIT_CLEAN if exc.code in (0, None) else EXIT_ERROR
    try:
        return run_scales(options.checkpoint, options.format, options.output, options.manifest, options.jobs,
                          options.resume)
    except (InputError, UsageError) as exc:
        if debug:
            traceback.print_exc()
        _error(str(exc) if isinstance(exc, InputError) else f"scales: {exc}")
        return EXIT_ERROR


def run_scales(checkpoint: str | None, output_format: str = "text", output: str | None = None,
               manifest: str | None = None, jobs: int | None = None, resume: bool = False) -> int:
    """The command with typed options (for a command line that parses them itself): the exit code."""
    if manifest is not None:
        if checkpoint is not None:
            raise UsageError("give either CHECKPOINT or --manifest FILE, not both")
        if output_format != "text":
            raise UsageError("--manifest writes JSON lines; --format does not apply")
        if resume and output is None:
            raise UsageError("--resume continues a results file: give it with -o FILE")
        if jobs is not None and jobs < 1:
            raise UsageError(f"--jobs must be at least 1, got {jobs}")
        from .manifest import run_manifest

        run = run_manifest(manifest, output, resume, jobs or _cores(), _error)
        _error(f"scanned {run.scanned} checkpoint{'s' * (run.scanned != 1)}"
               + (f", skipped {run.skipped} already in the results" if run.skipped else ""))
        return run.worst
    if checkpoint is None:
        raise UsageError("no checkpoint given: precaudit scales CHECKPOINT (or --manifest FILE)")
    if jobs is not None or resume:
        raise UsageError("--jobs and --resume go with --manifest")
    from ..files import check_output, write_new
    from .scanner import scan

    if output is not None:
        check_output(output)
    report = scan(checkpoint)
    text = {"text": report.to_text, "json": report.to_json, "sarif": report.to_sarif}[output_format]()
    if output is None:
        _write_stdout(text)
    else:
        write_new(output, text)
    return EXIT_FINDINGS if report.exit_code else EXIT_CLEAN


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _write_stdout(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except (OSError, ValueError) as exc:
        problem = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError("standard output", f"cannot write the report: {problem}") from None
