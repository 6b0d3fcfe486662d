"""Command line: parse → settings → audit → report → exit code (0 clean, 1 findings, 2 errors)."""

from __future__ import annotations

import gc
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from .version import __version__

if TYPE_CHECKING:  # the heavy modules load only when a command needs them, so --version stays instant
    from .config import Settings
    from .options import TraceOptions
    from .report.outcome import Outcome
    from .rules.loader import Rule

__all__ = ["main"]

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
_COMMAND_NAMES = ("check", "rules", "explain", "match", "keep-list", "fix", "train")  # cli_app.COMMANDS, without importing it
_APP_OPTIONS = ("--install-completion", "--show-completion")  # typer's own, for the app, not for check


class UsageError(Exception):
    """The command line itself is wrong: one line, exit 2."""


def _bad_value(option: str, problem: str) -> UsageError:
    return UsageError(f"Invalid value for '{option}': {problem}")


def check(*, models: list[str], dtype: str | None, autocast: str | None, keep_fp32: list[str], converter: str | None,
          runtime: str | None,
          rules: list[str], select: list[str], ignore: list[str], preview: bool | None, output_format: str | None,
          no_group: bool, output: Path | None, fail_on: str | None, exit_zero: bool, statistics: bool,
          baseline: str | None, write_baseline: str | None, show_settings: bool, trace: bool,
          check_weights: bool | None, inputs: list[str], samples: int, dim: list[str], seed: int, trace_engine: str,
          range_: list[str], timeout: float,
          input_shape: list[str], input_dtype: str, trust_pickle: bool, no_color: bool, jobs: int | None,
          debug: bool, no_factories: bool = False) -> int:
    """Audit models against the target dtype (the default command)."""
    from .config import load_settings
    from .errors import InputError
    from .files import check_output

    given = {"dtype": dtype, "autocast": autocast, "keep_fp32": _split(keep_fp32), "rules": list(rules),
             "select": _split(select),
             "ignore": _split(ignore), "preview": preview, "format": output_format,
             "fail_on": fail_on, "baseline": baseline, "check_weights": check_weights, "converter": converter,
             "runtime": runtime}
    # Only flags the user typed override the pyproject: None and empty lists mean "not given".
    settings = load_settings({k: v for k, v in given.items() if v not in (None, [])})
    if show_settings:
        _write_stdout(settings.describe())
        return EXIT_CLEAN
    if not models:
        raise InputError(None, "no model given: precaudit MODEL.onnx [MORE.onnx ...] [options]")
    if statistics and settings.format != "text":
        raise InputError(None, f"--statistics prints a table; it cannot be combined with --format {settings.format}")
    _note_named_inputs(models, settings, inputs)
    # Refuse early what can be known before the run; the write checks again against every file the run read.
    if output is not None:
        check_output(output)
    if write_baseline is not None:  # rewriting the baseline in place is how it is refreshed
        check_output(write_baseline, may_replace=_baseline_file(settings), what="the baseline")
    from .options import TorchOptions

    torch_options = TorchOptions(_shapes(input_shape), input_dtype, trust_pickle, settings.autocast,
                                 factories=_factories(no_factories, trust_pickle))
    trace_options = _trace_options(inputs, samples, dim, seed, trace_engine, range_, timeout)
    trace_options.progress = settings.format == "text" and output is None and _color_ok(no_color)
    from .parallel import default_jobs

    jobs = min(jobs or default_jobs(), len(models))
    if jobs > 1:
        trace_options.progress = False  # one progress line per worker would interleave
    from .context import Audit
    from .pipeline import run_audit

    if settings.runtime == "all":
        return _matrix(settings, models, torch_options, trace_options, trace, output)
    audit = Audit.of(settings, torch_options, trace_options, trace)
    _say_notes(audit)
    outcome = run_audit(audit, models, write_baseline, exit_zero, jobs, debug)
    for err in outcome.result.errors:
        _error(str(err))
    if write_baseline is not None:
        from .escape import printable
        n = outcome.written_to_baseline
        _error(f"wrote {n} finding{'s' * (n != 1)} to the baseline {printable(write_baseline)}")
    if statistics:
        from .report.text import render_statistics
        text = render_statistics(outcome)
    else:
        text = _render(outcome, output is None and _color_ok(no_color), group=not no_group)
    _write(text, output)
    return outcome.exit_code


def list_rules(*, rules: list[str], output_format: str, write_pages: Path | None = None) -> int:
    """List every rule: id, name, severity, whether it runs by default, summary; or write their pages."""
    from .report.rule_docs import render_rule_json, render_rule_table

    all_rules = _rules_for_docs(rules)
    if write_pages is not None:
        return _write_pages(write_pages, all_rules)
    render = render_rule_json if output_format == "json" else render_rule_table
    _write_stdout(render(all_rules))
    return EXIT_CLEAN


def _write_pages(folder: Path, rules: list[Rule]) -> int:
    """The rule pages, into a real folder, over no file the run read (a rule file given as DIR/index.md, or a hard
    link to one): every page is checked before any is written, so a refusal leaves no half-written set."""
    from .errors import InputError
    from .escape import printable
    from .files import check_output, write_new
    from .report.rule_pages import rule_pages

    if folder.is_symlink():
        raise InputError(str(folder), "--write-pages: is a symlink; precaudit writes pages into a real folder")
    if not folder.is_dir():
        raise InputError(str(folder), "--write-pages: no such folder")
    pages = rule_pages(rules)
    for name in pages:
        check_output(folder / name, what="the rule page")
    for name, text in pages.items():
        write_new(folder / name, text, what="the rule page")
    _write_stdout(f"wrote {len(pages)} pages to {printable(str(folder))}\n")
    return EXIT_CLEAN


def explain(*, rule: str, rules: list[str]) -> int:
    """Explain a rule: what it checks, a worked example in numbers, and the fix."""
    from .report.rule_docs import render_explanation

    _write_stdout(render_explanation(_rule_named(rule, rules)))
    return EXIT_CLEAN


def match(*, rule: str, model: str, node: str, dtype: str | None, keep_fp32: list[str], converter: str | None,
          runtime: str | None, rules: list[str], no_factories: bool = False) -> int:
    """Show, node by node, why a rule fires or does not: the pattern step that failed, or the condition's values."""
    from .config import load_settings
    from .context import Audit
    from .escape import printable
    from .options import TorchOptions
    from .rules.match_trace import trace_rule

    given = {"dtype": dtype, "keep_fp32": _split(keep_fp32), "rules": list(rules), "converter": converter,
             "runtime": runtime}
    settings = load_settings({k: v for k, v in given.items() if v not in (None, [])})
    chosen = _rule_named(rule, settings.rules)
    audit = Audit.of(settings, TorchOptions(factories=not no_factories))
    _say_notes(audit)
    graph = audit.load(model)
    resolver = audit.deployment.resolver(graph)
    on = f", --runtime {audit.deployment.runtime.spelled}" if audit.deployment.runtime else ""
    lines = [f"{chosen.id} {chosen.name} on {printable(model)} (--dtype {resolver.target.name}{on})"]
    lines += [f"  {printable(line)}" for line in trace_rule(graph, resolver, chosen, node)]
    _write_stdout("".join(f"{line}\n" for line in lines))
    return EXIT_CLEAN


def _matrix(settings, models, torch_options, trace_options, trace, output) -> int:
    """check --runtime all: the deployment matrix, as text or JSON."""
    from .errors import InputError
    from .matrix import deployment_matrix, render_matrix_json, render_matrix_text

    if settings.format not in ("text", "json"):
        raise InputError(None, f"--runtime all prints the deployment matrix as text or json, not {settings.format}")
    matrix = deployment_matrix(settings, models, torch_options, trace_options, trace, settings.fail_on)
    for err in matrix.errors:
        _error(str(err))
    _write(render_matrix_json(matrix) if settings.format == "json" else render_matrix_text(matrix), output)
    return matrix.exit_code


def _say_notes(audit) -> None:
    """A runtime version judged as the nearest modelled one: one warning line on stderr."""
    for note in audit.notes:
        _error(f"warning: {note}")


def keep_list(*, model: str, target_for: str | None, dtype: str | None, keep_fp32: list[str], runtime: str | None,
              rules: list[str],
              select: list[str], ignore: list[str],
              trace: bool, inputs: list[str], samples: int, dim: list[str], seed: int, trace_engine: str,
          range_: list[str], timeout: float,
              tolerance: float, max_runs: int, output_format: str, output: Path | None, input_shape: list[str],
              input_dtype: str, trust_pickle: bool, debug: bool, no_factories: bool = False,
              policy: str | None = None) -> int:
    """The nodes to keep in float32, as your converter's arguments; verified by emulation with --trace."""
    from .context import Audit
    from .files import check_output
    from .keeplist.command import keep_list_report
    from .options import TorchOptions

    if output is not None:
        check_output(output)
    trace_options = _trace_options(inputs, samples, dim, seed, trace_engine, range_, timeout)
    trace_options.progress = output is None and _color_ok(False)
    from .config import load_settings

    _note_named_inputs([model], load_settings({"rules": list(rules)} if rules else {}), inputs)  # -o never over them
    given = {"dtype": dtype, "keep_fp32": _split(keep_fp32), "rules": list(rules), "select": _split(select),
             "ignore": _split(ignore), "runtime": runtime}
    torch_options = TorchOptions(_shapes(input_shape), input_dtype, trust_pickle,
                                 factories=_factories(no_factories, trust_pickle))
    audit = Audit.of(load_settings({k: v for k, v in given.items() if v not in (None, [])}), torch_options,
                     trace_options, trace)
    _say_notes(audit)
    text, code = keep_list_report(audit, model, target_for, tolerance, max_runs, output_format, policy=policy)
    _write(text, output)
    return code


def fix(*, model: str, output: Path | None, dtype: str | None, dry_run: bool, min_eps: float | None,
        data_floor: str, tolerance: float,
        keep_fp32: list[str], converter: str | None, runtime: str | None, rules: list[str], select: list[str],
        ignore: list[str], trace: bool, inputs: list[str], samples: int, dim: list[str], seed: int, trace_engine: str,
          range_: list[str], timeout: float,
        output_format: str, debug: bool, no_factories: bool = False) -> int:
    """Repair what the audit found, minimally and locally; write a new model, checked against the original."""
    from .config import load_settings
    from .context import Audit
    from .files import check_output
    from .fixer.command import fix_report

    if output is not None:
        check_output(output, what="the fixed model")
    options = _trace_options(inputs, samples, dim, seed, trace_engine, range_, timeout)
    _note_named_inputs([model], load_settings({"rules": list(rules)} if rules else {}), inputs)  # -o never over them
    given = {"dtype": dtype, "keep_fp32": _split(keep_fp32), "rules": list(rules), "select": _split(select),
             "ignore": _split(ignore), "converter": converter, "runtime": runtime}
    audit = Audit.of(load_settings({k: v for k, v in given.items() if v not in (None, [])}), inputs=options,
                     traced=trace)
    _say_notes(audit)
    text, code = fix_report(audit, model, str(output) if output is not None else None, dry_run, min_eps,
                            output_format, tolerance, data_floor)
    _write_stdout(text)
    return code


def train(*, model: str, regime: str, trace: bool, steps: int, loss_scale: float | None, lr: float | None,
          seed: int, timeout: float, rules: list[str], select: list[str], ignore: list[str],
          output_format: str | None, output: Path | None, fail_on: str | None, baseline: str | None, no_color: bool,
          debug: bool) -> int:
    """Audit a PyTorch training step (precaudit/train)."""
    from .files import check_output
    from .frontends.torch_input import torch_input_files

    if output is not None:
        for file in torch_input_files(model) if not os.path.lexists(model) else [model]:
            from .files import note_read
            note_read(file)
        check_output(output)
    from .train.audit import TrainOptions, run_train_audit

    from .config import load_settings
    from .context import Audit

    options = TrainOptions(regime=regime, trace=trace, steps=steps, seed=seed, loss_scale=loss_scale, lr=lr,
                           timeout=timeout)
    options.validate()  # before the configuration: a bad option is the first thing said
    given = {"select": _split(select), "ignore": _split(ignore), "rules": list(rules), "fail_on": fail_on,
             "baseline": baseline}
    audit = Audit.of(load_settings({k: v for k, v in given.items() if v not in (None, [])}))
    outcome = run_train_audit(model, options, debug=debug, audit=audit)
    outcome.settings["format"] = output_format or "text"
    for err in outcome.result.errors:
        _error(str(err))
    _write(_render(outcome, output is None and _color_ok(no_color)), output)
    return outcome.exit_code


def _rule_named(rule: str, extra: list[str]) -> Rule:
    """The rule with this id (PA101) or name (eps-underflow); one line and exit 2 if there is none."""
    from .errors import InputError

    found = [r for r in _rules_for_docs(extra) if r.id == rule.upper() or r.name == rule]
    if not found:
        raise InputError(None, f"unknown rule '{rule}'; `precaudit rules` lists them")
    return found[0]


def _rules_for_docs(extra: list[str]) -> list[Rule]:
    """Built-in rules plus the user's, from --rules or else the pyproject, so org rules are documented too."""
    from .config import load_settings
    from .rules.loader import load_rules

    return load_rules(load_settings({"rules": list(extra)} if extra else {}).rules)


def _factories(no_factories: bool, trust_pickle: bool) -> bool:
    """Whether a model.py:factory may be imported. --no-factories promises that no code from the models' side runs,
    so unpickling a module is refused with it."""
    if no_factories and trust_pickle:
        raise UsageError("--trust-pickle unpickles code from the model file, which --no-factories forbids")
    return not no_factories


def _shapes(entries: list[str]) -> list[tuple[int, ...]]:
    """--input-shape 2,8 --input-shape 2,8,16: one shape per forward() argument."""
    try:
        return [tuple(int(d) for d in entry.split(",") if d.strip()) for entry in entries]
    except ValueError:
        raise _bad_value("--input-shape", f"shapes are comma-separated integers, got {entries}") from None


def _trace_options(inputs: list[str], samples: int, dim: list[str], seed: int, engine: str, range_: list[str],
                   timeout: float) -> TraceOptions:
    """The traced-mode flags, each checked by the check the Python API's trace= gets, named as typed (typer has
    checked --samples >= 1, --seed >= 0 and --timeout >= 0); made with or without --trace, so a wrong value is
    refused either way, and --dim sizes the static pass too."""
    from .options import TraceOptions, check_trace_option

    return TraceOptions(list(inputs), samples, _dims(dim), seed, check_trace_option("engine", engine, "--trace-engine"),
                        ranges=_ranges(range_), timeout=check_trace_option("timeout", timeout, "--timeout") or None)


def _ranges(entries: list[str]) -> dict[str, tuple[float, float]]:
    """--range x=-32768:32767 --range mask=0:1."""
    from .options import check_trace_option

    ranges = {}
    for entry in entries:
        name, _, span = entry.partition("=")
        lo, sep, hi = span.rpartition(":")
        try:
            if not name.strip() or not sep:
                raise ValueError(entry)
            ranges[name.strip()] = (float(lo), float(hi))
        except ValueError:
            raise _bad_value("--range", f"expected NAME=LO:HI with finite LO <= HI, got {entry!r}") from None
    return check_trace_option("ranges", ranges, "--range")  # the values: as the API's trace={"ranges": ...}


def _dims(entries: list[str]) -> dict[str, int]:
    """--dim batch=2 --dim seq=128."""
    from .options import check_trace_option

    dims = {}
    for entry in entries:
        name, _, size = entry.partition("=")
        if not name.strip() or not (size.isascii() and size.isdigit()):  # int() refuses '²', which isdigit() accepts
            raise _bad_value("--dim", f"expected NAME=SIZE with SIZE >= 1, got {entry!r}")
        dims[name.strip()] = int(size)
    return check_trace_option("dims", dims, "--dim")  # the sizes: as the API's trace={"dims": ...}


def _split(entries: list[str]) -> list[str]:
    """--select PA101,PA102 and --select PA101 --select PA102 mean the same."""
    return [item.strip() for entry in entries for item in entry.split(",") if item.strip()]


def _render(outcome: Outcome, color: bool, group: bool = True) -> str:
    from .report import render

    return render(outcome, color=color, group=group)


def _note_named_inputs(models: list[str], settings: Settings, inputs: list[str]) -> None:
    """Record every file named on the command line or in the config as read by this run: no output goes over one."""
    from .files import note_read
    from .frontends.torch_input import is_torch_input, torch_input_files

    named: list[tuple[str | Path | None, str | None]] = [
        *((i, "an --inputs file") for i in inputs), *((r, "a rules file") for r in settings.rules),
        (settings.baseline, "the baseline"), (settings.config_file, "the configuration")]
    for spec in models:  # model.py:factory reads model.py
        if is_torch_input(spec) and not os.path.lexists(spec):
            named.extend((file, f"the code of {spec}") for file in torch_input_files(spec))
        else:
            named.append((spec, None))
    for item, role in named:
        if not item:
            continue
        path = Path(item)
        for file in (path.glob("*.y*ml") if path.is_dir() else [path]):
            note_read(file, role)


def _baseline_file(settings: Settings) -> tuple[str, ...]:
    return (settings.baseline,) if settings.baseline else ()


def _write(text: str, output: Path | None) -> None:
    if output is None:
        _write_stdout(text)
        return
    from .files import note_imported, write_new

    note_imported()
    write_new(output, text)


def _write_stdout(text: str) -> None:
    from .errors import InputError
    try:
        if sys.stdout is None:
            raise OSError("standard output is closed")
        sys.stdout.write(text)
        sys.stdout.flush()
    except (OSError, ValueError) as exc:
        _silence_stdout()  # the interpreter would fail again flushing it at exit, with a second message
        problem = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError("standard output", f"cannot write the report: {problem}") from None


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        sys.stdout = None


def _color_ok(no_color: bool) -> bool:
    return not no_color and "NO_COLOR" not in os.environ and sys.stdout is not None and sys.stdout.isatty()


def _dispatch(args: list[str]) -> int:
    """`precaudit MODEL ...` is `precaudit check MODEL ...`; a command's own name picks the others."""
    if args and args[0] == "--version":  # before typer is imported: instant
        _write_stdout(f"precaudit {__version__}\n")
        return EXIT_CLEAN
    from .cli_app import top_help

    if not args:  # a bare `precaudit` is a usage error that shows what to type
        sys.stderr.write(top_help())
        return EXIT_ERROR
    if args[0] in ("-h", "--help"):
        _write_stdout(top_help())
        return EXIT_CLEAN
    if args[0] not in _COMMAND_NAMES and args[0] not in _APP_OPTIONS:
        args = ["check", *args]
    import typer
    import typer.main

    from .cli_app import app

    command = typer.main.get_command(app())
    try:
        code = command.main(args, prog_name="precaudit", standalone_mode=False)
    except typer.Exit as exc:  # --help, --install-completion: printed already
        return EXIT_CLEAN if getattr(exc, "exit_code", 0) in (0, None) else EXIT_ERROR
    except typer.Abort:
        raise KeyboardInterrupt from None
    except typer.TyperException as exc:  # a usage error (typer's own click): said in one line by main
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        raise UsageError(message) from None
    return EXIT_CLEAN if code is None else int(code)


def main(argv: list[str] | None = None) -> int:
    """Entry point: every failure becomes one line on stderr and exit code 2, never a traceback."""
    from .files import start_run

    args = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in (args[:args.index("--")] if "--" in args else args)  # after --, a file named --debug
    start_run()
    try:
        with warnings.catch_warnings():  # a library's warning would be a second stderr line; the report says it all
            if not debug:
                warnings.simplefilter("ignore")
            code = _dispatch(args)
    except KeyboardInterrupt:
        _error("interrupted")
        code = EXIT_ERROR
    except BaseException as exc:  # usage errors, InputError, a library's sys.exit, anything unexpected: one line
        from .errors import InputError
        if debug:
            traceback.print_exc()
        if isinstance(exc, UsageError):
            _error(f"{_one_line(str(exc))} (precaudit --help shows the usage)")
        elif isinstance(exc, InputError):
            _error(str(exc))
        elif isinstance(exc, OSError) and exc.filename is not None:  # a path the user gave the system refused
            _error(str(InputError(_shortened(os.fsdecode(exc.filename)), exc.strerror or type(exc).__name__)))
        elif isinstance(exc, SystemExit):
            _error(f"internal error: something called exit({exc.code!r}) (rerun with --debug for a traceback)")
        else:
            _error(f"internal error: {type(exc).__name__}: {_one_line(str(exc))} (rerun with --debug for a traceback)")
        code = EXIT_ERROR
    code = EXIT_CLEAN if code is None else int(code)
    if argv is None:
        # The process ends here: what the run made (a large model's graph is some 200,000 linked objects) is left to
        # the OS rather than walked and freed by the cycle collector at exit (90 ms for a 20,000-node graph).
        gc.freeze()
        sys.exit(code)
    return code


def _error(message: str) -> None:
    """One line on stderr; a stderr that cannot be written to is not worth a second failure. A CI runner parses
    stderr for workflow commands too: the line starts with `precaudit:`, and log_line breaks any `##[`."""
    from .escape import log_line
    try:
        sys.stderr.write(log_line(f"precaudit: {message}\n"))
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass


def _shortened(path: str, keep: int = 200) -> str:
    """A path as an error line names it: its start and end, where it is longer than any file system allows."""
    return path if len(path) <= keep else f"{path[:keep // 2]}...({len(path)} characters)...{path[-keep // 2:]}"


def _one_line(text: str) -> str:
    from .escape import printable
    return printable(" ".join(text.split("\n")).strip())
