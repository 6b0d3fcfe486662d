"""Rule files are code-like input from strangers: each hostile one is one line naming its file and line,
exit 2, in bounded memory and time; never a traceback, an 'internal error', a hang or gigabytes.

Every case runs in-process (capsys sees the exact stderr) under a guard: an alarm and an address-space limit a
little above what the process already uses, so a regression fails the test instead of the machine. The cases
that would blow up without the bounds also run in a child process limited to 1 GiB of address space and a
timeout, which is what a CI runner sees.
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from precaudit.cli import main
from precaudit.rules import loader
from precaudit.rules.condition import ConditionError, parse_condition
from precaudit.rules.template import render

ROOT = Path(__file__).resolve().parent.parent
MODEL = str(ROOT / "examples" / "tiny_block_fp16.onnx")
GiB = 1 << 30

HEAD = "id: ORG001\nname: org-rule\nseverity: error\nsummary: s\n"  # lines 1-4
BODY = "sites: [norm]\ncondition: has_eps\nmessage: m\nfix: f\n"      # lines 5-8; an extra key lands on line 9


def cond(text: str) -> str:
    """A rule whose condition (line 6) is text."""
    return HEAD + f"sites: [norm]\ncondition: \"{text}\"\nmessage: m\nfix: f\n"


def message(text: str, key: str = "message") -> str:
    """A rule whose message (line 7) or fix (line 8) is text."""
    fields = {"message": "m", "fix": "f", key: f"'{text}'"}
    return HEAD + f"sites: [norm]\ncondition: has_eps\nmessage: {fields['message']}\nfix: {fields['fix']}\n"


def extra(text: str) -> str:
    """A rule with one more key, on line 9."""
    return HEAD + BODY + text + "\n"


def pattern(text: str) -> str:
    """A pattern rule; the pattern is on line 5."""
    return HEAD + f"pattern: {text}\ncondition: 'True'\nmessage: m\nfix: f\n"


LAUGHS = "".join(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}" if i else "lol"] * 9) + "]\n" for i in range(12))

# (id, rule file text, line, what the one line must say, heavy: would take gigabytes, minutes or the stack)
CASES = [
    # sizes the evaluator bounds (refused when the rule is loaded: these parts use no fact)
    ("str-repeat", cond("'x' * 3000000000 == eps_role"), 6, "makes more than 1000 items", True),
    ("list-repeat", cond("[0] * 400000000 == eps_role"), 6, "makes more than 1000 items", True),
    ("repeat-left", cond("400000000 * [0, 1] == eps_role"), 6, "makes more than 1000 items", True),
    ("percent-format", cond("'%2000000000d' % 1 == eps_role"), 6, "string formatting with % is not allowed", True),
    ("percent-star", cond("'%*d' % (2000000000, 1) == eps_role"), 6, "string formatting with % is not allowed", True),
    ("shift", cond("1 << 10 ** 9 > eps"), 6, "'LShift' is not allowed", True),
    ("floordiv", cond("eps // 0 > 1"), 6, "'FloorDiv' is not allowed", False),
    ("comprehension", cond("[x for x in [1, 2]] == eps_role"), 6, "'ListComp' is not allowed", True),
    ("generator", cond("max(x for x in [1]) > eps"), 6, "'GeneratorExp' is not allowed", False),
    ("subscript", cond("eps_role[0] == 'e'"), 6, "'Subscript' is not allowed", False),
    ("min-of-nothing", cond("min() > eps"), 6, "min() takes at least 1 argument", False),
    ("sqrt-two-args", cond("sqrt(eps, 2) > 0"), 6, "sqrt() takes 1 argument", False),
    ("min-empty-list", cond("min([]) > eps"), 6, "min() of an empty list", False),
    ("string-minus", cond("'a' - 1 == eps"), 6, "cannot compute a string - a number", False),
    # ... and while it runs (this part uses a fact or a param): the condition's line, and the node
    ("repeat-by-param", HEAD + "sites: [norm]\ncondition: \"'x' * n == eps_role\"\nmessage: m\nfix: f\n"
                              "params: {n: 2000000000}\n", 6, "makes more than 1000 items at node '/", True),
    ("type-error-at-run", HEAD + "sites: [norm]\nparams: {s: abc}\ncondition: eps < s\nmessage: m\nfix: f\n",
     7, "condition cannot be computed: '<' not supported", False),
    # (with several models, the line names the one the node is in)
    ("at-run-names-the-model", HEAD + "sites: [norm]\nparams: {s: abc}\ncondition: eps < s\nmessage: m\nfix: f\n",
     7, f"'float' and 'str' at node '/embeddings/LayerNorm/LayerNormalization' of {MODEL}", False),
    # nesting and length, checked before ast.parse (which recurses in C) and before the evaluator (in Python)
    ("not-10000", cond("not " * 10000 + "has_eps"), 6, "condition is 40007 characters long; at most 2000", True),
    ("minus-10000", cond("-" * 10000 + "eps > 0"), 6, "condition is 10007 characters long; at most 2000", True),
    ("sum-100000", cond(" + ".join(["eps"] * 100000) + " > 0"), 6, "characters long; at most 2000", True),
    ("not-60", cond("not " * 60 + "has_eps"), 6, "condition nests more than 50 deep", False),
    ("minus-60", cond("-" * 60 + "eps > 0"), 6, "condition nests more than 50 deep", False),
    ("sum-60", cond(" + ".join(["eps"] * 60) + " > 0"), 6, "condition nests more than 50 deep", False),
    ("brackets-60", cond("(" * 60 + "eps" + ")" * 60 + " > 0"), 6, "nests brackets more than 50 deep", False),
    ("terms-300", cond(" or ".join(["1"] * 300) + " or has_eps"), 6, "condition has more than 250 terms", False),
    # message and fix templates
    ("format-width", message("{eps:2000000000}"), 7, "the width of '{eps:2000000000}' is more than 100", True),
    ("format-precision", message("{eps:.2000000000f}"), 7, "the precision of '{eps:.2000000000f}'", True),
    ("format-width-fix", message("{eps:>999999999.3g}", "fix"), 8, "the width of", True),
    ("format-nested", message("{eps:{eps_role}}"), 7, "nested fields are not allowed", False),
    ("format-attribute", message("{eps.__class__}"), 7, "reaches into a value", False),
    ("format-index", message("{eps_role[0]}"), 7, "reaches into a value", False),
    ("format-conversion", message("{eps!r}"), 7, "uses a conversion", False),
    ("format-stray", message("a } b"), 7, "a '}' that closes no field", False),
    ("format-unclosed", message("a {eps"), 7, "opens a field that never closes", False),
    ("format-bad-spec", message("{eps:qq}"), 7, "has a format spec Python does not read", False),
    ("format-fields", message("{eps}" * 100), 7, "has more than 64 fields", False),
    ("format-long", message("a" * 5000), 7, "'message' is 5000 characters long; at most 4000", False),
    # YAML
    ("yaml-billion-laughs", extra("example:\n  " + LAUGHS.replace("\n", "\n  ").rstrip()), 10,
     "aliases are not allowed in rule files", True),
    ("yaml-alias", extra("example: *text"), 9, "YAML aliases are not allowed in rule files", False),
    ("yaml-anchor", extra("example: &text words"), 9, "YAML anchors and aliases are not allowed", False),
    ("yaml-deep-10000", extra("description: " + "[" * 10000 + "]" * 10000), 9, "YAML nests more than 64 levels",
     True),
    ("yaml-deep-mapping", extra("description: " + "{a: " * 5000 + "b" + "}" * 5000), 9, "YAML nests more than 64",
     True),
    ("yaml-many-values", extra("description: [" + "a, " * 100000 + "]"), 9, "more than 5000 YAML values", True),
    ("yaml-base-60-int", extra("params: {p: 1" + ":1" * 300000 + "}"), 9, "a number written with more than 100", True),
    ("yaml-long-int", extra("params: {p: " + "9" * 100000 + "}"), 9, "a number written with more than 100", True),
    ("yaml-empty-int", extra("params: {p: !!int ''}"), 9, "invalid YAML value", False),
    ("yaml-python-tag", extra("params: {p: !!python/object/apply:os.system [ls]}"), 9, "invalid YAML", False),
    ("yaml-syntax", extra("description: [unclosed"), 10, "invalid YAML", False),
    ("yaml-two-documents", HEAD + BODY + "---\n" + HEAD + BODY, 9, "expected a single document", False),
    ("yaml-control-char", extra("description: a\x01b"), 9, "invalid YAML", False),
    ("yaml-not-a-mapping", "- id: ORG001\n", 1, "a rule file must hold one YAML mapping", False),
    ("yaml-non-string-key", extra("1: one"), 9, "the keys of a rule are names", False),
    ("yaml-merge-key", extra("<<: {preview: true}"), 9, "the keys of a rule are names", False),
    ("yaml-duplicate-key", extra("condition: 'True'"), 9, "key 'condition' appears twice (first on line 6)", False),
    # the type of every key
    ("sites-mapping", HEAD + "sites: {a: 1}\ncondition: has_eps\nmessage: m\nfix: f\n", 5,
     "'sites' must be a list of strings, got a mapping", False),
    ("sites-unknown", HEAD + "sites: [nrom]\ncondition: has_eps\nmessage: m\nfix: f\n", 5, "unknown site kind 'nrom'",
     False),
    ("ops-number", extra("ops: 5"), 9, "'ops' must be a list of strings, got a number", False),
    ("ops-mapping", extra("ops: {Log: 1}"), 9, "'ops' must be a list of strings, got a mapping", False),
    ("params-list", extra("params: [1]"), 9, "'params' must map names to numbers, strings or booleans", False),
    ("param-list-value", extra("params: {p: [1]}"), 9, "param 'p' must be a number, a string or a boolean", False),
    ("param-name", extra("params: {'a b': 1}"), 9, "param name 'a b' is not a name", False),
    ("param-huge-hex", extra("params: {p: 0x" + "f" * 90 + "}"), 9, "param 'p' does not fit in 64 bits", False),
    ("param-long-string", extra("params: {p: " + "x" * 5000 + "}"), 9, "param 'p' is a string of 5000 characters",
     False),
    ("references-number", extra("references: 5"), 9, "'references' must be a list of strings", False),
    ("example-mapping", extra("example: {a: 1}"), 9, "'example' must be a string, got a mapping", False),
    ("preview-string", extra("preview: 'yes'"), 9, "'preview' must be true or false", False),
    ("summary-list", HEAD.replace("summary: s", "summary: [s]") + BODY, 4, "'summary' must be a string", False),
    ("condition-number", HEAD + "sites: [norm]\ncondition: 5\nmessage: m\nfix: f\n", 6, "'condition' must be a string",
     False),
    ("severity-mapping", HEAD.replace("severity: error", "severity: {a: 1}") + BODY, 3, "'severity' must be one of",
     False),
    ("id-huge", "id: " + "A" * 100000 + "\n", 1, "'id' must look like PA101", False),
    ("override-params-list", "id: PA103\nparams: [1]\n", 2, "'params' must map names", False),
    ("override-repeat", "id: PA103\ncondition: \"eps_role * 10 ** 9 == 'x'\"\n", 2, "cannot be computed", False),
    # patterns: measured in the loader before compile_pattern (which recurses) sees them
    ("pattern-400-deep", pattern("{not: " * 400 + "{op: Log}" + "}" * 400), 5, "YAML nests more than 64 levels",
     True),
    ("pattern-30-deep", pattern("{op: Log, inputs: [" + "{not: " * 30 + "{op: Exp}" + "}" * 30 + "]}"), 5,
     "the pattern nests more than 10 levels deep", False),
    ("pattern-any-of-deep", pattern("{op: Log, inputs: [" + "{any_of: [_, " * 20 + "_" + "]}" * 20 + "]}"), 5,
     "the pattern nests more than 10 levels deep", False),
    ("pattern-wide", pattern("{op: Log, inputs: [" + ", ".join(["{op: Exp}"] * 200) + "]}"), 5,
     "the pattern has more than 100 parts", False),
    ("pattern-not-a-mapping", pattern("[1, 2]"), 5, "pattern: expected a mapping", False),
    ("pattern-huge-repr", pattern("{op: Log, inputs: ['" + "x" * 5000 + "']}"), 5, "pattern.inputs[0]: expected", False),
    # an id or a name with a trailing newline (a YAML block scalar): $ would have accepted it
    ("id-trailing-newline", "id: |\n  US123\nname: r\nseverity: warning\nsummary: s\nsites: [norm]\n"
     "condition: has_eps\nmessage: m\nfix: f\n", 1, "'id' must look like PA101", False),
    ("name-trailing-newline", "id: US123\nname: |\n  my-rule\nseverity: warning\nsummary: s\nsites: [norm]\n"
     "condition: has_eps\nmessage: m\nfix: f\n", 2, "'name'", False),
    # a file that holds nothing
    ("empty-file", "", 1, "holds no rule", False),
    ("comments-only", "# nothing here\n", 1, "holds no rule", False),
]
HEAVY = [c for c in CASES if c[4]]


@contextlib.contextmanager
def guarded(seconds: int = 30, headroom: int = GiB):
    """Fail (inside main, as an exception it reports) instead of hanging or taking the machine's memory."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as fh:
        used = int(fh.read().split()[0]) * resource.getpagesize()
    limit = used + headroom if hard == resource.RLIM_INFINITY else min(used + headroom, hard)

    def timeout(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, timeout)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.signal(signal.SIGALRM, previous)


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err[:2000]
    assert "Traceback" not in err and "internal error" not in err
    return lines[0]


def expect(line: str, file: str, lineno: int | None, problem: str) -> None:
    where = f"precaudit: {file}:{lineno}: " if lineno else f"precaudit: {file}: "
    assert line.startswith(where), line[:500]
    assert problem in line, line[:500]
    assert len(line) < 1000, line[:500]


@pytest.mark.parametrize("case,text,lineno,problem,heavy", CASES, ids=[c[0] for c in CASES])
def test_bad_rule_file_is_one_line_naming_file_and_line(case, text, lineno, problem, heavy, tmp_path, capsys):
    rule = tmp_path / "rule.yaml"
    rule.write_text(text)
    with guarded():
        code = main([MODEL, "--rules", str(rule), "-o", str(tmp_path / "report.txt")])
    assert code == 2
    expect(one_line(capsys), str(rule), lineno, problem)


@pytest.mark.parametrize("command", ["rules", "explain", "match"])
def test_every_command_that_loads_rules_refuses_the_same_way(command, tmp_path, capsys):
    rule = tmp_path / "rule.yaml"
    rule.write_text(cond("'x' * 3000000000 == eps_role"))
    args = {"rules": ["rules"], "explain": ["explain", "PA101"], "match": ["match", "PA101", MODEL]}[command]
    with guarded():
        assert main([*args, "--rules", str(rule)]) == 2
    expect(one_line(capsys), str(rule), 6, "makes more than 1000 items")


def test_match_reports_a_condition_that_fails_at_run_time(tmp_path, capsys):
    rule = tmp_path / "rule.yaml"
    rule.write_text(HEAD + "sites: [norm]\nparams: {s: abc}\ncondition: eps < s\nmessage: m\nfix: f\n")
    with guarded():
        assert main(["match", "ORG001", MODEL, "--rules", str(rule)]) == 2
    expect(one_line(capsys), str(rule), 7, "condition cannot be computed")


_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
from precaudit.cli import main
code = main(sys.argv[2:])
# VmHWM is this process's own peak; ru_maxrss would include the forked parent's memory from before exec
peak = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:"))
sys.stderr.write(f"peak-rss-kib {peak}\\n")
sys.exit(code)
"""


def run_child(args: list[str], timeout: float = 120) -> tuple[int, list[str], float, float]:
    """Exit code, stderr lines (without the peak line), peak RSS in MiB and seconds of a child limited to 1 GiB."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(GiB), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL)
    seconds = time.monotonic() - start
    lines = proc.stderr.splitlines()
    peak = [line for line in lines if line.startswith("peak-rss-kib ")]
    rss = int(peak[0].split()[1]) / 1024 if peak else math.nan
    return proc.returncode, [line for line in lines if not line.startswith("peak-rss-kib ")], rss, seconds


@pytest.mark.parametrize("case,text,lineno,problem,heavy", HEAVY, ids=[c[0] for c in HEAVY])
def test_hostile_rule_file_is_refused_in_bounded_memory_and_time(case, text, lineno, problem, heavy, tmp_path):
    rule = tmp_path / "rule.yaml"
    rule.write_text(text)
    code, lines, rss, seconds = run_child([MODEL, "--rules", str(rule), "-o", str(tmp_path / "report.txt")])
    assert code == 2 and len(lines) == 1, lines[:5]
    expect(lines[0], str(rule), lineno, problem)
    assert rss < 600, f"peak RSS {rss:.0f} MiB"  # a plain audit of the example model peaks near 60 MiB
    assert seconds < 60


# ---------------------------------------------------------------- files that are not rule files


def _fifo(tmp_path: Path) -> tuple[str, str]:
    path = tmp_path / "rules.yaml"
    os.mkfifo(path)
    return str(path), str(path)


def _folder_with(target: str):
    def make(tmp_path: Path) -> tuple[str, str]:
        folder = tmp_path / "rules"
        folder.mkdir()
        (folder / "a-good.yaml").write_text(HEAD + BODY)
        os.symlink(target, folder / "b.yaml")
        return str(folder), str(folder / "b.yaml")
    return make


def _folder_with_fifo(tmp_path: Path) -> tuple[str, str]:
    folder = tmp_path / "rules"
    folder.mkdir()
    os.mkfifo(folder / "pipe.yml")
    return str(folder), str(folder / "pipe.yml")


def _folder_with_folder(tmp_path: Path) -> tuple[str, str]:
    folder = tmp_path / "rules"
    (folder / "sub.yaml").mkdir(parents=True)
    return str(folder), str(folder / "sub.yaml")


def _empty_folder(tmp_path: Path) -> tuple[str, str]:
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "notes.txt").write_text("not a rule\n")
    return str(folder), str(folder)


def _not_utf8(tmp_path: Path) -> tuple[str, str]:
    path = tmp_path / "latin1.yaml"
    path.write_bytes((HEAD + BODY).encode() + "description: caf\u00e9\n".encode("latin-1"))
    return str(path), str(path)


def _too_big(tmp_path: Path) -> tuple[str, str]:
    path = tmp_path / "big.yaml"
    path.write_text(HEAD + BODY + "description: " + "a" * loader.RULE_FILE_LIMIT + "\n")
    return str(path), str(path)


def _missing(tmp_path: Path) -> tuple[str, str]:
    return str(tmp_path / "missing.yaml"), str(tmp_path / "missing.yaml")


def _dev(name: str):
    def make(tmp_path: Path) -> tuple[str, str]:
        return name, name
    return make


FILES = [
    ("dev-null", _dev("/dev/null"), None, "is a device, not a regular file"),
    ("dev-zero", _dev("/dev/zero"), None, "is a device, not a regular file"),
    ("fifo", _fifo, None, "is a FIFO (named pipe), not a regular file"),
    ("folder-with-link-to-dev-zero", _folder_with("/dev/zero"), None, "is a device, not a regular file"),
    ("folder-with-link-to-dev-null", _folder_with("/dev/null"), None, "is a device, not a regular file"),
    ("folder-with-fifo", _folder_with_fifo, None, "is a FIFO (named pipe), not a regular file"),
    ("folder-with-folder", _folder_with_folder, None, "is a directory, not a regular file"),
    ("folder-without-rules", _empty_folder, None, "holds no rule file (*.yaml or *.yml)"),
    ("not-utf8", _not_utf8, 9, "is not UTF-8 text (byte 0xe9)"),
    ("larger-than-1-MiB", _too_big, None, "rule file is larger than 1 MiB"),
    ("missing", _missing, None, "no such rule file or folder"),
]


@pytest.mark.parametrize("case,make,lineno,problem", FILES, ids=[f[0] for f in FILES])
def test_a_path_that_is_not_a_rule_file_is_one_line_naming_it(case, make, lineno, problem, tmp_path, capsys):
    given, shown = make(tmp_path)
    with guarded(seconds=20):
        code = main([MODEL, "--rules", given, "-o", str(tmp_path / "report.txt")])
    assert code == 2
    expect(one_line(capsys), shown, lineno, problem)
    with guarded(seconds=20):
        assert main(["rules", "--rules", given]) == 2
    expect(one_line(capsys), shown, lineno, problem)


@pytest.mark.parametrize("case,make", [("fifo", _fifo), ("folder-with-fifo", _folder_with_fifo),
                                       ("folder-with-link-to-dev-zero", _folder_with("/dev/zero"))],
                         ids=["fifo", "folder-with-fifo", "folder-with-link-to-dev-zero"])
def test_a_fifo_or_device_never_blocks_a_child_process(case, make, tmp_path):
    given, shown = make(tmp_path)
    code, lines, _rss, _seconds = run_child(["rules", "--rules", given], timeout=60)
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"precaudit: {shown}: "), lines[:5]


def test_too_many_rule_files(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loader, "MAX_RULE_FILES", 5)
    folder = tmp_path / "rules"
    folder.mkdir()
    for i in range(6):
        (folder / f"r{i}.yaml").write_text("")
    assert main(["rules", "--rules", str(folder)]) == 2
    line = one_line(capsys)
    assert line.startswith(f"precaudit: {folder}{os.sep}r") and "more than 5 rule files in all" in line


def test_too_many_rule_bytes(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(loader, "MAX_RULE_BYTES", 1200)  # each file is about 530 bytes
    folder = tmp_path / "rules"
    folder.mkdir()
    for i in range(3):
        rule = (HEAD + BODY).replace("ORG001", f"ORG00{i}").replace("org-rule", f"org-rule-{i}")
        (folder / f"r{i}.yaml").write_text(rule + "description: " + "a" * 400 + "\n")
    assert main(["rules", "--rules", str(folder)]) == 2
    assert one_line(capsys) == f"precaudit: {folder / 'r2.yaml'}: the rule files hold more than 1200 bytes in all; " \
                               "precaudit reads no more"


def test_the_bounds_leave_the_shipped_rules_and_a_plain_user_rule_alone(tmp_path, capsys):
    rule = tmp_path / "rule.yaml"
    rule.write_text(HEAD + "sites: norm\nops: LayerNormalization\nparams: {floor: 1.0e-3, label: x}\n"
                    "condition: \"has_eps and eps < floor and 'ab' * 3 == 'ababab' and -(-eps) == eps\"\n"
                    "message: '{label}: eps {eps:>12.3g} below {floor:.0e} ({eps_role})'\nfix: f\n")
    assert main([MODEL, "--rules", str(rule), "--select", "ORG001", "-o", str(tmp_path / "r.txt")]) == 1
    assert capsys.readouterr().err == ""
    assert "x: eps        1e-12 below 1e-03 (eps)" in (tmp_path / "r.txt").read_text()


# ---------------------------------------------------------------- the evaluator and the formatter directly


@pytest.mark.parametrize("text,env,expected", [
    ("10 ** 10 ** 10 > 1e308", {}, True),             # floats: overflows to inf at once
    ("x ** x > 0", {"x": 10 ** 300}, True),
    ("x * x * x * x * x * x * x * x > 0", {"x": 1 << 100000}, True),  # wider than 1024 bits: computed as inf
    ("x - x != 0", {"x": 1 << 5000}, True),            # inf - inf is nan: never a huge integer
    ("(0 - x) ** 0.5 != (0 - x) ** 0.5", {"x": 8.0}, True),  # a complex power is nan
    ("sqrt(x) != sqrt(x)", {"x": -1.0}, True),
    ("log10(x) < 0", {"x": 0.0}, True),
    ("'ab' * 500 == s", {"s": "ab" * 500}, True),      # exactly at the bound
])
def test_arithmetic_stays_small(text, env, expected):
    with guarded(seconds=10):
        assert parse_condition(text).evaluate(env) is expected


@pytest.mark.parametrize("text,env", [
    ("s * n == ''", {"s": "x", "n": 3_000_000_000}),
    ("n * s == ''", {"s": [0], "n": 400_000_000}),
    ("s % n == ''", {"s": "%2000000000d", "n": 1}),
    ("s + n == ''", {"s": "x", "n": 1}),
    ("-s == ''", {"s": "x"}),
    ("abs(s) > 0", {"s": "x"}),
])
def test_arithmetic_that_would_grow_is_refused_at_run_time(text, env):
    condition = parse_condition(text)
    with guarded(seconds=10), pytest.raises(ConditionError, match="cannot be computed"):
        condition.evaluate(env)


def test_render_leaves_an_unbounded_spec_as_written():
    with guarded(seconds=10):
        assert render("{eps:2000000000} {eps:.2000000000f} {eps:.3g}", {"eps": 1.0}) == \
            "{eps:2000000000} {eps:.2000000000f} 1"
        assert render("{eps:{x}}", {"eps": 1.0, "x": 5}) == "{eps:5}"  # one pass: never a nested format
        assert render("{n}", {"n": 1 << 20000}) == "(an integer of 20001 bits)"
