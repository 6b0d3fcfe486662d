"""docs/census.md is generated: its text is what its embedded data renders to, and model-supplied strings in it are
escaped. Nothing here runs the sweep (that is `architecture_sweep.py --census-check docs/census.md`)."""

import copy
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "census.md"


def _census():
    spec = importlib.util.spec_from_file_location("census", ROOT / "benchmarks" / "census.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


census = _census()


def _row(name: str) -> dict:
    clean = {"counts": {}, "sites": [], "errors": 0}
    return {"architecture": name, "family": "vision CNN", "exporter": "dynamo", "fp16": clean, "bf16": clean,
            "fp8-e4m3": clean, "trace": clean, "converters": {c: clean for c in census.CONVERTERS},
            "keep_list": {"kept": 0, "blocked": 0, "op_types": {}, "exit": 0},
            "fix": {"exit": 0, "written": False, "repairs": 0, "withheld": 0, "left": 0}}


def test_the_committed_page_is_what_its_data_renders_to():
    page = PAGE.read_text(encoding="utf-8")
    data = census.data_of(page)
    assert data["rows"] and {"versions", "commit", "machine", "scope", "seconds"} <= set(data["meta"])
    assert census.render(data) == page, "docs/census.md was edited by hand: regenerate it with --census"


def test_every_row_of_the_page_is_in_its_table():
    page = PAGE.read_text(encoding="utf-8")
    rows = census.data_of(page)["rows"]
    table = [line for line in page.splitlines() if line.startswith("| ") and not line.startswith("| architecture")]
    assert len(table) == len(rows)


def test_a_hostile_name_is_escaped():
    cell = census.escape_cell("a|b`<script>`\nx")
    assert "|" not in cell.replace("\\|", "") and "`" not in cell.replace("\\`", "")
    assert "<" not in cell and "\n" not in cell
    assert cell == "a\\|b\\`&lt;script&gt;\\` x"
    assert census.escape_cell("\x1b[96mstep\x1b[0m\x07") == "step?"  # an exporter's colours, a control character


def test_a_hostile_name_neither_breaks_the_table_nor_ends_the_data_comment():
    data = {"meta": {"versions": {"python": "3"}, "commit": "x", "machine": "m", "scope": "a subset", "seconds": 1,
                     "jobs": 1, "date": "d"},
            "rows": [_row("a|b`<script>`\n--> x")]}
    page = census.render(data)
    line = next(x for x in page.splitlines() if x.startswith("| a"))
    assert line.replace("\\|", "").count("|") == len(census.table([])[0].replace("\\|", "").split(" | ")) + 1
    assert "<script>" not in page and page.count("-->") == 1
    assert census.data_of(page) == data and census.renders_itself(page)


def test_a_converter_breaks_a_model_with_a_new_site_or_an_error():
    plain = {"counts": {"PA102": 1}, "sites": [["PA102", "n"]], "errors": 0}
    assert census.verdict_of_converter(plain, plain) == "keeps"
    assert census.verdict_of_converter(plain, {"counts": {}, "sites": [], "errors": 0}) == "keeps"
    assert census.verdict_of_converter(plain, {"sites": [["PA102", "n"], ["PA215", "m"]], "errors": 0}) == "breaks"
    assert census.verdict_of_converter(plain, {"sites": [["PA102", "n"]], "errors": 1}) == "breaks"
    assert census.verdict_of_converter(plain, {"failed": "crash"}) is None


def test_differences_name_the_row_that_changed():
    data = {"meta": {"versions": {"python": "3"}, "scope": "s"}, "rows": [_row("A"), _row("B")]}
    changed = copy.deepcopy(data)
    changed["rows"][1]["fp16"] = {"counts": {"PA101": 2}, "sites": [["PA101", "x"], ["PA101", "y"]], "errors": 2}
    changed["meta"]["seconds"] = 99  # the timing is not data
    assert census.differences(data, copy.deepcopy(data)) == []
    found = census.differences(data, changed)
    assert found[0] == "B dynamo:" and "PA101×2" in found[2] and len(found) == 3


def test_a_runtime_cell_is_its_verdict_in_errors_and_warnings():
    assert census.runtime_cell({"counts": {}, "sites": [], "errors": 0, "warnings": 0}) == "ok"
    assert census.runtime_cell({"counts": {"PA101": 5, "PA208": 5}, "errors": 5, "warnings": 5}) == \
        "5 errors, 5 warnings"
    assert census.runtime_cell({"counts": {"PA102": 1}, "errors": 0, "warnings": 1}) == "1 warning"
    assert census.runtime_cell({"error": "a|b"}) == "error: a\\|b" and census.runtime_cell(None) == "not run"
    row = _row("A")
    row["runtimes"] = {r: {"counts": {}, "sites": [], "errors": 0, "warnings": 0} for r in census.RUNTIMES}
    row["runtimes"]["tensorrt"] = {"counts": {"PA101": 2}, "sites": [], "errors": 2, "warnings": 0}
    line = census.table([row])[2]
    assert line.endswith("| ok | ok | 2 errors | ok | ok |")
    assert census.runtime_summary([row])[2:4] == [
        "- **ort-cpu**: 0 of 1 exports have an error or warning finding (0 an error)",
        "- **ort-cuda**: 0 of 1 exports have an error or warning finding (0 an error)"]
