"""The quantization config, read as the loaders read it: which group's scheme each module gets, which modules it
ignores, and which format, block size and static activation scale that scheme means.

compressed-tensors and ModelOpt (whose config.json carries config_groups too, and whose hf_quant_config.json has
quant_algo, quantized_layers and exclude_modules) both name modules by targets. compressed-tensors picks a
module's scheme by precedence: an exact module name, then a regex ("re:..."), then a class name ("Linear"); within
one level the first group wins, so two groups at the same level leave the scheme to the order of a JSON object.
A class target is taken to match every module stored quantized (the checkpoint holds no classes).

The targets are a stranger's regexes: one with a repeated group that repeats or alternates inside ("(a+)+",
"(a|a)*") can backtrack for hours in Python's `re`, so such a target is skipped with a note.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["QuantConfig", "Scheme", "family_of_algo", "positive_ints", "read_config"]

_CLASS = re.compile(r"[A-Z][A-Za-z0-9_]*\Z")
_MAX_PATTERN = 1000
_MAX_REPEATS = 3

_ALGO_FAMILY = {"NVFP4": "nvfp4", "W4A16_NVFP4": "nvfp4", "NVFP4_AWQ": "nvfp4", "W4A8_NVFP4_FP8": "nvfp4",
                "FP8": "fp8", "FP8_PB_WO": "fp8", "FP8_PER_CHANNEL_PER_TOKEN": "fp8", "MXFP8": "mxfp8",
                "W4A8_MXFP4_FP8": "mxfp4", "MXFP4": "mxfp4", "W4A16_AWQ": "int4", "W4A8_AWQ": "int4",
                "INT4_AWQ": "int4", "W8A16": "int8", "W8A8_SQ_PER_CHANNEL": "int8", "INT8": "int8"}


def family_of_algo(algo: Any) -> str | None:
    return _ALGO_FAMILY.get(algo.upper()) if isinstance(algo, str) else None


@dataclass(eq=False)  # one group is one object: equal schemes in two groups are still two claims
class Scheme:
    """One config group: its name, targets, and what it means for the tensors."""

    name: str
    targets: list[str]
    family: str | None
    group_size: int | None = None
    block: tuple[int, ...] | None = None  # fp8 block structure, [rows, columns]
    static_input: bool = False  # an activation scale computed at calibration, stored in the checkpoint

    def same_scheme(self, other: Scheme) -> bool:
        return (self.family, self.group_size, self.block, self.static_input) == \
            (other.family, other.group_size, other.block, other.static_input)


@dataclass
class QuantConfig:
    method: str
    schemes: list[Scheme]
    ignore: list[str]
    notes: list[str] = field(default_factory=list)
    substring_ignore: bool = False  # transformers' modules_to_not_convert: a key anywhere in the name

    def __post_init__(self) -> None:
        # a MIXED_PRECISION config names every layer exactly: those are looked up, not tried one by one
        self._exact: dict[str, list[Scheme]] = {}
        self._other: list[tuple[Scheme, str]] = []
        for scheme in self.schemes:
            for target in dict.fromkeys(scheme.targets):
                if _is_pattern(target) or _CLASS.match(target):
                    self._other.append((scheme, target))
                else:
                    self._exact.setdefault(target, []).append(scheme)
        self._ignore_exact = {t for t in self.ignore if not _is_pattern(t)}
        self._ignore_patterns = [t for t in self.ignore if _is_pattern(t)]
        self._compiled: dict[str, re.Pattern[str] | None] = {}
        self._claims: dict[str, list[Scheme]] = {}
        self._ignored: dict[str, str | None] = {}

    def claimants(self, module: str) -> list[Scheme]:
        """The groups that claim the module at the highest precedence any of them reaches: an exact name, then a
        pattern, then a class name (empty: none)."""
        if module not in self._claims:
            self._claims[module] = self._claimants(module)
        return self._claims[module]

    def ignored_by(self, module: str) -> str | None:
        """The ignore entry that names the module or a module it belongs to, if any (a class name in an ignore list
        names no module a checkpoint shows)."""
        if module not in self._ignored:
            self._ignored[module] = self._ignored_by(module)
        return self._ignored[module]

    def _claimants(self, module: str) -> list[Scheme]:
        if module in self._exact:
            return list(dict.fromkeys(self._exact[module]))
        best: dict[int, list[Scheme]] = {}
        for scheme, target in self._other:
            level = 1 if _is_pattern(target) else 2
            if (level == 2 or self._matches(target, module)) and scheme not in best.get(level, []):
                best.setdefault(level, []).append(scheme)
        return best[min(best)] if best else []

    def _ignored_by(self, module: str) -> str | None:
        parts = module.split(".")
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in self._ignore_exact:
                return ".".join(parts[:i])
        if self.substring_ignore:
            found = next((t for t in self.ignore if t and t in module), None)
            if found is not None:
                return found
        return next((t for t in self._ignore_patterns if self._matches(t, module)), None)

    def _matches(self, target: str, module: str) -> bool:
        if target.startswith("re:"):
            source = target[3:]
            if source not in self._compiled:
                self._compiled[source] = _safe_regex(source, self.notes)
            pattern = self._compiled[source]
            return pattern is not None and pattern.match(module) is not None
        return fnmatch.fnmatchcase(module, target)


def _is_pattern(target: str) -> bool:
    return target.startswith("re:") or any(c in target for c in "*?[")


def _safe_regex(source: str, notes: list[str]) -> re.Pattern[str] | None:
    problem = "longer than 1000 characters" if len(source) > _MAX_PATTERN else _backtracking(source)
    if problem is None:
        try:
            return re.compile(source)
        except (re.error, RecursionError, OverflowError) as exc:
            problem = f"not a regex ({exc})"
    notes.append(f"target 're:{source}' skipped: {problem}")
    return None


def _backtracking(source: str) -> str | None:
    """Why the regex could backtrack for long: a quantified group holding a quantifier or an alternation, more
    than three repetitions, or a backreference. A heuristic that errs on refusing."""
    if re.search(r"\\[1-9]|\(\?P=", source):
        return "it has a backreference"
    stack: list[bool] = []  # per open group: does it hold a quantifier or '|'?
    i = repeats = 0
    while i < len(source):
        c = source[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":  # a character class: its *, + and | are characters
            close = source.find("]", i + 2 if source[i + 1:i + 2] in ("]", "^") else i + 1)
            i = len(source) if close < 0 else close
        elif c == "(":
            stack.append(False)
        elif c == ")" and stack:
            risky = stack.pop()
            quantified = i + 1 < len(source) and source[i + 1] in "*+?{"
            if risky and quantified:
                return "a repeated group that repeats or alternates inside can backtrack for hours"
            if stack and (risky or quantified):
                stack[-1] = True
        elif c in "*+{|" or (c == "?" and i and source[i - 1] not in "(*+?}"):
            repeats += c in "*+{"
            if stack:
                stack[-1] = True
        i += 1
    # n repetitions side by side (".*a.*b.*c") try some len(name)**n splits before they fail
    return f"{repeats} repetitions can take len(name)**{repeats} steps" if repeats > _MAX_REPEATS else None


def read_config(config: dict[str, Any]) -> QuantConfig:
    """The schemes and ignore list of a quantization_config (or ModelOpt's hf_quant_config.json "quantization")."""
    method = str(config.get("quant_method", "")).lower() or "unknown"
    ignore = _strings(config.get("ignore")) + _strings(config.get("exclude_modules"))
    groups = config.get("config_groups")
    if isinstance(groups, dict) and groups:
        schemes = [_group_scheme(str(name), g) for name, g in groups.items() if isinstance(g, dict)]
    elif isinstance(config.get("quantized_layers"), dict):  # ModelOpt MIXED_PRECISION without config_groups
        schemes = [_algo_scheme(name, [name], spec.get("quant_algo"), spec.get("group_size"))
                   for name, spec in config["quantized_layers"].items() if isinstance(spec, dict)]
    elif method == "modelopt":
        algo = config.get("quant_algo")
        schemes = [_algo_scheme(f"quant_algo {algo}", ["Linear"], algo, config.get("group_size"))]
    elif method in ("mxfp4", "fp8"):  # transformers' own: every module it converts, less modules_to_not_convert
        block = config.get("weight_block_size")
        schemes = [Scheme(method, ["Linear"], method, 32 if method == "mxfp4" else None,
                          positive_ints(block),
                          method == "fp8" and config.get("activation_scheme") == "static")]
        return QuantConfig(method, schemes, ignore + _strings(config.get("modules_to_not_convert")),
                           substring_ignore=True)
    else:
        schemes = []
    return QuantConfig(method, schemes, ignore)


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def positive_ints(value: Any) -> tuple[int, ...] | None:
    """A list of positive integers as a tuple (a block structure), else None."""
    if isinstance(value, list) and value and all(type(v) is int and v > 0 for v in value):
        return tuple(value)
    return None


def _algo_scheme(name: str, targets: list[str], algo: Any, group_size: Any) -> Scheme:
    family = family_of_algo(algo)
    size = group_size if type(group_size) is int and group_size > 0 else None
    # ModelOpt calibrates its activation scales for every algorithm that quantizes activations (W4A16 ones do not)
    static = isinstance(algo, str) and not algo.upper().startswith(("W4A16", "W8A16"))
    return Scheme(name, targets, family, size, None, static)


def _group_scheme(name: str, group: dict[str, Any]) -> Scheme:
    weights: dict[str, Any] = group["weights"] if isinstance(group.get("weights"), dict) else {}
    inputs = group.get("input_activations")
    bits, kind, size = weights.get("num_bits"), weights.get("type"), weights.get("group_size")
    size = size if type(size) is int and size > 0 else None
    block = weights.get("block_structure")
    family = None
    if kind == "float" and bits == 4:
        family = "mxfp4" if size == 32 else "nvfp4"
    elif kind == "float" and bits == 8:
        family = "mxfp8" if size == 32 else "fp8"
    elif kind == "int" and bits in (4, 8):
        family = f"int{bits}"
    static = isinstance(inputs, dict) and inputs.get("dynamic") is not True
    return Scheme(name, _strings(group.get("targets")), family, size, positive_ints(block), static)
