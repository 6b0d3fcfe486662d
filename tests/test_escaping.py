"""Names from a model cannot forge report lines: every format, as a user runs it.

A hostile model names its nodes, its eps initializer and its stack-trace source file with line breaks, terminal
escapes, XML-illegal control characters, a right-to-left override and GitHub workflow-command syntax. The text
report and the GitHub annotations keep one line per line they mean to write, the JUnit file parses, the JSON and
SARIF reports parse and carry the names, and every error on stderr is one line.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from xml.etree import ElementTree as ET

import jsonschema
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from precaudit.cli import main
from precaudit.errors import InputError
from precaudit.escape import ESCAPED, encodable, printable

FORGED = "\x1b[2J\n  error   PA000 FAKE"  # clears the terminal, then prints a finding line of its own
SCOPE = f"enc{FORGED}"
# the TorchScript exporter's /scope/op naming: the middle part becomes the finding's scope
NODE = f"/{SCOPE}/ln\r\x01\u202e%0A::error::x\n::warning::forged"
INIT = f"eps\nSECOND LINE{FORGED}\x01\u202e%0A::error::"
ADD = f"add{FORGED}"
SOURCE = f"/src/evil{FORGED},x:y.py"  # from the dynamo exporter's stack trace: the annotation's file property

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "precaudit/schemas/report.schema.json").read_text())


def _value(name: str):
    return h.make_tensor_value_info(name, T.FLOAT16, [2, 8])


def _const(name: str, value):
    return numpy_helper.from_array(np.asarray(value, dtype=np.float16), name)


def _hostile_model(eps_init: onnx.TensorProto | None = None) -> onnx.ModelProto:
    """A fused LayerNormalization with eps 1e-12 in fp16 (PA101), then a decomposed LayerNorm whose eps initializer
    rounded to 0.0 (PA106, whose message quotes the initializer's name; PA208)."""
    ln = h.make_node("LayerNormalization", ["x", "scale"], ["h0"], name=NODE, epsilon=1e-12, stash_type=0)
    ln.metadata_props.add(key="pkg.torch.onnx.stack_trace", value=f'File "{SOURCE}", line 7, in forward')
    nodes = [
        ln,
        h.make_node("ReduceMean", ["h0"], ["m"], name=f"mean{FORGED}", axes=[-1]),
        h.make_node("Sub", ["h0", "m"], ["d"], name="sub"),
        h.make_node("Pow", ["d", "two"], ["d2"], name="pow"),
        h.make_node("ReduceMean", ["d2"], ["v"], name="var", axes=[-1]),
        h.make_node("Add", ["v", INIT], ["ve"], name=ADD),
        h.make_node("Sqrt", ["ve"], ["s"], name="sqrt"),
        h.make_node("Div", ["d", "s"], ["y"], name="div"),
    ]
    inits = [_const("scale", np.ones(8)), _const("two", 2.0), eps_init or _const(INIT, 1e-12)]
    m = h.make_model(h.make_graph(nodes, "hostile", [_value("x")], [_value("y")], inits),
                     opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 10
    return m


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A repository holding the hostile model, entered as a user would."""
    (tmp_path / ".git").mkdir()
    m = _hostile_model()
    onnx.checker.check_model(m)
    onnx.save(m, str(tmp_path / "hostile.onnx"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(fmt: str, capsys, *args: str) -> tuple[int, str, str]:
    code = main(["hostile.onnx", "--format", fmt, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _json(repo: Path, fmt: str) -> dict:
    out = repo / f"report.{fmt}"
    assert main(["hostile.onnx", "--format", fmt, "-o", str(out)]) == 1
    return json.loads(out.read_text(encoding="utf-8"))


def _no_hostile_characters(text: str, allowed: str = "\n") -> None:
    """Nothing printable would escape, but the line breaks the format itself writes."""
    bad = {f"U+{ord(c):04X}" for c in text if ord(c) in ESCAPED and c not in allowed}
    assert not bad, bad


def test_text_report_has_its_lines_and_no_escape_bytes(repo, capsys):
    report = _json(repo, "json")
    code, out, err = _run("text", capsys)
    assert code == 1 and err == ""
    _no_hostile_characters(out)
    lines = out.splitlines()  # splits at every Unicode line break, not only \n
    assert lines == out.split("\n")[:-1]
    # the model header, per finding its head, message, "why" and fix lines, a blank line, the summary
    per_finding = [3 + bool(r["values"].get("compute_reason")) for r in report["results"]]
    assert len(report["results"]) == 3 and len(lines) == 1 + sum(per_finding) + 2
    heads = [line for line in lines if re.match(r"  (error|warning|info) ", line)]
    assert [h_.split()[1] for h_ in heads] == ["PA101", "PA106", "PA208"]  # no forged "PA000" finding
    assert lines[-1].startswith("Found 3 findings in 1 model")
    # the names are there, escaped: the scope, the source file, the node and the initializer
    assert printable(NODE) in heads[0] and f"in {printable(SCOPE)}" in heads[0]
    assert f"eps-underflow  {printable(SOURCE)}:7  node '" in heads[0]
    assert f"initializer '{printable(INIT)}'" in out and "eps\\nSECOND LINE\\x1b[2J\\n  error   PA000 FAKE" in out


def test_text_report_in_color_paints_only_its_own_escapes(repo, capsys, monkeypatch):
    from precaudit.cli import output

    monkeypatch.setattr(output, "color_ok", lambda no_color: True)  # as on a terminal
    code, out, _ = _run("text", capsys)
    escapes = set(re.findall(r"\x1b\[[0-9;]*m", out))
    assert code == 1 and escapes <= {"\x1b[0m", "\x1b[1m", "\x1b[31m", "\x1b[33m", "\x1b[36m"}
    assert "\x1b[2J" not in out and len(re.sub(r"\x1b\[[0-9;]*m", "", out).splitlines()) == 15
    _no_hostile_characters(re.sub(r"\x1b\[[0-9;]*m", "", out))


def test_github_one_annotation_line_per_finding(repo, capsys):
    code, out, _ = _run("github", capsys)
    lines = out.splitlines()
    assert code == 1 and lines == out.split("\n")[:-1]
    assert len(lines) == 4 and lines[-1].startswith("Found 3 findings")
    # every annotation: properties whose values hold no bare , or : then "::" and the message
    command = re.compile(r"^::(error|warning|notice) (?:[a-z]+=[^,:]*)(?:,[a-z]+=[^,:]*)*::[^\r\n]*$")
    assert all(command.match(line) for line in lines[:3]), lines
    assert [line.split()[0] for line in lines[:3]] == ["::error", "::error", "::warning"]
    _no_hostile_characters(out)
    first = lines[0]
    # the % of the name's own "%0A" is escaped, so GitHub shows it as the text %0A, not as a line break
    assert "%250A::error::x\\n::warning::forged" in first and "%0A" not in first.replace("%250A", "")
    assert first.startswith(f"::error file={printable(SOURCE).replace(',', '%2C').replace(':', '%3A')},line=7,")
    assert f"initializer '{printable(INIT).replace('%', '%25')}'" in lines[1]


def test_junit_parses_and_shows_the_escaped_names(repo, capsys):
    out = repo / "report.xml"
    assert main(["hostile.onnx", "--format", "junit", "-o", str(out)]) == 1
    root = ET.parse(out).getroot()
    failures = {case.get("name"): case.find("failure") for case in root.iter("testcase")
                if case.find("failure") is not None}
    assert sorted(failures) == ["PA101 eps-underflow", "PA106 eps-stored-as-zero", "PA208 statistic-overflow"]
    under = failures["PA101 eps-underflow"]
    assert printable(NODE) in under.get("message") and "\\x01\\u202e" in under.get("message")
    assert f"initializer '{printable(INIT)}'" in failures["PA106 eps-stored-as-zero"].text
    _no_hostile_characters(out.read_text(encoding="utf-8"))


def test_json_carries_the_names_raw(repo):
    report = _json(repo, "json")
    jsonschema.Draft7Validator(SCHEMA).validate(report)
    under, zero, _ = report["results"]
    # the ONNX loader escapes node names itself today (frontends/onnx.py _printable); without it they are raw
    assert under["node_name"] in (NODE, printable(NODE))
    assert under["scope"] == SCOPE and under["source_file"] == SOURCE and under["source_line"] == 7
    assert f"initializer '{INIT}'" in zero["message"]


def test_sarif_carries_the_names_and_escapes_its_messages(repo):
    log = _json(repo, "sarif")
    under, zero, _ = log["runs"][0]["results"]
    logical = under["locations"][0]["logicalLocations"][0]
    assert logical["name"] in (NODE, printable(NODE)) and logical["fullyQualifiedName"].startswith(SCOPE + "/")
    # message texts are what viewers show: escaped as in the text report, so they read the same
    assert f"initializer '{printable(INIT)}'" in zero["message"]["text"]
    assert all(printable(r["message"]["text"]) == r["message"]["text"] for r in log["runs"][0]["results"])


def _external_eps(location: str) -> onnx.TensorProto:
    init = _const(INIT, 1e-12)
    init.ClearField("raw_data")
    init.data_location = T.EXTERNAL
    for key, value in {"location": location, "offset": "0", "length": "2"}.items():
        init.external_data.add(key=key, value=value)
    return init


@pytest.mark.parametrize("fmt", ["text", "github", "junit", "json", "sarif"])
def test_error_quoting_a_hostile_name_is_one_stderr_line(tmp_path, monkeypatch, capsys, fmt):
    """The external-data error names the initializer (and quotes the path) in every format's run."""
    monkeypatch.chdir(tmp_path)
    onnx.save(_hostile_model(_external_eps(f"../{FORGED}.bin")), str(tmp_path / "broken.onnx"))
    out = tmp_path / "report.out"
    assert main(["broken.onnx", "--format", fmt, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err.splitlines()) == 1 and err.startswith("precaudit: broken.onnx: ")
    _no_hostile_characters(err)
    assert printable(INIT) in err
    report = out.read_text(encoding="utf-8")
    if fmt == "junit":
        assert ET.fromstring(report.encode()).find("testsuite/testcase/error") is not None
    elif fmt in ("json", "sarif"):
        json.loads(report)
    else:
        _no_hostile_characters(report)


@pytest.mark.parametrize("name", ["missing.onnx", "garbage.onnx"])
def test_a_typed_path_with_a_newline_is_one_stderr_line(tmp_path, monkeypatch, capsys, name):
    folder = tmp_path / "dir\n  error   PA000 FAKE\x1b[2J"
    folder.mkdir()
    (folder / "garbage.onnx").write_bytes(b"\x08\x01\x12\xff not protobuf")
    monkeypatch.chdir(tmp_path)
    assert main([f"{folder.name}/{name}", "--format", "github"]) == 2
    captured = capsys.readouterr()
    assert len(captured.err.splitlines()) == 1
    assert captured.err.startswith("precaudit: dir\\n  error   PA000 FAKE\\x1b[2J/")
    _no_hostile_characters(captured.err)
    lines = captured.out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("::error file=dir\\n  error   PA000 FAKE\\x1b[2J/")


def test_a_model_in_a_folder_with_a_newline_reports_one_line_per_line(repo, capsys):
    folder = repo / "a\nb"
    folder.mkdir()
    (repo / "hostile.onnx").rename(folder / "m.onnx")
    assert main(["a\nb/m.onnx"]) == 1
    out = capsys.readouterr().out
    _no_hostile_characters(out)
    assert out.splitlines()[0] == "a\\nb/m.onnx  (--dtype fp16)" and len(out.splitlines()) == 15


@pytest.mark.skipif(os.name == "nt", reason="POSIX file names are bytes; Windows names are always Unicode")
def test_a_path_that_is_not_utf8_still_reports(repo, capsys):
    """sys.argv holds such a path with a lone surrogate: text and XML escape it, JSON writes it as visible text."""
    name = os.fsdecode(b"m\xff.onnx")
    assert name == "m\udcff.onnx"
    (repo / "hostile.onnx").rename(repo / name)
    assert main([name]) == 1
    assert capsys.readouterr().out.startswith("m\\udcff.onnx  (--dtype fp16)")
    for fmt in ("json", "sarif", "junit", "github"):
        out = repo / f"report.{fmt}"
        assert main([name, "--format", fmt, "-o", str(out)]) == 1
        text = out.read_text(encoding="utf-8")
        assert "\\udcff" in text and "\udcff" not in text
        if fmt == "json":
            report = json.loads(text)
            assert report["models"] == ["m\\udcff.onnx"] and len(report["results"][0]["fingerprint"]) == 16
        elif fmt == "sarif":
            json.loads(text)
        elif fmt == "junit":
            ET.fromstring(text.encode())


def test_stale_baseline_entries_are_escaped(repo, capsys):
    entry = {"fingerprint": "0" * 16, "rule_id": "PA101", "model": "hostile.onnx", "node_name": f"gone{FORGED}",
             "message": "m"}
    (repo / "baseline.json").write_text(json.dumps({"format": "precaudit-baseline/1", "tool_version": "0",
                                                    "findings": [entry]}))
    main(["hostile.onnx", "--baseline", "baseline.json"])
    out = capsys.readouterr().out
    _no_hostile_characters(out)
    assert "node 'gone\\x1b[2J\\n  error   PA000 FAKE' no longer found" in out


# The escaping itself.

def test_printable_escapes_each_hostile_character_visibly():
    assert printable("a\nb\rc\td") == "a\\nb\\rc\\td"
    assert printable("\x00\x01\x1b\x7f\x85\x9b") == "\\x00\\x01\\x1b\\x7f\\x85\\x9b"
    bidi_and_breaks = "\u2028\u2029\u202e\u2066\u2069\u200f\u061c"
    assert printable(bidi_and_breaks) == "\\u2028\\u2029\\u202e\\u2066\\u2069\\u200f\\u061c"
    assert printable("\ud800\udcff\ufffe") == "\\ud800\\udcff\\ufffe"


def test_printable_keeps_ordinary_text_and_backslashes():
    ordinary = ["/encoder/layer.0/LayerNorm", "C:\\models\\m.onnx", "名前 é ß 😀 ́", "%0A ::error:: a,b:c", "a\\x1bb"]
    for text in ordinary:
        assert printable(text) == text


def test_printable_is_idempotent_ascii_for_escapes_and_legal_xml():
    every = "".join(chr(c) for c in range(0x10000)) + "\U0001f600\U0010ffff"
    once = printable(every)
    assert printable(once) == once
    assert all(ord(c) < 0x80 for c in printable("".join(chr(c) for c in sorted(ESCAPED))))
    once.encode("utf-8")  # no surrogate survives
    xml_char = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
    assert not xml_char.search(once)
    element = ET.Element("a", b=once)
    element.text = once
    parsed = ET.fromstring(ET.tostring(element, encoding="utf-8"))
    assert parsed.get("b") == once and parsed.text == once


def test_encodable_escapes_only_lone_surrogates():
    assert encodable("a\nb\x1b\u202e") == "a\nb\x1b\u202e"
    assert encodable("m\udcff.onnx") == "m\\udcff.onnx"


def test_input_error_is_one_line_and_keeps_its_raw_parts():
    exc = InputError(f"dir\n{FORGED}/m.onnx", f"initializer '{INIT}': external data path leaves the model's folder", 3)
    text = str(exc)
    assert "\n" not in text and "\x1b" not in text and "\u202e" not in text
    assert text.startswith("dir\\n\\x1b[2J\\n  error   PA000 FAKE/m.onnx:3: initializer 'eps\\nSECOND LINE")
    assert exc.file.startswith("dir\n") and INIT in exc.problem  # JSON carries them raw


def test_exact_regex_matches_its_name_and_no_other():
    """The regexes keep-list writes for modelopt and torch_tensorrt (nodes_to_exclude): each one, parsed back,
    matches exactly its node among decoys: a trailing newline ($ would take it), a control character and the text
    of its escape, metacharacters, a backslash, line separators; and holds no character that cannot print."""
    from precaudit.escape import ESCAPED, exact_regex

    names = ["a", "a\n", "a\x00b", "a\\x00b", "a\\\x00b", "x.y", "xzy", "x+y", "[0]*", "\\", "é\u2028", "é",
             "tab\tname", "tab\\tname", "a\x1b[31m", "\u202egnp.exe", "a b"]
    for name in names:
        regex = exact_regex(name)
        assert [n for n in names if re.match(regex, n)] == [name], (name, regex)
        assert [n for n in names if re.search(regex, n)] == [name], (name, regex)
        assert not any(ord(c) in ESCAPED for c in regex), regex


@pytest.mark.skipif(os.name == "nt", reason="POSIX file names are bytes; Windows names are always Unicode")
def test_a_baseline_for_a_path_that_is_not_utf8_is_strict_json_and_still_matches(repo, capsys):
    name = os.fsdecode(b"m\xff.onnx")
    (repo / "hostile.onnx").rename(repo / name)
    assert main([name, "--write-baseline", "baseline.json"]) == 0
    raw = (repo / "baseline.json").read_bytes()
    raw.decode("utf-8")  # strict UTF-8: no lone surrogate in the file
    assert b"\\\\udcff" in raw and b'"\\udcff' not in raw  # visible text, not a JSON escape strict parsers reject
    assert {e["model"] for e in json.loads(raw)["findings"]} == {"m\\udcff.onnx"}
    capsys.readouterr()
    assert main([name, "--baseline", "baseline.json"]) == 0  # every finding still matched
    assert "no longer found" not in capsys.readouterr().out
