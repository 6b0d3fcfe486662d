"""Command line: parse → settings → audit → report → exit code (0 clean, 1 findings, 2 errors).

main() is the door: `--version` answered before anything else is imported (instant), the rest parsed by the grammar
(grammar.py, on typer) and run by the command's own module (check.py, keep_list.py, ...); every failure becomes one
line on stderr and exit 2, never a traceback (--debug adds it).
"""

from __future__ import annotations

import gc
import os
import sys
import traceback
import warnings

from ..version import __version__
from .given import EXIT_CLEAN, EXIT_ERROR

__all__ = ["main"]


def _dispatch(args: list[str]) -> int:
    if args[:1] == ["--version"]:  # before typer is imported: instant
        from .output import write_stdout

        write_stdout(f"precaudit {__version__}\n")
        return EXIT_CLEAN
    from .grammar import run

    return run(args)


def main(argv: list[str] | None = None) -> int:
    """Entry point: every failure becomes one line on stderr and exit code 2, never a traceback."""
    from ..files import start_run

    args = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in (args[:args.index("--")] if "--" in args else args)  # after --, a file named --debug
    start_run()
    try:
        with warnings.catch_warnings():  # a library's warning would be a second stderr line; the report says it all
            if not debug:
                warnings.simplefilter("ignore")
            code = _dispatch(args)
    except KeyboardInterrupt:
        _say("interrupted")
        code = EXIT_ERROR
    except BaseException as exc:  # usage errors, InputError, a library's sys.exit, anything unexpected: one line
        if debug:
            traceback.print_exc()
        _say(_one_line_of(exc))
        code = EXIT_ERROR
    code = EXIT_CLEAN if code is None else int(code)
    if argv is None:
        # The process ends here: what the run made (a large model's graph is some 200,000 linked objects) is left to
        # the OS rather than walked and freed by the cycle collector at exit (90 ms for a 20,000-node graph).
        gc.freeze()
        sys.exit(code)
    return code


def _one_line_of(exc: BaseException) -> str:
    """What a failure says, in one line: a usage error points at --help, a bad input names its file."""
    from ..errors import InputError
    from .given import UsageError

    if isinstance(exc, UsageError):
        return f"{_one_line(str(exc))} (precaudit --help shows the usage)"
    if isinstance(exc, InputError):
        return str(exc)
    if isinstance(exc, OSError) and exc.filename is not None:  # a path the user gave the system refused
        return str(InputError(_shortened(os.fsdecode(exc.filename)), exc.strerror or type(exc).__name__))
    if isinstance(exc, SystemExit):
        return f"internal error: something called exit({exc.code!r}) (rerun with --debug for a traceback)"
    return f"internal error: {type(exc).__name__}: {_one_line(str(exc))} (rerun with --debug for a traceback)"


def _say(message: str) -> None:
    from .output import say

    say(message)


def _shortened(path: str, keep: int = 200) -> str:
    """A path as an error line names it: its start and end, where it is longer than any file system allows."""
    return path if len(path) <= keep else f"{path[:keep // 2]}...({len(path)} characters)...{path[-keep // 2:]}"


def _one_line(text: str) -> str:
    from ..escape import printable
    return printable(" ".join(text.split("\n")).strip())
