"""The command line's grammar, on typer: every command, argument and option, typed and documented once.

Each command here only declares its parameters and hands them, as a Given, to the function of the module of the same
name (check.py, keep_list.py, ...), which does the work; nothing there imports this module. `precaudit MODEL` is
`precaudit check MODEL`: DefaultCommandGroup resolves a first word that is no command as the default command's.
Completion (the --show-completion and --install-completion options, and TAB through click's environment protocol),
--help, "did you mean" and the formatting of usage errors are typer's own. typer runs in click's non-standalone
mode: run() returns the exit code, and a usage error comes back as a UsageError that main() says in one line.

Adding a command: its module beside this one with a function of a Given returning the exit code, and one function
here that declares its options under @app.command (see `rules` for a small one). `test` runs other command lines:
its module gets run() and parse() from here, as arguments, and so imports no grammar.
"""

import os
from collections.abc import Callable
from difflib import get_close_matches
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from ..options import AUTOCAST
from .flags import (
    Baseline,
    CheckWeights,
    Converter,
    Debug,
    Dim,
    Dtype,
    Engine,
    ExtendIgnore,
    ExtendSelect,
    FailOn,
    Ignore,
    InputDtype,
    Inputs,
    InputShape,
    Isolated,
    KeepFp32,
    ListFormat,
    Many,
    NoColor,
    NoFactories,
    Range,
    ReportFile,
    ReportFormat,
    Rules,
    RuntimeOpt,
    Samples,
    Seed,
    Select,
    Timeout,
    Trace,
    TrustPickle,
    Version,
    _among,
    _checked,
    _for_targets,
)
from .given import EXIT_ERROR, Given, UsageError

if TYPE_CHECKING:  # the base class's own types (typer.Context is a subclass of click's)
    from typer._click import Context, HelpFormatter

__all__ = ["DefaultCommandGroup", "app", "run"]

PROG = "precaudit"
DESCRIPTION = "Precision audit for ML models: where will this graph lose its numbers in fp16, bf16 or fp8?"
_SHELLS = ("bash", "zsh", "fish", "pwsh", "powershell")


class DefaultCommandGroup(TyperGroup):
    """A group whose first word, when it names no command, is the default command's own (`precaudit MODEL
    --dtype bf16`, `precaudit --dtype bf16 MODEL`, `precaudit -- --odd-name.onnx`): parsed, completed and shown in
    --help as that command's."""

    default_command = "check"

    def parse_args(self, ctx: "Context", args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0].partition("=")[0] not in self._own_options(ctx):
            if not ctx.resilient_parsing:
                self._refuse_a_mistyped_command(ctx, args[0])
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)

    def _refuse_a_mistyped_command(self, ctx: "Context", word: str) -> None:
        """A first word close to a command's name that can name no model (no '.', '/' or ':', no such file): the
        command mistyped, said as typer says it, not audited as a model."""
        if word.startswith("-") or any(c in word for c in "./:\\") or os.path.lexists(word):
            return
        close = get_close_matches(word, list(self.commands))
        if close:
            ctx.fail(f"No such command {word!r}. Did you mean {close[0]!r}?")

    def _own_options(self, ctx: "Context") -> set[str]:
        return {name for param in self.get_params(ctx) for name in (*param.opts, *param.secondary_opts)}

    def shell_complete(self, ctx: "Context", incomplete: str) -> list[Any]:
        """The commands and the group's options, and where an option is begun the default command's options too."""
        results = super().shell_complete(ctx, incomplete)
        if incomplete.startswith("-"):
            default = self.commands[self.default_command]
            with typer.Context(default, info_name=self.default_command, parent=ctx, resilient_parsing=True) as sub:
                seen = {item.value for item in results}
                results += [item for item in default.shell_complete(sub, incomplete) if item.value not in seen]
        return results

    def format_help(self, ctx: "Context", formatter: "HelpFormatter") -> None:
        """typer's help of the group, then the default command's arguments and options."""
        super().format_help(ctx, formatter)
        name = self.default_command
        default = self.commands[name]
        with typer.Context(default, info_name=name, parent=ctx) as sub:
            formatter.write_paragraph()
            formatter.write_text(f"The default command, {name} (`{PROG} MODEL` is `{PROG} {name} MODEL`):")
            default.format_options(sub, formatter)

    def _main_shell_completion(self, ctx_args: Any, prog_name: str, complete_var: str | None = None) -> None:
        """A completion request in the environment (_PRECAUDIT_COMPLETE=complete_bash, as typer's script sends it,
        or bash_complete, click's spelling): the completions on stdout, and the exit code returned, not exited."""
        complete_var = complete_var or f"_{prog_name}_COMPLETE".replace("-", "_").upper()
        instruction = os.environ.get(complete_var)
        if not instruction:
            return
        from typer.completion import shell_complete

        shell, _, verb = instruction.partition("_")
        if shell in _SHELLS:  # click's {shell}_{instruction}; typer reads {instruction}_{shell}
            instruction = f"{verb}_{shell}"
        raise typer.Exit(shell_complete(self, ctx_args, prog_name, complete_var, instruction))


app = typer.Typer(name=PROG, help=DESCRIPTION, cls=DefaultCommandGroup, add_completion=True,
                  pretty_exceptions_enable=False, rich_markup_mode=None, subcommand_metavar="[COMMAND] [ARGS]...",
                  context_settings={"help_option_names": ["-h", "--help"]})


@app.callback(invoke_without_command=True, epilog=f"`{PROG} COMMAND --help` shows a command's options.")
def root(ctx: typer.Context, version: Version = False) -> None:
    if ctx.invoked_subcommand is None:  # a bare `precaudit`: what to type, as a usage error
        typer.echo(ctx.get_help(), err=True)
        raise typer.Exit(EXIT_ERROR)


# Each command: its parameters, then its module's function of them (a new command is a module with the function,
# and a function here).

@app.command("check", short_help="Audit models against the target dtype (the default command).",
             help=f"Audit models against the target dtype (the default command: `{PROG} MODEL` is "
                  f"`{PROG} check MODEL`).")
def check(
    models: Annotated[list[str] | None, typer.Argument(
        metavar="MODEL", show_default=False,
        help="ONNX files, or PyTorch models: model.py:factory, package.module:factory, .pt2, TorchScript .pt.")
    ] = None,
    dtype: Dtype = None, keep_fp32: KeepFp32 = [], converter: Converter = None, runtime: RuntimeOpt = None,
    rules: Rules = [],
    autocast: Annotated[str | None, typer.Option(
        "--autocast", metavar="cuda|cpu", autocompletion=_among(lambda: AUTOCAST),
        help="PyTorch: the float32 module under torch.autocast(device, --dtype), not model.to(--dtype).")] = None,
    select: Select = [], ignore: Ignore = [], extend_select: ExtendSelect = [], extend_ignore: ExtendIgnore = [],
    preview: Annotated[bool | None, typer.Option("--preview/--no-preview", help="Also run preview rules.")] = None,
    report_format: ReportFormat = None,
    no_group: Annotated[bool, typer.Option("--no-group", help="Text: one block per finding.")] = False,
    output: ReportFile = None, fail_on: FailOn = None,
    exit_zero: Annotated[bool, typer.Option("--exit-zero", help="Exit 0 even with findings.")] = False,
    statistics: Annotated[bool, typer.Option("--statistics", help="A count per rule.")] = False,
    baseline: Baseline = None,
    write_baseline: Annotated[str | None, typer.Option(
        "--write-baseline", metavar="FILE", help="Accept today's findings: write them to FILE and exit 0.")] = None,
    show_settings: Annotated[bool, typer.Option(
        "--show-settings", help="Print the resolved configuration and exit.")] = False,
    isolated: Isolated = False,
    trace: Trace = False,
    check_weights: CheckWeights = None,
    inputs: Inputs = [], samples: Samples = 1, dim: Dim = [], range_: Range = [], seed: Seed = 0,
    timeout: Timeout = 1800.0, trace_engine: Engine = "auto", input_shape: InputShape = [],
    input_dtype: InputDtype = "fp32", trust_pickle: TrustPickle = False, no_factories: NoFactories = False,
    no_color: NoColor = False,
    jobs: Annotated[int | None, typer.Option(
        "--jobs", "-j", min=1, metavar="N", help="Models audited at a time (default: the cores).")] = None,
    debug: Debug = False,
) -> int:
    given = Given(locals())
    from .check import check as command

    return command(given)


@app.command("rules", short_help="List every rule.",
             help="List every rule: id, name, severity, whether it runs by default, summary.")
def rules(rules: Rules = [], output_format: ListFormat = "text",
          write_pages: Annotated[Path | None, typer.Option(
              "--write-pages", metavar="DIR",
              help="Write a Markdown page per rule and the index into DIR (docs/rules).")] = None) -> int:
    given = Given(locals())
    from .rule_docs import list_rules as command

    return command(given)


@app.command("explain", short_help="Explain a rule: what it checks, a worked example, the fix.",
             help="Explain a rule: what it checks, a worked example in numbers, the fix.")
def explain(rule: Annotated[str, typer.Argument(metavar="RULE", help="A rule id (PA101) or name.")],
            rules: Rules = []) -> int:
    given = Given(locals())
    from .rule_docs import explain as command

    return command(given)


@app.command("match", short_help="Show, node by node, why a rule fires or does not.",
             help="Show, node by node, why a rule fires or does not: the pattern step that failed, or the "
                  "condition's values.")
def match(rule: Annotated[str, typer.Argument(metavar="RULE", help="A rule id (PA203) or name.")],
          model: Annotated[str, typer.Argument(metavar="MODEL", help="The model to match the rule against.")],
          node: Annotated[str, typer.Option("--node", metavar="GLOB", help="Only nodes matching this glob.")] = "*",
          dtype: Dtype = None, keep_fp32: KeepFp32 = [], converter: Converter = None, runtime: RuntimeOpt = None,
          rules: Rules = [], no_factories: NoFactories = False) -> int:
    given = Given(locals())
    from .rule_docs import match as command

    return command(given)


@app.command("keep-list", short_help="The nodes to keep in float32, as your converter's arguments.",
             help="The nodes to keep in float32, as your converter's arguments; verified by emulation with --trace.")
def keep_list(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="An ONNX file, or a PyTorch model.")],
    target_for: Annotated[str | None, typer.Option(
        "--for", metavar="CONVERTER", autocompletion=_among(_for_targets),
        help="onnxconverter-common, onnxruntime, olive, modelopt, openvino (ONNX models); pytorch, torch-tensorrt (PyTorch "
             "models); modelopt-quant (--dtype mxfp8|mxfp4|nvfp4: the nodes left unquantized); a runtime, judged as "
             "it computes: tensorrt, dml, webgpu (casts in the ONNX graph), qnn (the nodes to run on the CPU EP), "
             "coreml (a coremltools op_selector, PyTorch models).")] = None,
    dtype: Dtype = None, keep_fp32: KeepFp32 = [], runtime: RuntimeOpt = None, rules: Rules = [],
    select: Select = [], ignore: Ignore = [], extend_select: ExtendSelect = [], extend_ignore: ExtendIgnore = [],
    trace: Annotated[bool, typer.Option("--trace", help="Verify the list by emulating the model (and grow it).")
                     ] = False,
    inputs: Inputs = [], samples: Samples = 1, dim: Dim = [], range_: Range = [], seed: Seed = 0,
    timeout: Timeout = 1800.0, trace_engine: Engine = "auto",
    tolerance: Annotated[float, typer.Option(
        "--tolerance", metavar="REL",
        help="Traced: the largest output error allowed, relative to the output's largest |value| (default 0.01).")
    ] = 0.01,
    max_runs: Annotated[int, typer.Option("--max-runs", min=1, help="Traced: emulation runs at most.")] = 30,
    policy: Annotated[str | None, typer.Option(
        "--policy", metavar="minimal|safe", autocompletion=_among(lambda: ("minimal", "safe")),
        help="Traced: print the smallest list that verifies (minimal: the default on your --inputs) or every static "
             "finding's nodes and what the run adds (safe: the default on synthesized inputs).")] = None,
    output_format: ListFormat = "text",
    output: Annotated[str | None, typer.Option(
        "--output", "-o", metavar="FILE",
        help="Write the list to this file (its missing folders made; /dev/null: nowhere).")] = None,
    input_shape: InputShape = [], input_dtype: InputDtype = "fp32", trust_pickle: TrustPickle = False,
    no_factories: NoFactories = False, debug: Debug = False,
) -> int:
    given = Given(locals())
    from .keep_list import keep_list as command

    return command(given)


@app.command("fix", short_help="Repair what the audit found; write a new model.",
             help="Repair what the audit found, minimally and locally; write a new model, checked against the "
                  "original.")
def fix(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="The ONNX file to repair (never written over).")],
    output: Annotated[str | None, typer.Option(
        "--output", "-o", metavar="FILE", help="Where to write the fixed model (its missing folders made).")] = None,
    dtype: Dtype = None, keep_fp32: KeepFp32 = [], converter: Converter = None, runtime: RuntimeOpt = None,
    rules: Rules = [],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the plan only; write nothing.")] = False,
    min_eps: Annotated[float | None, typer.Option(
        "--min-eps", metavar="V", help="Raise eps (and new guards) to V instead of the smallest normal number.")
    ] = None,
    data_floor: Annotated[str, typer.Option(
        "--data-floor", metavar="keep|subnormal|normal|V",
        help="A clamp on data whose floor is 0.0 in --dtype: keep it (default), or raise it to the smallest "
             "subnormal or normal number, or to V, gated by --tolerance.")] = "keep",
    tolerance: Annotated[float, typer.Option(
        "--tolerance", metavar="REL",
        help="The largest change a repair may make to a float32 output, relative to its largest |value|, on the "
             "checked inputs (default 1e-3).")] = 1e-3,
    select: Select = [], ignore: Ignore = [], extend_select: ExtendSelect = [], extend_ignore: ExtendIgnore = [],
    trace: Annotated[bool, typer.Option(
        "--trace", help="Also run the traced audit on the inputs (its findings, which fix leaves, count toward the "
                        "exit code) and emulate both models in --dtype.")] = False,
    check_weights: CheckWeights = None,
    inputs: Inputs = [], samples: Samples = 1, dim: Dim = [], range_: Range = [], seed: Seed = 0,
    timeout: Timeout = 1800.0, trace_engine: Engine = "auto", output_format: ListFormat = "text",
    no_factories: Annotated[bool, typer.Option(
        "--no-factories", help="Accepted for scripts that pass it to every command: fix reads only ONNX files and "
                               "imports no code.")] = False,
    debug: Debug = False,
) -> int:
    given = Given(locals())
    from .fix import fix as command

    return command(given)


@app.command("train", short_help="Audit a PyTorch training step (backward and optimizer) in an fp16/bf16 regime.",
             help="Audit a PyTorch training step in an fp16/bf16 regime: the backward pass, the loss scale and the "
                  "optimizer step (static, or one step run twice with --trace).")
def train(
    model: Annotated[str, typer.Argument(
        metavar="FACTORY",
        help="model.py:make or package.module:make, returning (model, inputs[, loss_fn][, optimizer]).")],
    regime: Annotated[str, typer.Option(
        "--regime", metavar="REGIME",
        autocompletion=_among(lambda: ("amp-fp16", "amp-bf16", "bf16", "fp16")),
        help="amp-fp16 (default: autocast + GradScaler, float32 master weights), amp-bf16, bf16 "
             "(model.to(bfloat16)), fp16 (model.half()).")] = "amp-fp16",
    trace: Annotated[bool, typer.Option(
        "--trace", help="Run one step (or --steps) in float32 and in the regime, op by op, and compare.")] = False,
    steps: Annotated[int, typer.Option(
        "--steps", metavar="N", help="Traced: optimizer steps to run, 1 to 1000 (default 1).")] = 1,
    loss_scale: Annotated[float | None, typer.Option(
        "--loss-scale", metavar="S",
        help="GradScaler's start (amp-fp16) or a static scale (fp16); default 65536 for amp-fp16.")] = None,
    lr: Annotated[float | None, typer.Option(
        "--lr", metavar="LR", help="Every parameter group's learning rate, instead of the optimizer's.")] = None,
    seed: Seed = 0,
    timeout: Annotated[float, typer.Option(
        "--timeout", metavar="SECONDS",
        help="Stop after this long: the factory's import and call, the capture and the steps, run in a process of "
             "their own (default 1800; 0: no limit).")] = 1800.0,
    rules: Rules = [], select: Select = [], ignore: Ignore = [],
    report_format: ReportFormat = None, output: ReportFile = None, fail_on: FailOn = None, baseline: Baseline = None,
    isolated: Isolated = False, no_color: NoColor = False, debug: Debug = False,
) -> int:
    given = Given(locals())
    from .train import train as command

    return command(given)


def run(args: list[str]) -> int:
    """Parse the command line and run its command: the exit code. A usage error is a UsageError (said in one line
    by main); --help, --show-completion and a completion request print, and are exit 0."""
    import typer.main

    command = typer.main.get_command(app)
    for param in command.params:  # typer's completion options end the process; here they return, as --help does
        if param.name in ("install_completion", "show_completion") and param.callback is not None:
            param.callback = _returning(param.callback)
    try:
        code = command.main(args, prog_name=PROG, standalone_mode=False)
    except typer.Exit as exc:  # raised before the parse: a completion request, answered already
        return exc.exit_code
    except typer.Abort:
        raise KeyboardInterrupt from None
    except typer.TyperException as exc:  # a usage error (typer's own click): said in one line by main
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        raise UsageError(message) from None
    return 0 if code is None else int(code)


def parse(command: str, args: list[str]) -> tuple[Given, list[str]]:
    """One command's options parsed as run() parses them, their checks included, but not run: the Given its module
    would get, and the options typed, each by its first name ("models" for check's MODEL arguments). `precaudit
    test` checks a rule example's args with it."""
    import typer.main

    command_of = typer.main.get_command(app)
    assert isinstance(command_of, TyperGroup)
    chosen = command_of.commands[command]
    try:
        with chosen.make_context(command, list(args)) as ctx:
            sources = {param.opts[0]: ctx.get_parameter_source(param.name) for param in chosen.params if param.name}
            return Given(ctx.params), [name for name, source in sources.items()
                                       if source is not None and source.name == "COMMANDLINE"]
    except typer.TyperException as exc:  # a usage error, as run() says it
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        raise UsageError(message) from None


def _returning(callback: Callable[..., Any]) -> Callable[..., Any]:
    """The callback, with its sys.exit(0) turned into typer.Exit: the exit code comes back to main()."""
    def call(*args: Any) -> Any:
        try:
            return callback(*args)
        except SystemExit as exc:
            raise typer.Exit(exc.code if isinstance(exc.code, int) else 0) from None
    return call


@app.command("runtimes", short_help="List the runtime models (--runtime) and the facts each rests on.",
             help="List every runtime --runtime models: its versions, what it runs, and each fact with where it was "
                  "read or measured.")
def runtimes(output_format: ListFormat = "text", output: ReportFile = None,
             write_page: Annotated[str | None, typer.Option(
                 "--write-page", metavar="FILE", help="Write the Markdown page (docs/runtimes.md).")] = None) -> int:
    given = Given(locals())
    from .runtimes import runtimes as command

    return command(given)


@app.command("eps", short_help="Every eps and floor, with its value where it is used.",
             help="Every epsilon and floor of the model (a norm's eps, a guard's Max/Clip/Add constant) with its value "
                  "as written, as the converter leaves it, as stored and in the dtype the runtime computes it in; "
                  "--diff OLD NEW: what changed between two exports.")
def eps(models: Annotated[list[str], typer.Argument(metavar="MODEL", help="The model (two with --diff).")],
        diff: Annotated[bool, typer.Option("--diff", help="Compare two models: OLD NEW.")] = False,
        dtype: Dtype = None, keep_fp32: KeepFp32 = [], converter: Converter = None, runtime: RuntimeOpt = None,
        output_format: ListFormat = "text", output: ReportFile = None, no_factories: NoFactories = False) -> int:
    given = Given(locals())
    from .eps import eps as command

    return command(given)


@app.command("scales", short_help="Check the quantization scales of a checkpoint (.safetensors).",
             help="Check a checkpoint's quantization scales (a .safetensors file, a folder of shards or an index): "
                  "NaN, inf, zero and subnormal entries, global scales on the wrong side of their convention, "
                  "shapes that do not fit their weights, missing scales; reads the headers and the scales only.")
def scales(checkpoint: Annotated[str | None, typer.Argument(metavar="CHECKPOINT", show_default=False)] = None,
           output_format: Annotated[str, typer.Option(
               "--format", "-f", callback=_checked("format", ("text", "json", "sarif")), metavar="text|json|sarif",
               help="text, json or sarif.")] = "text",
           output: ReportFile = None,
           manifest: Annotated[str | None, typer.Option(
               "--manifest", metavar="FILE", help="Scan every checkpoint listed (one a line); JSON lines out.")] = None,
           jobs: Annotated[int | None, typer.Option("--jobs", "-j", min=1, metavar="N",
                                                    help="--manifest: checkpoints at a time.")] = None,
           resume: Annotated[bool, typer.Option("--resume", help="--manifest: skip those -o already holds.")] = False,
           ) -> int:
    given = Given(locals())
    from .scales import scales as command

    return command(given)


@app.command("test", short_help="Run each rule's own examples: where it must fire, and where it must stay quiet.",
             help="Run the examples of every rule in RULES_DIR (its YAML tests:, and with --fixtures DIR --allow-code "
                  "the CASES of DIR/ID_name.py), audited with the built-in rules and RULES_DIR's: each rule must fire "
                  "exactly where they say. One line per rule; exit 0 when every rule holds, 1 when one fails.")
def test(rules_dir: Annotated[str, typer.Argument(
             metavar="RULES_DIR", help="A folder of rule files and their examples (rules: the shipped ones).")],
         fixtures: Annotated[str | None, typer.Option(
             "--fixtures", metavar="DIR",
             help="Also run each rule's Python fixture module, DIR/ID_name.py (its CASES); needs --allow-code.")
         ] = None,
         allow_code: Annotated[bool, typer.Option(
             "--allow-code", help="Let --fixtures import its Python modules, which runs their code.")] = False,
         select: Annotated[Many, typer.Option(
             "--select", metavar="RULE,...", help="Only these rules of RULES_DIR: ids, names or id prefixes (PA1).")
         ] = [],
         output_format: ListFormat = "text") -> int:
    given = Given(locals())
    from .test_cmd import rule_test as command

    return command(given, run, parse)
