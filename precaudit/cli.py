"""Command line: parse → settings → audit → report → exit code (0 clean, 1 findings, 2 errors)."""

from __future__ import annotations

import os
import sys
import traceback
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer
from typer.core import TyperGroup

from . import __version__

__all__ = ["app", "main"]

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


class _DefaultToCheck(TyperGroup):
    """`precaudit model.onnx` means `precaudit check model.onnx`: anything that is not a command goes to check."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = ["check", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(cls=_DefaultToCheck, add_completion=False, pretty_exceptions_enable=False,
                  help="Precision audit for ML models: where will this graph lose its numbers in fp16, bf16 or fp8?")


class OutputFormat(str, Enum):
    text = "text"
    json = "json"


class FailOn(str, Enum):
    error = "error"
    warning = "warning"
    info = "info"
    never = "never"


def _version(value: bool) -> None:
    if value:
        typer.echo(f"precaudit {__version__}")
        raise typer.Exit(EXIT_CLEAN)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Precision audit for ML models."""


@app.command()
def check(
    models: List[str] = typer.Argument(..., metavar="MODEL...", help="ONNX model files to audit."),
    dtype: str = typer.Option("fp16", "--dtype", "-d",
                              help="Target dtype: fp16, bf16, fp8-e4m3, fp8-e5m2 or fp32."),
    keep_fp32: List[str] = typer.Option([], "--keep-fp32", metavar="OP_OR_NODE,...",
                                        help="Op types, node names or globs kept in float32 (your converter's block list)."),
    rules: List[str] = typer.Option([], "--rules", metavar="PATH",
                                    help="Extra YAML rule file or folder; may override built-in severities and params."),
    output_format: OutputFormat = typer.Option(OutputFormat.text, "--format", "-f", help="Report format."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the report to this file."),
    fail_on: FailOn = typer.Option(FailOn.error, "--fail-on",
                                   help="Exit 1 when a finding of this severity or worse is found."),
    no_color: bool = typer.Option(False, "--no-color", help="Plain text even on a terminal."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
) -> int:
    """Audit models against the target dtype (the default command)."""
    from .audit import audit_models
    from .dtypes import format_named
    from .errors import InputError
    from .finding import severity_rank
    from .rules.loader import load_rules

    try:
        target = format_named(dtype)
    except KeyError as exc:
        raise typer.BadParameter(str(exc.args[0]), param_hint="'--dtype'") from None
    keep = [item.strip() for entry in keep_fp32 for item in entry.split(",") if item.strip()]
    if output is not None and output.resolve() in {Path(p).resolve() for p in [*models, *rules]}:
        raise InputError(str(output), "refusing to write the report over one of the inputs")
    rule_set = [r for r in load_rules(rules) if not r.preview]
    result = audit_models(models, target, rule_set, keep)
    for err in result.errors:
        typer.echo(f"precaudit: {err}", err=True)

    threshold = severity_rank(fail_on.value) if fail_on is not FailOn.never else 99
    failing = any(severity_rank(f.severity) >= threshold for f in result.findings)
    code = EXIT_ERROR if result.errors else EXIT_FINDINGS if failing else EXIT_CLEAN
    settings = {"dtype": target.name, "fail_on": fail_on.value, "keep_fp32": keep, "rules": list(rules),
                "format": output_format.value}
    _write(_render(result, settings, code, output_format, output is None and _color_ok(no_color)), output)
    return code


def _render(result, settings: dict, code: int, fmt: OutputFormat, color: bool) -> str:
    if fmt is OutputFormat.json:
        from .report.json import render_json
        return render_json(result, settings, code)
    from .report.text import render_text
    return render_text(result, settings, color=color)


def _write(text: str, output: Optional[Path]) -> None:
    if output is None:
        sys.stdout.write(text)
        return
    from .errors import InputError
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(str(output), f"cannot write the report: {exc.strerror or exc}") from None


def _color_ok(no_color: bool) -> bool:
    return not no_color and "NO_COLOR" not in os.environ and sys.stdout.isatty()


def _is_usage_error(exc: Exception) -> bool:
    # typer may vendor its own copy of click, so match click's exception class by name, not identity.
    return any(cls.__name__ == "ClickException" for cls in type(exc).__mro__)


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point: every failure becomes one line on stderr and exit code 2, never a traceback."""
    args = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in args
    command = typer.main.get_command(app)
    try:
        code = command.main(args=args, prog_name="precaudit", standalone_mode=False)
    except typer.Exit as exc:
        code = exc.exit_code
    except typer.Abort:
        typer.echo("precaudit: aborted", err=True)
        code = EXIT_ERROR
    except Exception as exc:  # usage errors, InputError and anything unexpected: one line, exit 2
        from .errors import InputError
        if debug:
            traceback.print_exc()
        if _is_usage_error(exc):
            exc.show()
        elif isinstance(exc, InputError):
            typer.echo(f"precaudit: {exc}", err=True)
        else:
            typer.echo(f"precaudit: internal error: {type(exc).__name__}: {exc} (rerun with --debug for a traceback)",
                       err=True)
        code = EXIT_ERROR
    code = EXIT_CLEAN if code is None else int(code)
    if argv is None:
        sys.exit(code)
    return code
