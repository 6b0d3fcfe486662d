"""The options several commands share, each spelled once (typer's Annotated aliases), with their completions and
checks; grammar.py declares the commands with them."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Annotated

import typer

from ..options import FAIL_ON, FORMATS, TRACE_ENGINES, check_choice
from ..version import __version__

LIST_FORMATS = ("text", "json")


def _checked(name: str, choices: tuple[str, ...] = ()) -> Callable[[str | None], str | None]:
    """A callback that checks a setting's flag (name) as its pyproject key and the Python API's argument are checked,
    or a command's own choice among choices; its problem said as typer says a bad value (None: not given)."""
    def check(value: str | None) -> str | None:
        from ..errors import InputError

        try:
            if value is None or choices:
                return None if value is None else check_choice(value, choices, "")
            from ..config import check_setting  # with numpy: only when the flag is given
            return check_setting(name, value, "")
        except InputError as exc:
            raise typer.BadParameter(exc.problem) from None
    return check


def _among(choices: Callable[[], Iterable[str]]) -> Callable[[str], list[str]]:
    """TAB after an option: its values that begin with what is typed (the list made only when asked)."""
    def complete(incomplete: str) -> list[str]:
        return [choice for choice in choices() if choice.startswith(incomplete)]
    return complete


def _dtypes() -> Iterable[str]:
    from ..dtypes import FORMATS as DTYPES

    return DTYPES


def _converters() -> Iterable[str]:
    from ..converters import CONVERTER_NAMES

    return CONVERTER_NAMES


def _for_targets() -> Iterable[str]:
    from ..keeplist import FOR_TARGETS

    return FOR_TARGETS


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"precaudit {__version__}")
        raise typer.Exit()


Many = list[str]  # a repeatable option, gathered into a list (empty when not given)

# the options several commands share, spelled once
Dtype = Annotated[str | None, typer.Option(
    "--dtype", "-d", metavar="DTYPE", autocompletion=_among(_dtypes),
    help="Target dtype: fp16 (default), bf16, fp8-e4m3, fp8-e5m2, fp32, fp64, or a block-scaled format: mxfp8, "
         "mxfp4, nvfp4.")]
KeepFp32 = Annotated[Many, typer.Option(
    "--keep-fp32", metavar="OP_OR_NODE,...",
    help="Op types, node names or globs kept in float32 (your converter's block list).")]
Converter = Annotated[str | None, typer.Option(
    "--converter", metavar="NAME", autocompletion=_among(_converters),
    help="The fp16 converter to model: plain (default: every float32 tensor runs in --dtype), onnxconverter-common, "
         "onnxruntime, olive or modelopt: its default block list, its clamp of the constants it converts and its "
         "Cast handling.")]
RuntimeOpt = Annotated[str | None, typer.Option(
    "--runtime", metavar="NAME[@VERSION]",
    help="The runtime that runs the model: judge each node in the dtype its kernel there really computes in "
         "(precaudit runtimes lists them: ort-cpu, ort-cuda@1.26, tensorrt@11, ...).")]
Rules = Annotated[Many, typer.Option(
    "--rules", metavar="PATH", help="Extra YAML rule file or folder; may override built-in rules.")]
Select = Annotated[Many, typer.Option(
    "--select", metavar="RULE,...",
    help="Only these rules: ids, names or id prefixes (PA1), or ALL. Replaces [tool.precaudit] select.")]
Ignore = Annotated[Many, typer.Option(
    "--ignore", metavar="RULE,...",
    help="Not these rules (wins over --select). Replaces [tool.precaudit] ignore.")]
ExtendSelect = Annotated[Many, typer.Option(
    "--extend-select", metavar="RULE,...",
    help="These rules too, added to --select or [tool.precaudit] select (or to every rule, when neither is set).")]
ExtendIgnore = Annotated[Many, typer.Option(
    "--extend-ignore", metavar="RULE,...", help="Not these rules either, added to --ignore or [tool.precaudit] ignore.")]
Inputs = Annotated[Many, typer.Option(
    "--inputs", metavar="FILE.npz", help="One array per graph input (else synthesized); repeat for several batches.")]
Samples = Annotated[int, typer.Option("--samples", min=1, help="How many synthesized batches.")]
Dim = Annotated[Many, typer.Option("--dim", metavar="NAME=SIZE", help="Size of a symbolic dim.")]
Range = Annotated[Many, typer.Option(
    "--range", metavar="NAME=LO:HI",
    help="Synthesize this input uniform in [LO, HI] (int16-scale audio: -32768:32767).")]
Seed = Annotated[int, typer.Option("--seed", min=0, help="Seed for synthesized inputs.")]
Timeout = Annotated[float, typer.Option(
    "--timeout", min=0, metavar="SECONDS",
    help="Stop a model's traced run, or a model.py:factory's, after this long (default 1800; 0: no limit).")]
Engine = Annotated[str, typer.Option(
    "--trace-engine", metavar="auto|onnxruntime|numpy", autocompletion=_among(lambda: TRACE_ENGINES),
    help="What runs the ops (auto: onnxruntime where installed).")]
InputShape = Annotated[Many, typer.Option(
    "--input-shape", metavar="D0,D1,...",
    help="PyTorch: shape of each forward() argument when the factory gives none.")]
InputDtype = Annotated[str, typer.Option(
    "--input-dtype", metavar="DTYPE", help="PyTorch: dtype of synthesized inputs (fp32, fp16, bf16, int64).")]
TrustPickle = Annotated[bool, typer.Option(
    "--trust-pickle", help="PyTorch: allow unpickling a whole module (runs code from the file).")]
NoFactories = Annotated[bool, typer.Option(
    "--no-factories",
    help="Import no Python code: every MODEL is a file, and model.py:factory is then no such file; --trust-pickle "
         "is refused. For models from a pull request (the GitHub Action passes it).")]
Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")]
Isolated = Annotated[bool, typer.Option(
    "--isolated", help="Read no [tool.precaudit] table: every setting from the command line (precaudit test runs "
                       "each example so).")]
Trace = Annotated[bool, typer.Option("--trace", help="Run the model and emulate the target dtype.")]
CheckWeights = Annotated[bool | None, typer.Option(
    "--check-weights/--no-check-weights", help="Read every float32 weight and check it (always on with --trace).")]
# the report options check and train share
ReportFormat = Annotated[str | None, typer.Option(
    "--format", "-f", callback=_checked("format"), metavar="FORMAT", autocompletion=_among(lambda: FORMATS),
    help=f"Report format: {', '.join(FORMATS)} (default text).")]
ReportFile = Annotated[str | None, typer.Option(
    "--output", "-o", metavar="FILE",
    help="Write the report to this file (its missing folders made; never over an input; /dev/null: nowhere).")]
FailOn = Annotated[str | None, typer.Option(
    "--fail-on", callback=_checked("fail_on"), metavar="|".join(FAIL_ON), autocompletion=_among(lambda: FAIL_ON),
    help="Exit 1 at this severity or worse (default error).")]
Baseline = Annotated[str | None, typer.Option(
    "--baseline", metavar="FILE", help="Report only findings not in this baseline.")]
NoColor = Annotated[bool, typer.Option("--no-color", help="Plain text even on a terminal.")]
ListFormat = Annotated[str, typer.Option(
    "--format", "-f", callback=_checked("format", LIST_FORMATS), metavar="text|json",
    autocompletion=_among(lambda: LIST_FORMATS), help="text or json.")]
Version = Annotated[bool, typer.Option(
    "--version", is_eager=True, callback=_show_version, help="Print the version and exit.")]


