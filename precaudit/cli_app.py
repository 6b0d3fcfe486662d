"""The command line's grammar, on typer: one command per function, each option typed and documented once.

Built only when a command runs (app()), so `precaudit --version` imports none of it. Each command hands its options
to the function of the same name in cli.py, which does the work. typer runs in click's non-standalone mode: a usage
error comes back as an exception, which cli.main says in one line (exit 2), never as a panel or a traceback.
"""

from pathlib import Path
from typing import Annotated, Optional

import typer

from . import cli
from .options import FAIL_ON, FORMATS, check_choice

__all__ = ["app", "COMMANDS", "LIST_FORMATS", "top_help"]

PROG = "precaudit"
DESCRIPTION = "Precision audit for ML models: where will this graph lose its numbers in fp16, bf16 or fp8?"
LIST_FORMATS = ("text", "json")
# each command and the line `precaudit --help` gives it; check is the default (`precaudit MODEL`)
COMMANDS = {"check": "Audit models against the target dtype (the default command).",
            "rules": "List every rule.",
            "explain": "Explain a rule: what it checks, a worked example, the fix.",
            "match": "Show, node by node, why a rule fires or does not.",
            "keep-list": "The nodes to keep in float32, as your converter's arguments.",
            "fix": "Repair what the audit found; write a new model.",
            "train": "Audit a PyTorch training step (backward and optimizer) in an fp16/bf16 regime."}

_CONVERTER_HELP = ("The fp16 converter to model: plain (default: every float32 tensor runs in --dtype), "
                   "onnxconverter-common, onnxruntime, olive or modelopt: its default block list, its clamp of the "
                   "constants it converts and its Cast handling.")


def app() -> "typer.Typer":
    """The typer application: the six commands."""
    application = typer.Typer(name=PROG, help=DESCRIPTION, add_completion=True, no_args_is_help=False,
                              pretty_exceptions_enable=False, rich_markup_mode=None,
                              context_settings={"help_option_names": ["-h", "--help"]})
    @application.command("check", help="Audit models against the target dtype (the default command: "
                                       "`precaudit MODEL` is `precaudit check MODEL`).")
    def check(
        models: Annotated[Optional[list[str]], typer.Argument(metavar="MODEL", show_default=False,
                                                              help="ONNX files, or PyTorch models: model.py:factory, "
                                                                   "package.module:factory, .pt2, TorchScript .pt.")
                          ] = None,
        dtype: Dtype = None, keep_fp32: KeepFp32 = [], converter: Converter = None, runtime: RuntimeOpt = None,
        rules: Rules = [],
        autocast: Annotated[Optional[str], typer.Option("--autocast", metavar="cuda|cpu",
                                                        help="PyTorch: the float32 module under "
                                                             "torch.autocast(device, --dtype), not "
                                                             "model.to(--dtype).")] = None,
        select: Select = [], ignore: Ignore = [],
        preview: Annotated[Optional[bool], typer.Option("--preview/--no-preview",
                                                        help="Also run preview rules.")] = None,
        output_format: ReportFormat = None,
        no_group: Annotated[bool, typer.Option("--no-group", help="Text: one block per finding.")] = False,
        output: ReportFile = None,
        fail_on: FailOn = None,
        exit_zero: Annotated[bool, typer.Option("--exit-zero", help="Exit 0 even with findings.")] = False,
        statistics: Annotated[bool, typer.Option("--statistics", help="A count per rule.")] = False,
        baseline: Baseline = None,
        write_baseline: Annotated[Optional[str], typer.Option("--write-baseline", metavar="FILE",
                                                              help="Accept today's findings: write them to FILE "
                                                                   "and exit 0.")] = None,
        show_settings: Annotated[bool, typer.Option("--show-settings",
                                                    help="Print the resolved configuration and exit.")] = False,
        trace: Annotated[bool, typer.Option("--trace", help="Run the model and emulate the target dtype.")] = False,
        check_weights: Annotated[Optional[bool], typer.Option("--check-weights/--no-check-weights",
                                                              help="Read every float32 weight and check it "
                                                                   "(always on with --trace).")] = None,
        inputs: Inputs = [], samples: Samples = 1, dim: Dim = [], range_: Range = [], seed: Seed = 0,
        timeout: Timeout = 1800.0,
        trace_engine: Engine = "auto", input_shape: InputShape = [], input_dtype: InputDtype = "fp32",
        trust_pickle: TrustPickle = False, no_factories: NoFactories = False,
        no_color: NoColor = False,
        jobs: Annotated[Optional[int], typer.Option("--jobs", "-j", min=1, metavar="N",
                                                    help="Models audited at a time (default: the cores).")] = None,
        debug: Debug = False,
    ) -> None:
        raise typer.Exit(cli.check(**_given(locals())))

    @application.command("rules", help="List every rule: id, name, severity, whether it runs by default, summary.")
    def list_rules(rules: Rules = [], output_format: ListFormat = "text",
                   write_pages: Annotated[Optional[Path], typer.Option(
                       "--write-pages", metavar="DIR", help="Write a Markdown page per rule and the index into DIR "
                                                            "(docs/rules).")] = None) -> None:
        raise typer.Exit(cli.list_rules(**_given(locals())))

    @application.command("explain", help="Explain a rule: what it checks, a worked example in numbers, the fix.")
    def explain(rule: Annotated[str, typer.Argument(metavar="RULE", help="A rule id (PA101) or name.")],
                rules: Rules = []) -> None:
        raise typer.Exit(cli.explain(**_given(locals())))

    @application.command("match", help="Show, node by node, why a rule fires or does not: the pattern step that "
                                       "failed, or the condition's values.")
    def match(rule: Annotated[str, typer.Argument(metavar="RULE", help="A rule id (PA203) or name.")],
              model: Annotated[str, typer.Argument(metavar="MODEL", help="The model to match the rule against.")],
              node: Annotated[str, typer.Option("--node", metavar="GLOB", help="Only nodes matching this glob.")] = "*",
              dtype: Dtype = None, keep_fp32: KeepFp32 = [], converter: Converter = None, runtime: RuntimeOpt = None,
        rules: Rules = [],
              no_factories: NoFactories = False) -> None:
        raise typer.Exit(cli.match(**_given(locals())))

    @application.command("keep-list", help="The nodes to keep in float32, as your converter's arguments; verified "
                                           "by emulation with --trace.")
    def keep_list(
        model: Annotated[str, typer.Argument(metavar="MODEL", help="An ONNX file, or a PyTorch model.")],
        target_for: Annotated[Optional[str], typer.Option("--for", metavar="CONVERTER",
                                                          help="onnxconverter-common, onnxruntime, olive, modelopt "
                                                               "(ONNX models); pytorch, torch-tensorrt (PyTorch "
                                                               "models).")] = None,
        dtype: Dtype = None, keep_fp32: KeepFp32 = [], runtime: RuntimeOpt = None, rules: Rules = [],
        select: Select = [], ignore: Ignore = [],
        trace: Annotated[bool, typer.Option("--trace", help="Verify the list by emulating the model (and grow "
                                                            "it).")] = False,
        inputs: Inputs = [], samples: Samples = 1, dim: Dim = [], range_: Range = [], seed: Seed = 0,
        timeout: Timeout = 1800.0,
        trace_engine: Engine = "auto",
        tolerance: Annotated[float, typer.Option("--tolerance", metavar="REL",
                                                 help="Traced: the largest output error allowed, relative to the "
                                                      "output's largest |value| (default 0.01).")] = 0.01,
        max_runs: Annotated[int, typer.Option("--max-runs", min=1, help="Traced: emulation runs at most.")] = 30,
        policy: Annotated[Optional[str], typer.Option("--policy", metavar="minimal|safe",
                                                      help="Traced: print the smallest list that verifies "
                                                           "(minimal: the default on your --inputs) or every static "
                                                           "finding's nodes and what the run adds (safe: the default "
                                                           "on synthesized inputs).")] = None,
        output_format: ListFormat = "text",
        output: Annotated[Optional[Path], typer.Option("--output", "-o", metavar="FILE",
                                                       help="Write the list to this file.")] = None,
        input_shape: InputShape = [], input_dtype: InputDtype = "fp32", trust_pickle: TrustPickle = False,
        no_factories: NoFactories = False, debug: Debug = False,
    ) -> None:
        raise typer.Exit(cli.keep_list(**_given(locals())))

    @application.command("fix", help="Repair what the audit found, minimally and locally; write a new model, "
                                     "checked against the original.")
    def fix(
        model: Annotated[str, typer.Argument(metavar="MODEL", help="The ONNX file to repair (never written over).")],
        output: Annotated[Optional[Path], typer.Option("--output", "-o", metavar="FILE",
                                                       help="Where to write the fixed model.")] = None,
        dtype: Dtype = None, keep_fp32: KeepFp32 = [], converter: Converter = None, runtime: RuntimeOpt = None,
        rules: Rules = [],
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the plan only; write nothing.")] = False,
        min_eps: Annotated[Optional[float], typer.Option("--min-eps", metavar="V",
                                                         help="Raise eps (and new guards) to V instead of the "
                                                              "smallest normal number.")] = None,
        data_floor: Annotated[str, typer.Option("--data-floor", metavar="keep|subnormal|normal|V",
                                                help="A clamp on data whose floor is 0.0 in --dtype: keep it "
                                                     "(default), or raise it to the smallest subnormal or normal "
                                                     "number, or to V, gated by --tolerance.")] = "keep",
        tolerance: Annotated[float, typer.Option("--tolerance", metavar="REL",
                                                 help="The largest change a repair may make to a float32 output, "
                                                      "relative to its largest |value|, on the checked inputs "
                                                      "(default 1e-3).")] = 1e-3,
        select: Select = [], ignore: Ignore = [],
        trace: Annotated[bool, typer.Option("--trace", help="Also emulate both models in --dtype.")] = False,
        inputs: Inputs = [], samples: Samples = 1, dim: Dim = [], range_: Range = [], seed: Seed = 0,
        timeout: Timeout = 1800.0,
        trace_engine: Engine = "auto", output_format: ListFormat = "text",
        no_factories: Annotated[bool, typer.Option("--no-factories", help="Accepted for scripts that pass it to "
                                                                          "every command: fix reads only ONNX "
                                                                          "files and imports no code.")] = False,
        debug: Debug = False,
    ) -> None:
        raise typer.Exit(cli.fix(**_given(locals())))

    @application.command("train", help="Audit a PyTorch training step in an fp16/bf16 regime: the backward pass, "
                                       "the loss scale and the optimizer step (static, or one step run twice with "
                                       "--trace).")
    def train(
        model: Annotated[str, typer.Argument(metavar="FACTORY",
                                             help="model.py:make or package.module:make, returning (model, inputs"
                                                  "[, loss_fn][, optimizer]).")],
        regime: Annotated[str, typer.Option("--regime", metavar="REGIME",
                                            help="amp-fp16 (default: autocast + GradScaler, float32 master "
                                                 "weights), amp-bf16, bf16 (model.to(bfloat16)), fp16 "
                                                 "(model.half()).")] = "amp-fp16",
        trace: Annotated[bool, typer.Option("--trace", help="Run one step (or --steps) in float32 and in the "
                                                            "regime, op by op, and compare.")] = False,
        steps: Annotated[int, typer.Option("--steps", metavar="N", help="Traced: optimizer steps to run, 1 to "
                                                                        "1000 (default 1).")] = 1,
        loss_scale: Annotated[Optional[float], typer.Option("--loss-scale", metavar="S",
                                                            help="GradScaler's start (amp-fp16) or a static scale "
                                                                 "(fp16); default 65536 for amp-fp16.")] = None,
        lr: Annotated[Optional[float], typer.Option("--lr", metavar="LR",
                                                    help="Every parameter group's learning rate, instead of the "
                                                         "optimizer's.")] = None,
        seed: Seed = 0,
        timeout: Annotated[float, typer.Option("--timeout", metavar="SECONDS",
                                               help="Stop after this long: the factory's import and call, the "
                                                    "capture and the steps, run in a process of their own "
                                                    "(default 1800; 0: no limit).")] = 1800.0,
        rules: Rules = [], select: Select = [], ignore: Ignore = [],
        output_format: ReportFormat = None,
        output: ReportFile = None,
        fail_on: FailOn = None,
        baseline: Baseline = None,
        no_color: NoColor = False,
        debug: Debug = False,
    ) -> None:
        raise typer.Exit(cli.train(**_given(locals())))

    return application


def _checked(name: str, choices: tuple[str, ...] = ()):
    """A callback that checks a setting's flag (name) as its pyproject key and the Python API's argument are checked,
    or a command's own choice among choices; its problem said as typer says a bad value (None: not given)."""
    def check(value: Optional[str]) -> Optional[str]:
        from .errors import InputError

        try:
            if value is None or choices:
                return None if value is None else check_choice(value, choices, "")
            from .config import check_setting  # with numpy: only when the flag is given
            return check_setting(name, value, "")
        except InputError as exc:
            raise typer.BadParameter(exc.problem) from None
    return check


def _given(arguments: dict) -> dict:
    """A command's options as cli.py's functions take them: lists for repeated options, never None for a list."""
    return {name: (list(value) if isinstance(value, (list, tuple)) else value) if name != "models" else
            list(value or []) for name, value in arguments.items()}


Many = list[str]  # a repeatable option, gathered into a list (empty when not given)
formats, list_formats, fail_on_choice = _checked("format"), _checked("format", LIST_FORMATS), _checked("fail_on")

# the options several commands share, spelled once
Dtype = Annotated[Optional[str], typer.Option("--dtype", "-d", metavar="DTYPE",
                                              help="Target dtype: fp16 (default), bf16, fp8-e4m3, fp8-e5m2, fp32 "
                                                   "or fp64.")]
KeepFp32 = Annotated[Many, typer.Option("--keep-fp32", metavar="OP_OR_NODE,...",
                                        help="Op types, node names or globs kept in float32 (your converter's "
                                             "block list).")]
Converter = Annotated[Optional[str], typer.Option("--converter", metavar="NAME", help=_CONVERTER_HELP)]
RuntimeOpt = Annotated[Optional[str], typer.Option("--runtime", metavar="NAME[@VERSION]",
                                                   help="The runtime that runs the model: judge each node in the dtype "
                                                        "its kernel there really computes in (precaudit runtimes lists "
                                                        "them: ort-cpu, ort-cuda@1.26, tensorrt@11, ...).")]
Rules = Annotated[Many, typer.Option("--rules", metavar="PATH",
                                     help="Extra YAML rule file or folder; may override built-in rules.")]
Select = Annotated[Many, typer.Option("--select", metavar="RULE,...",
                                      help="Only these rules: ids, names or id prefixes (PA1), or ALL.")]
Ignore = Annotated[Many, typer.Option("--ignore", metavar="RULE,...", help="Not these rules (wins over --select).")]
Inputs = Annotated[Many, typer.Option("--inputs", metavar="FILE.npz",
                                      help="One array per graph input (else synthesized); repeat for several "
                                           "batches.")]
Samples = Annotated[int, typer.Option("--samples", min=1, help="How many synthesized batches.")]
Dim = Annotated[Many, typer.Option("--dim", metavar="NAME=SIZE", help="Size of a symbolic dim.")]
Range = Annotated[Many, typer.Option("--range", metavar="NAME=LO:HI",
                                     help="Synthesize this input uniform in [LO, HI] (int16-scale audio: "
                                          "-32768:32767).")]
Seed = Annotated[int, typer.Option("--seed", min=0, help="Seed for synthesized inputs.")]
Timeout = Annotated[float, typer.Option("--timeout", min=0, metavar="SECONDS",
                                        help="Stop a model's traced run, or a model.py:factory's, after this long "
                                             "(default 1800; 0: no limit).")]
Engine = Annotated[str, typer.Option("--trace-engine", metavar="auto|onnxruntime|numpy",
                                     help="What runs the ops (auto: onnxruntime where installed).")]
InputShape = Annotated[Many, typer.Option("--input-shape", metavar="D0,D1,...",
                                          help="PyTorch: shape of each forward() argument when the factory gives "
                                               "none.")]
InputDtype = Annotated[str, typer.Option("--input-dtype", metavar="DTYPE",
                                         help="PyTorch: dtype of synthesized inputs (fp32, fp16, bf16, int64).")]
TrustPickle = Annotated[bool, typer.Option("--trust-pickle",
                                           help="PyTorch: allow unpickling a whole module (runs code from the "
                                                "file).")]
NoFactories = Annotated[bool, typer.Option("--no-factories",
                                           help="Import no Python code: every MODEL is a file, and model.py:factory "
                                                "is then no such file; --trust-pickle is refused. For models from "
                                                "a pull request (the GitHub Action passes it).")]
Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")]
# the report options check and train share
ReportFormat = Annotated[Optional[str], typer.Option("--format", "-f", callback=formats, metavar="FORMAT",
                                                     help=f"Report format: {', '.join(FORMATS)} (default "
                                                          "text).")]
ReportFile = Annotated[Optional[Path], typer.Option("--output", "-o", metavar="FILE",
                                                    help="Write the report to this file.")]
FailOn = Annotated[Optional[str], typer.Option("--fail-on", callback=fail_on_choice, metavar="|".join(FAIL_ON),
                                               help="Exit 1 at this severity or worse (default error).")]
Baseline = Annotated[Optional[str], typer.Option("--baseline", metavar="FILE",
                                                 help="Report only findings not in this baseline.")]
NoColor = Annotated[bool, typer.Option("--no-color", help="Plain text even on a terminal.")]
ListFormat = Annotated[str, typer.Option("--format", "-f", callback=list_formats, metavar="text|json",
                                         help="text or json.")]


def top_help() -> str:
    """`precaudit --help`: the commands, then the default command's own options."""
    import typer.main

    group = typer.main.get_command(app())
    commands = "\n".join(f"  {name:<10} {summary}" for name, summary in COMMANDS.items())
    check = group.commands["check"]  # type: ignore[attr-defined]
    with typer.Context(check, info_name=PROG) as ctx:
        check_help = check.get_help(ctx)
    return (f"usage: {PROG} [COMMAND] ...   (no command: check)\n\n{DESCRIPTION}\n\ncommands:\n{commands}\n\n"
            f"  --version  Print the version and exit.\n"
            f"  --install-completion, --show-completion  Shell completion for this shell.\n\n"
            f"{PROG} COMMAND --help shows a command's options. The default command, check:\n\n{check_help}\n")
