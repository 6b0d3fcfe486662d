"""What one command line gave, as typer parsed it, and the pieces of a run made from it: the settings (the
pyproject's, under the flags given, by load_settings: the path the Python API takes too), the PyTorch options and
the traced-mode options. Every value is checked by the check the API's argument gets, named as it was typed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the heavy modules load only when a command needs them
    from ..config import Settings
    from ..options import TorchOptions, TraceOptions

__all__ = ["EXIT_CLEAN", "EXIT_ERROR", "EXIT_FINDINGS", "Given", "UsageError", "bad_value", "split"]

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2

# a command's parameter -> the setting it gives ([tool.precaudit]'s key, load_settings' name)
_SETTINGS = {"dtype": "dtype", "autocast": "autocast", "keep_fp32": "keep_fp32", "converter": "converter",
             "runtime": "runtime", "rules": "rules", "select": "select", "ignore": "ignore",
             "extend_select": "extend_select", "extend_ignore": "extend_ignore", "preview": "preview",
             "report_format": "format", "fail_on": "fail_on", "baseline": "baseline", "check_weights": "check_weights"}
_LISTS = ("keep_fp32", "select", "ignore", "extend_select", "extend_ignore")  # comma-separated, and repeatable


class UsageError(Exception):
    """The command line itself is wrong: one line, exit 2."""


def bad_value(option: str, problem: str) -> UsageError:
    return UsageError(f"Invalid value for '{option}': {problem}")


class Given:
    """One command's parameters by name (given.output, given.models); a list is a list, empty when not given."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values: dict[str, Any] = {name: list(value) if isinstance(value, (list, tuple)) else value
                       for name, value in values.items()}
        if "models" in self.values:
            self.values["models"] = list(self.values["models"] or [])

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def settings(self) -> Settings:
        """Defaults < [tool.precaudit] < the flags given: a flag not typed (None, or an empty list) is not given;
        with --isolated, defaults < the flags (no configuration file is looked for)."""
        from ..config import load_settings

        flags = {key: split(self.values[name]) if name in _LISTS else self.values[name]
                 for name, key in _SETTINGS.items() if self.values.get(name) not in (None, [])}
        return load_settings(flags, config=None) if self.values.get("isolated") else load_settings(flags)

    def torch_options(self) -> TorchOptions:
        """How a PyTorch model becomes a graph: --input-shape, --input-dtype, --trust-pickle, --no-factories."""
        from ..options import TorchOptions

        trust = self.values.get("trust_pickle", False)
        return TorchOptions(_shapes(self.values.get("input_shape", [])), self.values.get("input_dtype", "fp32"),
                            trust, factories=_factories(self.values.get("no_factories", False), trust))

    def traced(self) -> bool:
        """--trace, or --inputs without it (check, keep-list: the inputs are read by traced mode only, so giving
        them asks for it; a line on stderr says so). fix reads --inputs for its float32 check, traced or not."""
        if self.values.get("trace") or not self.values.get("inputs"):
            return bool(self.values.get("trace"))
        from .output import say

        say("note: --inputs without --trace: running traced mode on them (the static audit reads no inputs)")
        return True

    def trace_options(self) -> TraceOptions:
        """The traced-mode flags, each checked by the check the Python API's trace= gets, named as typed (typer has
        checked --samples >= 1, --seed >= 0 and --timeout >= 0); made with or without --trace, so a wrong value is
        refused either way, and --dim sizes the static pass too."""
        from ..options import TraceOptions, check_trace_option

        return TraceOptions(self.inputs, self.samples, _dims(self.dim), self.seed,
                            check_trace_option("engine", self.trace_engine, "--trace-engine"), ranges=_ranges(self.range_),
                            timeout=check_trace_option("timeout", self.timeout, "--timeout") or None)

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
        raise bad_value("--input-shape", f"shapes are comma-separated integers, got {entries}") from None


def _ranges(entries: list[str]) -> dict[str, tuple[float, float]]:
    """--range x=-32768:32767 --range mask=0:1."""
    from ..options import check_trace_option

    ranges = {}
    for entry in entries:
        name, _, span = entry.partition("=")
        lo, sep, hi = span.rpartition(":")
        try:
            if not name.strip() or not sep:
                raise ValueError(entry)
            ranges[name.strip()] = (float(lo), float(hi))
        except ValueError:
            raise bad_value("--range", f"expected NAME=LO:HI with finite LO <= HI, got {entry!r}") from None
    return check_trace_option("ranges", ranges, "--range")  # the values: as the API's trace={"ranges": ...}


def _dims(entries: list[str]) -> dict[str, int]:
    """--dim batch=2 --dim seq=128."""
    from ..options import check_trace_option

    dims = {}
    for entry in entries:
        name, _, size = entry.partition("=")
        if not name.strip() or not (size.isascii() and size.isdigit()):  # int() refuses '²', which isdigit() accepts
            raise bad_value("--dim", f"expected NAME=SIZE with SIZE >= 1, got {entry!r}")
        dims[name.strip()] = int(size)
    return check_trace_option("dims", dims, "--dim")  # the sizes: as the API's trace={"dims": ...}


def split(entries: list[str]) -> list[str]:
    """--select PA101,PA102 and --select PA101 --select PA102 mean the same."""
    return [item.strip() for entry in entries for item in entry.split(",") if item.strip()]
