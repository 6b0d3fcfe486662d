"""Settings: [tool.precaudit] in the nearest pyproject.toml, overridden by command-line flags."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]  # the same API under its pre-3.11 name

from .converters import CONVERTER_NAMES
from .dtypes import FORMATS as DTYPES
from .dtypes import format_named
from .errors import InputError
from .files import MiB, read_text
from .options import (
    AUTOCAST,
    FAIL_ON,
    FORMATS,
    check_bool,
    check_choice,
    check_path,
    check_paths,
    check_strings,
    flag,
    shown,
)

__all__ = ["FAIL_ON", "FORMATS", "Settings", "check_setting", "find_config", "load_settings"]

_TABLE = "[tool.precaudit]"


@dataclass
class Settings:
    """The resolved configuration; origins says where each value came from (default, a file, or the command line)."""

    dtype: str = "fp16"
    keep_fp32: list[str] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)
    format: str = "text"
    fail_on: str = "error"
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    # added to select (or to every rule) and to ignore, as Ruff's extend-select and extend-ignore: the command
    # line's --select and --ignore replace the pyproject's lists, --extend-select and --extend-ignore add to them
    extend_select: list[str] = field(default_factory=list)
    extend_ignore: list[str] = field(default_factory=list)
    preview: bool = False
    check_weights: bool = False  # read every float32 weight and measure it against the target dtype
    autocast: str | None = None  # PyTorch: run the float32 module under torch.autocast on this device (cuda, cpu)
    converter: str = "plain"  # the ONNX fp16 converter whose block list and constant clamp to model (converters/)
    runtime: str | None = None  # the runtime that runs the model, NAME[@VERSION] (runtime/): what kernels compute in
    baseline: str | None = None
    per_model_ignores: dict[str, list[str]] = field(default_factory=dict)
    per_node_ignores: dict[str, list[str]] = field(default_factory=dict)
    config_file: str | None = None
    origins: dict[str, str] = field(default_factory=dict)
    # how an error names a value the caller gave: --keep-fp32 on the command line, keep_fp32 in the Python API
    named: Callable[[str], str] = field(default=flag, repr=False)

    @property
    def selected(self) -> list[str]:
        """The selectors that choose the rules run: select (empty: every rule) and extend_select."""
        if not self.extend_select:
            return self.select
        return [*(self.select or ["ALL"]), *self.extend_select]

    @property
    def ignored(self) -> list[str]:
        """The selectors of the rules not run: ignore and extend_ignore."""
        return [*self.ignore, *self.extend_ignore]

    @property
    def project_root(self) -> Path | None:
        """Model globs in per-model-ignores are relative to this folder."""
        return Path(self.config_file).resolve().parent if self.config_file else None

    def describe(self) -> str:
        """What --show-settings prints: every key, its value, and where the value came from."""
        from .escape import printable

        # values come from a pyproject and the command line, both a stranger's: quoted as TOML strings, and every
        # character a terminal would act on escaped, as every other string precaudit prints
        lines = [f"config file: {self.config_file or '(none: no pyproject.toml with [tool.precaudit] found)'}"]
        for name in _KEYS:
            value = getattr(self, name)
            shown = _toml_value(value)
            lines.append(f"{_key(name):<18} = {shown:<40} # {self.origins.get(name, 'default')}")
        return "".join(f"{printable(line)}\n" for line in lines)


def find_config(start: Path | None = None) -> Path | None:
    """The nearest pyproject.toml with a [tool.precaudit] table, from start up to the repository root."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file() and "precaudit" in _read_toml(candidate).get("tool", {}):
            return candidate
        if (folder / ".git").exists():  # never pick up a config from outside the project
            return None
    return None


_FIND = Path("<find>")  # load_settings' default: the nearest pyproject.toml with a [tool.precaudit] table


def load_settings(cli: dict[str, Any], start: Path | None = None, config: Path | None = _FIND,
                  named: Callable[[str], str] = flag) -> Settings:
    """Defaults < [tool.precaudit] < command-line flags; cli holds only the flags the user actually gave, each
    checked as a pyproject's value is, its error naming it as named does (the flag, or the API's argument).

    config: found from start (the default), None for no configuration file, or the pyproject.toml to read (the
    Python API's config=path), which must hold a [tool.precaudit] table."""
    settings = Settings(named=named)
    cli = {name: check_setting(name, value, named(name)) for name, value in cli.items()}
    if config is _FIND:
        config = find_config(start)
    elif config is not None:
        if not config.is_file():
            raise InputError(str(config), "no such configuration file")
        if "precaudit" not in _read_toml(config).get("tool", {}):
            raise InputError(str(config), "has no [tool.precaudit] table")
    if config is not None:
        settings.config_file = _display(config)
        table = _read_toml(config)["tool"]["precaudit"]
        for name, value in _validated(table, config).items():
            setattr(settings, name, value)
            settings.origins[name] = settings.config_file
    for name, value in cli.items():
        setattr(settings, name, value)
        settings.origins[name] = "command line"
    return settings


_KEYS = [f.name for f in fields(Settings) if f.name not in ("config_file", "origins", "named")]
_PATHS = ("rules", "baseline")  # written relative to the pyproject.toml, so CI works from any folder


def _key(name: str) -> str:
    return name.replace("_", "-")


# a project's pyproject.toml is kilobytes; tomllib takes about a second per MiB (16 MiB of keep-fp32 names took
# minutes), and the file is read where it is found and again where it is loaded: at most 1 MiB, parsed once
_MAX_TOML_BYTES = 1 * MiB


def _read_toml(path: Path) -> dict:
    """The parsed file (a copy: callers may change it); the same text is parsed once per process."""
    import copy

    text = read_text(path, _MAX_TOML_BYTES, _display(path))
    if _PARSED.get("text") != text:
        _PARSED.clear()  # one file's text at a time: a long-lived process (a notebook) keeps no pile
        _PARSED.update(text=text, doc=_parse_toml(text, path))
    return copy.deepcopy(_PARSED["doc"])


_PARSED: dict[str, Any] = {}


def _parse_toml(text: str, path: Path) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(_display(path), f"invalid TOML: {exc}") from None
    except RecursionError:
        raise InputError(_display(path), "invalid TOML: nested too deep") from None
    except ValueError as exc:  # an integer past the interpreter's 4,300 digits: tomllib has no hook to refuse it first
        raise InputError(_display(path), f"invalid TOML: a number too long to read ({str(exc).split(';')[0]})") from None


def _validated(table: Any, path: Path) -> dict[str, Any]:
    """Check every key's type and value; the error names the file and the key."""
    if not isinstance(table, dict):
        raise InputError(_display(path), f"{_TABLE} must be a table")
    known = {_key(n): n for n in _KEYS}
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            raise InputError(_display(path), f"{_TABLE} {key}: unknown key (allowed: {', '.join(known)})")
        name = known[key]
        out[name] = check_setting(name, value, f"{_TABLE} {key}", _display(path))
        if name in _PATHS and out[name] is not None:
            out[name] = _relative_to(path.parent, out[name])
    return out


_CHOICES = {"fail_on": FAIL_ON, "format": FORMATS, "autocast": AUTOCAST, "converter": CONVERTER_NAMES}


def check_setting(name: str, value: Any, where: str, file: str | None = None) -> Any:
    """One setting's value, from a pyproject, a flag or an API argument, as the run takes it; InputError(file,
    "where: problem") if it is wrong. Lists are lists of strings (a bare string is refused, never read as its
    characters); rules and baseline are paths (str or os.PathLike)."""
    if name in ("per_model_ignores", "per_node_ignores"):
        if not isinstance(value, dict):
            raise InputError(file, f'{where}: must be a table of glob = ["rule", ...]')
        for glob, selectors in value.items():
            if not isinstance(selectors, list) or not all(isinstance(s, str) for s in selectors):
                raise InputError(file, f"{where}: '{glob}' must map to a list of rule ids, names or prefixes")
        return {glob: list(selectors) for glob, selectors in value.items()}
    if name == "rules":
        return check_paths(value, where, file)
    if name == "baseline":
        return check_path(value, where, file)
    if name == "runtime":
        return _check_runtime(value, where, file)
    if name in _CHOICES:
        return check_choice(value, _CHOICES[name], where, file)
    default = getattr(Settings(), name)
    if isinstance(default, list):
        return check_strings(value, where, file)
    if isinstance(default, bool):
        return check_bool(value, where, file)
    if not isinstance(value, str):  # dtype
        raise InputError(file, f"{where}: must be a string, got {shown(value)}")
    try:
        format_named(value)
    except KeyError:
        raise InputError(file, f"{where}: unknown dtype {shown(value)}; choose one of {', '.join(DTYPES)}") from None
    return value


def _check_runtime(value: Any, where: str, file: str | None) -> str:
    """NAME or NAME@VERSION of a modelled runtime (a version between the modelled ones is judged as the nearest)."""
    if not isinstance(value, str):
        raise InputError(file, f"{where}: must be a string, got {shown(value)}")
    from .runtime import runtime_named

    if value == "all":  # check's deployment matrix: every runtime that runs the model (matrix.py)
        return value
    try:
        runtime_named(value)
    except ValueError as exc:
        raise InputError(file, f"{where}: {exc}") from None
    return value


def _relative_to(folder: Path, value: str | list[str]) -> str | list[str]:
    if isinstance(value, list):
        return [str(_relative_to(folder, v)) for v in value]
    return value if Path(value).is_absolute() else _display(folder / value)


def _display(path: Path) -> str:
    """Paths as the user would type them from the working directory."""
    try:
        return os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "(none)"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_string(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f'{_toml_string(k)} = {_toml_value(v)}' for k, v in value.items()) + "}"
    return _toml_string(value)


def _toml_string(value: Any) -> str:
    """A TOML basic string: its quotes and backslashes escaped (JSON's escapes are TOML's)."""
    import json

    return json.dumps(str(value), ensure_ascii=False)
