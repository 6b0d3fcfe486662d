"""A rule's YAML examples (its `tests:` key), each checked before anything runs, as a stranger's input is: the model
an ONNX file in the rule folder (no '..' or symlink out of it, a regular file), the args check's own options as
check parses and checks them, and only those that say how the model is audited (the report, the rules, the
selection, the configuration and the code imported are the test's own)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..rules.condition import kind_of
from ..rules.schema import EXAMPLE_KEYS, EXAMPLE_REQUIRED

if TYPE_CHECKING:
    from ..rules.loader import Rule
    from .run import Commands

__all__ = ["EXAMPLE_OPTIONS", "YamlExample", "inside", "yaml_examples"]

# check's options an example may give: the target, and how the model is read and run
EXAMPLE_OPTIONS = ("--dtype", "--keep-fp32", "--converter", "--runtime", "--check-weights", "--trace", "--inputs",
                   "--samples", "--dim", "--range", "--seed", "--timeout", "--trace-engine")
_SHAPE = "{model: FILE.onnx, args: [OPTION, ...], fires: [NODE, ...]}"

Fail = Callable[[str], InputError]


@dataclass(frozen=True)
class YamlExample:
    """One example of a rule's tests: check on its model, with this rule alone selected; the rule must fire at
    exactly these nodes (none: a quiet twin). Other rules' findings are not its business."""

    rule_id: str
    label: str                # how a problem names it: example 2 (quiet.onnx)
    model: str                # the model's real path, inside the rule folder
    args: tuple[str, ...]     # check's options, --dtype fp16 first unless given, --inputs files by their real paths
    nodes: frozenset[str]
    rules: tuple[str, ...]    # --rules RULES_DIR (none for the built-in folder)

    @property
    def fires(self) -> bool:
        return bool(self.nodes)

    def command_line(self, folder: Path) -> list[str]:
        return [self.model, *self.args, "--select", self.rule_id, *self.rules, "--no-factories"]

    def problems(self, code: int, report: dict[str, Any]) -> list[str]:
        """Each node the rule was to fire at and did not, each it fired at unasked, and any error of the audit."""
        said = [f"{self.label}: {error_line(e)}" for e in report["errors"]]
        fired = {r["node_name"] for r in report["results"] if r["rule_id"] == self.rule_id}
        said += [f"{self.label}: did not fire at '{node}'" for node in sorted(self.nodes - fired)]
        said += [f"{self.label}: fired at '{node}', where it must not" for node in sorted(fired - self.nodes)]
        return said


def error_line(error: dict[str, Any]) -> str:
    """An error of a JSON report, as its one line on stderr says it."""
    where = f"{error['file']}:{error['line']}" if error["file"] and error["line"] else error["file"] or ""
    return f"{where}: {error['message']}" if where else error["message"]


def yaml_examples(rule: Rule, root: str, commands: Commands, rules: tuple[str, ...]) -> list[YamlExample]:
    """The examples of the rule's tests: key, every one checked; one InputError naming the file that set the key,
    its line and the example, for the first that is wrong."""
    tests = rule.tests
    if tests is None:
        return []
    file, line = rule.where.get("tests", (rule.source, None))

    def fail(problem: str) -> InputError:
        return InputError(file, f"rule {rule.id}: tests: {problem}", line)

    if not isinstance(tests, list):
        raise fail(f"must be a list of examples {_SHAPE}, got {kind_of(tests)}")
    def failing(i: int) -> Fail:
        return lambda problem: fail(f"example {i}: {problem}")

    folder = Path(file).parent
    return [_example(rule.id, i, test, folder, root, commands, rules, failing(i)) for i, test in enumerate(tests, 1)]


def _example(rule_id: str, i: int, test: Any, folder: Path, root: str, commands: Commands,
             rules: tuple[str, ...], fail: Fail) -> YamlExample:
    if not isinstance(test, dict):
        raise fail(f"an example is a mapping {_SHAPE}, got {kind_of(test)}")
    unknown = [str(key) for key in test if key not in EXAMPLE_KEYS]
    if unknown:
        raise fail(f"unknown key {unknown[0]!r} (an example has {', '.join(EXAMPLE_KEYS)})")
    missing = [key for key in EXAMPLE_REQUIRED if key not in test]
    if missing:
        raise fail(f"missing key '{missing[0]}' (an example is {_SHAPE})")
    model, nodes, args = test["model"], test["fires"], test.get("args", [])
    if not isinstance(model, str) or not model.endswith(".onnx"):
        got = repr(model) if isinstance(model, str) else kind_of(model)
        raise fail(f"'model' must name an ONNX file (FILE.onnx), got {got}")
    if not isinstance(nodes, list) or not all(isinstance(n, str) and n for n in nodes):
        raise fail(f"'fires' must list node names (the nodes where the rule fires; [] where it must stay quiet), "
                   f"got {kind_of(nodes)}")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise fail(f"'args' must be a list of check's options (strings), got {kind_of(args)}")
    real = inside(model, folder, root, "model", fail)
    checked = _checked_args(args, folder, root, commands, fail)
    return YamlExample(rule_id, f"example {i} ({model})", real, checked, frozenset(nodes), rules)


def inside(path: str, folder: Path, root: str, what: str, fail: Fail) -> str:
    """The real path of a file an example names, relative to its rule file: a regular file inside the rule folder,
    reached through no '..' and no symlink that leads out of it."""
    if os.path.isabs(path):
        raise fail(f"{what} {path!r} is an absolute path; write it relative to the rule file")
    real = os.path.realpath(folder / path)
    if os.path.commonpath([real, root]) != root:
        raise fail(f"{what} {path!r} is outside the rule folder {root} (an example's files must be in it)")
    try:
        mode = os.stat(real).st_mode
    except OSError:
        raise fail(f"{what} {path!r}: no such file") from None
    if not stat.S_ISREG(mode):
        raise fail(f"{what} {path!r} is not a regular file; precaudit reads only regular files")
    return real


def _checked_args(args: list[str], folder: Path, root: str, commands: Commands, fail: Fail) -> tuple[str, ...]:
    """check's options, parsed and checked as check parses and checks them (with no configuration file), and only
    those of EXAMPLE_OPTIONS; --inputs files resolved like the model; --dtype fp16 unless given."""
    from ..cli.given import UsageError

    if any(arg in ("-h", "--help") for arg in args):
        raise fail("args: --help is no option of an example")
    try:
        given, typed = commands.parse("check", args)
    except UsageError as exc:
        raise fail(f"args: {exc}") from None
    if "models" in typed:
        raise fail(f"args: {given.models[0]!r} is no option (an example's model is its 'model')")
    refused = [option for option in typed if option not in EXAMPLE_OPTIONS]
    if refused:
        raise fail(f"args: {refused[0]} is not an option an example may give; it may give {', '.join(EXAMPLE_OPTIONS)}")
    if given.runtime == "all":
        raise fail("args: --runtime all prints the deployment matrix, not findings; name one runtime")
    given.values["isolated"] = True
    try:  # every value checked as check checks it
        given.settings()
        given.trace_options()
    except (UsageError, InputError) as exc:
        raise fail(f"args: {exc.problem if isinstance(exc, InputError) else exc}") from None
    resolved = _inputs_resolved(args, lambda path: inside(path, folder, root, "--inputs file", fail))
    return tuple(resolved if "--dtype" in typed else ["--dtype", "fp16", *resolved])


def _inputs_resolved(args: list[str], resolve: Callable[[str], str]) -> list[str]:
    """The args with each --inputs file by its real path (the example's files are relative to its rule file)."""
    out: list[str] = []
    follows = False
    for arg in args:
        if follows:
            out.append(resolve(arg))
        elif arg.startswith("--inputs="):
            out.append("--inputs=" + resolve(arg.partition("=")[2]))
        else:
            out.append(arg)
        follows = not follows and arg == "--inputs"
    return out
