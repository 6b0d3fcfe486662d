"""The command line's grammar: one argparse parser per command, and what a usage error is.

argparse (the standard library) rather than a framework: it costs no import time and no dependency, and every
option here is a string, a flag, a number or a repeated string, which argparse parses as is. A usage error is
raised, never printed with sys.exit, so the entry point can make it the one-line message every error is.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["COMMANDS", "UsageError", "parser_for", "top_help"]

PROG = "precaudit"
DESCRIPTION = "Precision audit for ML models: where will this graph lose its numbers in fp16, bf16 or fp8?"
OUTPUT_FORMATS = ("text", "json", "sarif", "github", "junit", "concise", "html")
FAIL_ON = ("error", "warning", "info", "never")
LIST_FORMATS = ("text", "json")
_CONVERTER_METAVAR = "plain|onnxconverter-common|onnxruntime|olive|modelopt"
_CONVERTER_HELP = ("The fp16 converter to model: its default block list, its clamp of the constants it converts and "
                   "its Cast handling (default plain: every float32 tensor runs in --dtype).")
_ENGINE_METAVAR = "auto|onnxruntime|numpy"


class UsageError(Exception):
    """The command line itself is wrong: one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print the usage and exit; the entry point says it in one line
        raise UsageError(message)


def _one_of(*choices: str):
    def parse(value: str) -> str:
        if value not in choices:
            raise argparse.ArgumentTypeError(f"{value!r} is not one of {', '.join(map(repr, choices))}")
        return value
    parse.__name__ = "choice"
    return parse


def _at_least(low: int):
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
        if number < low:
            raise argparse.ArgumentTypeError(f"{value} is not in the range x>={low}")
        return number
    parse.__name__ = "integer"
    return parse


def _number(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None


def _new(command: str, help_text: str) -> _Parser:
    parser = _Parser(prog=f"{PROG} {command}" if command != "check" else PROG, description=help_text,
                     allow_abbrev=False)
    return parser


def _many(parser: _Parser, *flags: str, metavar: str, help: str | None = None) -> None:
    """A repeatable option gathered into a list (empty when not given)."""
    parser.add_argument(*flags, action="append", default=[], metavar=metavar, help=help)


def _trace_inputs(parser: _Parser, prefix: str) -> None:
    """--inputs, --samples, --dim, --seed, --trace-engine: what a traced run feeds the model."""
    _many(parser, "--inputs", metavar="FILE.npz", help=f"{prefix}one array per graph input (else synthesized); "
                                                         f"repeat the option for several batches.")
    parser.add_argument("--samples", type=_at_least(1), default=1, help=f"{prefix}how many synthesized batches.")
    _many(parser, "--dim", metavar="NAME=SIZE", help=f"{prefix}size of a symbolic dim.")
    parser.add_argument("--range", dest="range_", action="append", default=[], metavar="NAME=LO:HI",
                        help=f"{prefix}synthesize this input uniform in [LO, HI] (int16-scale audio: -32768:32767).")
    parser.add_argument("--seed", type=_at_least(0), default=0, help=f"{prefix}seed for synthesized inputs.")
    parser.add_argument("--trace-engine", default="auto", metavar=_ENGINE_METAVAR,
                        help=f"{prefix}what runs the ops (auto: onnxruntime where installed).")


def _list_format(parser: _Parser, help: str = "text or json.") -> None:
    parser.add_argument("--format", "-f", dest="output_format", type=_one_of(*LIST_FORMATS), default="text",
                        metavar="text|json", help=help)


def _debug(parser: _Parser) -> None:
    parser.add_argument("--debug", action="store_true", help="Show tracebacks for errors.")


def _common(parser: _Parser, converter: bool = True) -> None:
    parser.add_argument("--dtype", "-d", metavar="DTYPE",
                        help="Target dtype: fp16 (default), bf16, fp8-e4m3, fp8-e5m2, fp32 or fp64.")
    _many(parser, "--keep-fp32", metavar="OP_OR_NODE,...",
          help="Op types, node names or globs kept in float32 (your converter's block list).")
    if converter:
        parser.add_argument("--converter", metavar=_CONVERTER_METAVAR, help=_CONVERTER_HELP)
    _many(parser, "--rules", metavar="PATH",
          help="Extra YAML rule file or folder; may override built-in severities and params.")


def _check() -> _Parser:
    p = _new("check", "Audit models against the target dtype (the default command: `precaudit MODEL` is "
                      "`precaudit check MODEL`).")
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="ONNX files, or PyTorch models: model.py:factory, package.module:factory, .pt2 "
                        "(torch.export), TorchScript .pt.")
    _common(p)
    p.add_argument("--autocast", metavar="cuda|cpu",
                   help="PyTorch: run the float32 module under torch.autocast(device, --dtype) instead of "
                        "model.to(--dtype).")
    _many(p, "--select", metavar="RULE,...", help="Run only these rules: ids, names or id prefixes (PA1), or ALL.")
    _many(p, "--ignore", metavar="RULE,...", help="Do not run these rules (wins over --select).")
    p.add_argument("--preview", action=argparse.BooleanOptionalAction, default=None,
                   help="Also run preview rules matched by a prefix or the default selection.")
    p.add_argument("--format", "-f", dest="output_format", type=_one_of(*OUTPUT_FORMATS), metavar="FORMAT",
                   help=f"Report format: {', '.join(OUTPUT_FORMATS)} (default text).")
    p.add_argument("--no-group", action="store_true",
                   help="Text report: one block per finding instead of one per set of alike findings.")
    p.add_argument("--output", "-o", type=Path, metavar="FILE", help="Write the report to this file.")
    p.add_argument("--fail-on", type=_one_of(*FAIL_ON), metavar="|".join(FAIL_ON),
                   help="Exit 1 when a finding of this severity or worse is found (default error).")
    p.add_argument("--exit-zero", action="store_true", help="Exit 0 even with findings (errors still exit 2).")
    p.add_argument("--statistics", action="store_true", help="Print a count per rule instead of every finding.")
    p.add_argument("--baseline", metavar="FILE", help="Report only findings not in this baseline.")
    p.add_argument("--write-baseline", metavar="FILE",
                   help="Accept the current findings: write them to FILE and exit 0.")
    p.add_argument("--show-settings", action="store_true", help="Print the resolved configuration and exit.")
    p.add_argument("--trace", action="store_true", help="Run the model and emulate the target dtype op by op.")
    p.add_argument("--check-weights", action=argparse.BooleanOptionalAction, default=None,
                   help="Read every float32 weight (one at a time) and check it against the target dtype (always "
                        "on with --trace).")
    _trace_inputs(p, "Traced mode: ")
    _torch_inputs(p)
    p.add_argument("--no-color", action="store_true", help="Plain text even on a terminal.")
    p.add_argument("--jobs", "-j", type=_at_least(1), metavar="N",
                   help="Models audited at a time, in worker processes (default: the cores).")
    _debug(p)
    return p


def _torch_inputs(parser: _Parser) -> None:
    _many(parser, "--input-shape", metavar="D0,D1,...",
          help="PyTorch: shape of each forward() argument when the factory gives none.")
    parser.add_argument("--input-dtype", default="fp32", metavar="DTYPE",
                        help="PyTorch: dtype of synthesized inputs (fp32, fp16, bf16, int64 for token ids).")
    parser.add_argument("--trust-pickle", action="store_true",
                        help="PyTorch: allow unpickling a whole module (runs code from the file).")


def _rules() -> _Parser:
    p = _new("rules", "List every rule: id, name, severity, whether it runs by default, summary.")
    _many(p, "--rules", metavar="PATH", help="Extra YAML rule file or folder to list too.")
    _list_format(p)
    return p


def _explain() -> _Parser:
    p = _new("explain", "Explain a rule: what it checks, a worked example in numbers, and the fix.")
    p.add_argument("rule", metavar="RULE", help="A rule id (PA101) or name (eps-underflow).")
    _many(p, "--rules", metavar="PATH", help="Extra YAML rule file or folder.")
    return p


def _match() -> _Parser:
    p = _new("match", "Show, node by node, why a rule fires or does not: the pattern step that failed, or the "
                      "condition's values.")
    p.add_argument("rule", metavar="RULE", help="A rule id (PA203) or name (naive-softmax).")
    p.add_argument("model", metavar="MODEL", help="The model to match the rule against.")
    p.add_argument("--node", default="*", metavar="GLOB", help="Only nodes whose name matches this glob.")
    _common(p)
    return p


def _keep_list() -> _Parser:
    p = _new("keep-list", "The nodes to keep in float32, as your converter's arguments; verified by emulation with "
                          "--trace.")
    p.add_argument("model", metavar="MODEL", help="An ONNX file, or a PyTorch model (model.py:factory, ...).")
    p.add_argument("--for", dest="target_for", metavar="CONVERTER",
                   help="onnxconverter-common, onnxruntime, olive, modelopt (ONNX models); pytorch, torch-tensorrt "
                        "(PyTorch models).")
    _common(p, converter=False)
    _many(p, "--select", metavar="RULE,...", help="List only these rules' findings.")
    _many(p, "--ignore", metavar="RULE,...", help="Leave these rules' findings out.")
    p.add_argument("--trace", action="store_true", help="Verify the list by emulating the model (and grow it).")
    _trace_inputs(p, "Traced: ")
    p.add_argument("--tolerance", type=_number, default=0.01, metavar="REL",
                   help="Traced: the largest output error allowed, relative to the output's largest |value| "
                        "(default 0.01).")
    p.add_argument("--max-runs", type=_at_least(1), default=30, help="Traced: emulation runs at most.")
    _list_format(p)
    p.add_argument("--output", "-o", type=Path, metavar="FILE", help="Write the list to this file.")
    _torch_inputs(p)
    _debug(p)
    return p


def _fix() -> _Parser:
    p = _new("fix", "Repair what the audit found, minimally and locally; write a new model, checked against the "
                    "original.")
    p.add_argument("model", metavar="MODEL", help="The ONNX file to repair (never written over).")
    p.add_argument("--output", "-o", type=Path, metavar="FILE", help="Where to write the fixed model.")
    _common(p)
    p.add_argument("--dry-run", action="store_true", help="Show the plan only; write nothing.")
    p.add_argument("--min-eps", type=_number, metavar="V",
                   help="Raise eps (and new guards) to V instead of the smallest normal number.")
    p.add_argument("--data-floor", default="keep", metavar="keep|subnormal|normal|V",
                   help="A clamp on data (Max/Clip before a Log, Div, Sqrt) whose floor is 0.0 in --dtype: keep it in "
                        "float32 (default: keep-list advice, or Casts in a float16 model), or raise it to the "
                        "smallest subnormal or normal number, or to V, gated by --tolerance.")
    p.add_argument("--tolerance", type=_number, default=1e-3, metavar="REL",
                   help="The largest change a repair may make to a float32 output, relative to the output's "
                        "largest |value|, on the checked inputs (default 1e-3); a repair beyond it is not written.")
    _many(p, "--select", metavar="RULE,...", help="Repair only these rules' findings.")
    _many(p, "--ignore", metavar="RULE,...", help="Leave these rules' findings alone.")
    p.add_argument("--trace", action="store_true", help="Also emulate both models in --dtype, side by side.")
    _trace_inputs(p, "The checks: ")
    _list_format(p, "text or json (on stdout).")
    _debug(p)
    return p


# each command: its parser, and the line `precaudit --help` gives it
COMMANDS = {"check": (_check, "Audit models against the target dtype (the default command)."),
            "rules": (_rules, "List every rule."),
            "explain": (_explain, "Explain a rule: what it checks, a worked example, the fix."),
            "match": (_match, "Show, node by node, why a rule fires or does not."),
            "keep-list": (_keep_list, "The nodes to keep in float32, as your converter's arguments."),
            "fix": (_fix, "Repair what the audit found; write a new model.")}


def parser_for(command: str) -> _Parser:
    return COMMANDS[command][0]()


def top_help() -> str:
    """`precaudit --help`: the commands, then the default command's own options."""
    commands = "\n".join(f"  {name:<10} {summary}" for name, (_, summary) in COMMANDS.items())
    return (f"usage: {PROG} [COMMAND] ...   (no command: check)\n\n{DESCRIPTION}\n\ncommands:\n{commands}\n\n"
            f"  --version  Print the version and exit.\n\n"
            f"{PROG} COMMAND --help shows a command's options. The default command, check:\n\n"
            f"{parser_for('check').format_help()}")
