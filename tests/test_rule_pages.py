"""docs/rules/: a page per rule and the index, generated from the rule files; the committed pages are current; a
stranger's rule renders on the site as text (checked with Python-Markdown as mkdocs runs it); the pages are written
over no file the run read."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import markdown
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from precaudit.cli import main
from precaudit.escape import printable
from precaudit.report.rule_pages import rule_page, rule_pages
from precaudit.rules.loader import load_rules

DOCS = Path(__file__).resolve().parent.parent / "docs" / "rules"


def test_the_committed_rule_pages_are_what_the_rules_generate():
    """Regenerate with: precaudit rules --write-pages docs/rules"""
    expected = rule_pages(load_rules([]))
    committed = {p.name: p.read_text() for p in DOCS.iterdir() if p.is_file()}
    assert sorted(committed) == sorted(expected)  # a page per rule, and no page for a rule that is gone
    stale = [name for name, text in expected.items() if committed[name] != text]
    assert stale == [], f"stale pages (precaudit rules --write-pages docs/rules): {stale}"


def test_every_rule_has_its_row_and_its_sections():
    rules = load_rules([])
    index = rule_pages(rules)["index.md"]
    for rule in rules:
        assert f"| [{rule.id}]({rule.id}-{rule.name}.md) | {rule.name} | {rule.severity} |" in index
    page = rule_pages(rules)["PA101-eps-underflow.md"]
    assert page.startswith("# PA101 eps-underflow\n\n**error**, on by default · applies to `norm` sites")
    for section in ("## What it checks", "## Example", "## Message", "## Fix", "## `precaudit fix`", "## Condition"):
        assert f"\n{section}\n" in page


def test_a_strangers_rule_cannot_inject_html_or_close_its_code_block(tmp_path, capsys):
    rule = tmp_path / "r.yaml"
    rule.write_text("id: US101\nname: hostile\nseverity: warning\nsummary: 'a <script>alert(1)</script> | b'\n"
                    "sites: [norm]\ncondition: has_eps\nmessage: m\nfix: '<img src=x onerror=alert(1)>'\n"
                    "example: |\n  ```\n  </code><script>x</script>\n")
    out = tmp_path / "pages"
    out.mkdir()
    assert main(["rules", "--rules", str(rule), "--write-pages", str(out)]) == 0
    page = (out / "US101-hostile.md").read_text()
    assert "<script>" not in page.replace("````text\n```\n</code><script>x</script>\n````", "") and "<img" not in page
    assert "a &lt;script&gt;alert(1)&lt;/script&gt; \\| b" in page
    assert "````text\n```\n</code><script>x</script>\n````" in page  # in a fence the example's ``` cannot close
    assert "| [US101](US101-hostile.md) | hostile | warning | on | no | a &lt;script&gt;alert(1)&lt;/script&gt; \\| b |" \
        in (out / "index.md").read_text()
    assert main(["rules", "--write-pages", str(tmp_path / "missing")]) == 2
    assert "--write-pages: no such folder" in capsys.readouterr().err


def test_every_shipped_rule_validates_against_the_published_schema():
    """docs/rules/rule-schema.json, made from the loader's keys, severities, site kinds and repair kinds: every
    shipped rule file validates, and what the loader refuses for its shape does not."""
    import jsonschema

    schema = json.loads((DOCS / "rule-schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    files = sorted((DOCS.parent.parent / "rules").glob("*.yaml"))
    assert len(files) == len(load_rules([]))
    for path in files:
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
        assert errors == [], (path.name, errors)
    good = yaml.safe_load(files[0].read_text())
    example = {"model": "examples/fire.onnx", "args": ["--dtype", "bf16"], "fires": ["ln"]}
    assert validator.is_valid({**good, "tests": [example, {"model": "quiet.onnx", "fires": []}]})
    for bad in ({**good, "severity": "fatal"}, {**good, "id": "PA101\n"}, {**good, "colour": "red"},
                {**good, "sites": ["nowhere"]}, {**good, "repair": "rewrite-everything"},
                {k: v for k, v in good.items() if k != "fix"},
                {**good, "tests": example}, {**good, "tests": [{**example, "colour": "red"}]},
                {**good, "tests": [{"model": "fire.onnx"}]}, {**good, "tests": [{**example, "model": "/abs.onnx"}]},
                {**good, "tests": [{**example, "model": "fire.pt2"}]}, {**good, "tests": [{**example, "fires": "ln"}]},
                {**good, "tests": [{**example, "args": "--dtype bf16"}]}):
        assert not validator.is_valid(bad), bad


# What `mkdocs build` (1.6) adds to every site's Markdown, whatever mkdocs.yml says (mkdocs/config/defaults.py).
MKDOCS_BUILTIN_EXTENSIONS = ["toc", "tables", "fenced_code"]
ALLOWED_TAGS = {"p", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li", "code", "pre", "table", "thead", "tbody",
                "tr", "th", "td", "a", "em", "strong", "blockquote", "hr", "br"}
BLOCK_TAGS = {"h1", "h2", "h3", "h4", "h5", "h6", "pre", "ul", "ol", "li", "table", "tr", "blockquote", "hr"}
TEXT_TAGS = {"p", "li", "td", "th", "pre", "h1", "h2", "h3", "h4", "h5", "h6"}
# Each is put in every field of a rule that reaches its page, with what its prose shows (None: the text as written).
HOSTILE = {
    "img-onerror": ("<img src=x onerror=alert(1)>", None),
    "script": ("<script>alert(1)</script>", None),
    "javascript-link": ("[a](javascript:alert(1))", None),
    "remote-image": ("![x](https://evil.example/x.png)", None),
    "javascript-autolink": ("<javascript:alert(1)>", None),
    "https-autolink": ("<https://evil.example>", None),
    "url-schemes": ("javascript:alert(1) data:text/html,<script>alert(1)</script> vbscript:msgbox(1)", None),
    "reference-link": ("[a][x] [TOC]\n[x]: javascript:alert(1)", None),
    "entities": ("&lt;script&gt;alert(1)&lt;/script&gt; &#60;img src=x onerror=alert(1)&#62; &amp;", None),
    "backtick-run": ("````````````\n<img src=x onerror=alert(1)> \\", None),
    "code-span": ("``` </code><img src=x onerror=alert(1)> ```", "</code><img src=x onerror=alert(1)>"),
    "table-pipes": ("a | b | <img src=x onerror=alert(1)> |\n|---|---|", None),
    "block-syntax": ("ok\n# heading\n- item\n* item\n1. item\n> quote\n---\n===\n~~~\n```\n\n"
                     "    indented <b>x</b>\n<div onclick=alert(1)>x</div>\n\n~~~", None),
}
HOSTILE_FILE = "a\n# ``` <svg onload=alert(1)>.yaml"


def site_html(page: str) -> str:
    """The page as `mkdocs build` converts it: mkdocs' own extensions and mkdocs.yml's markdown_extensions."""
    extensions, configs = list(MKDOCS_BUILTIN_EXTENSIONS), {}
    for item in yaml.safe_load((DOCS.parent.parent / "mkdocs.yml").read_text()).get("markdown_extensions") or []:
        name, config = next(iter(item.items())) if isinstance(item, dict) else (item, None)
        extensions.append(name)
        configs[name] = config or {}
    return markdown.Markdown(extensions=extensions, extension_configs=configs).convert(page)


class Rendered(HTMLParser):
    """Every element of a rendered page with its attributes, and the text of each block (p, li, td, pre, ...)."""

    def __init__(self, page: str):
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.texts: list[tuple[str, str]] = []
        self._open: list[list[str]] = []
        self.feed(site_html(page))
        self.close()

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))
        if tag in TEXT_TAGS:
            self._open.append([tag])

    def handle_endtag(self, tag):
        if tag in TEXT_TAGS and self._open and self._open[-1][0] == tag:
            block = self._open.pop()
            self.texts.append((tag, " ".join("".join(block[1:]).split())))

    def handle_data(self, data):
        if self._open:
            self._open[-1].append(data)

    def section(self, heading: str) -> list[str]:
        """The texts of the blocks under a `## heading`."""
        start = self.texts.index(("h2", heading)) + 1
        end = next((i for i, (tag, _) in enumerate(self.texts) if i >= start and tag == "h2"), len(self.texts))
        return [text for _, text in self.texts[start:end]]


def one_line(text: str) -> str:
    return " ".join(text.split())


def check_markup(page: Rendered, hrefs: list[str]) -> None:
    """Only Markdown's own elements; no event handler, no src, and no link but the generator's."""
    assert {tag for tag, _ in page.elements} <= ALLOWED_TAGS
    assert [name for _, attrs in page.elements for name in attrs if name.startswith("on") or name == "src"] == []
    assert [attrs["href"] for tag, attrs in page.elements if "href" in attrs] == hrefs


def write_hostile_rule(folder: Path, text: str) -> Path:
    """A rule holding text in every field that reaches its page (JSON is YAML: the text goes in as it is)."""
    rule = {"id": "US101", "name": "hostile", "severity": "warning", "summary": text, "description": text,
            "example": text, "message": text, "fix": text, "repair": {"none": text}, "references": [text],
            "ops": [text], "params": {"note": text}, "sites": ["norm"], "condition": "has_eps"}
    path = folder / HOSTILE_FILE
    path.write_text(json.dumps(rule))
    return path


@pytest.mark.parametrize("case", HOSTILE)
def test_a_strangers_rule_renders_as_text_on_the_site(case, tmp_path):
    """Python-Markdown, as mkdocs runs it, makes nothing of a hostile rule but the page's own elements, and shows
    each field as its author wrote it."""
    text, prose = HOSTILE[case]
    prose = one_line(prose or text)
    rule = write_hostile_rule(tmp_path, text)
    out = tmp_path / "pages"
    out.mkdir()
    assert main(["rules", "--rules", str(rule), "--write-pages", str(out)]) == 0
    page = Rendered((out / "US101-hostile.md").read_text())
    check_markup(page, [])
    assert [t for tag, t in page.texts if tag in ("h1", "h2")] == [
        "US101 hostile", "What it checks", "Example", "Message", "Fix", "precaudit fix", "Condition", "Parameters",
        "References"]
    assert Counter(tag for tag, _ in page.elements if tag in BLOCK_TAGS) == \
        {"h1": 1, "h2": 8, "pre": 3, "table": 1, "tr": 2, "ul": 1, "li": 1}
    shown_file = printable(HOSTILE_FILE)
    assert page.texts[1] == ("p", f"warning, on by default · applies to norm sites of {one_line(printable(text))} · "
                                  "precaudit fix: no")
    assert page.texts[2] == ("p", prose)  # the summary
    assert one_line(" ".join(page.section("What it checks"))) == prose
    assert page.section("Example") == [one_line(text)] and page.section("Message") == [one_line(text)]
    assert one_line(" ".join(page.section("Fix"))) == prose
    assert one_line(" ".join(page.section("precaudit fix"))) == f"leaves it: {prose}"
    assert page.section("Parameters")[1:] == ["name", "default", "note", one_line(repr(text))]
    assert page.section("References") == [prose, f"Generated from {shown_file} by precaudit rules --write-pages."]

    index = Rendered((out / "index.md").read_text())
    pages = [f"{r.id}-{r.name}.md" for r in load_rules([str(rule)])]
    check_markup(index, ["rule-schema.json", *pages])
    row = [t for tag, t in index.texts if tag == "td"][-6:]
    assert row == ["US101", "hostile", "warning", "on", "no", one_line(text)]


# Markdown's and HTML's own characters, line breaks, and words that make up tags, links and fences.
PIECES = ["`", "``", "```", "~~~", "[", "]", "(", ")", "!", "<", ">", "&", "#", "-", "+", "*", "_", "=", "|", "\\", ":",
          "\n", "\n\n", " ", "    ", "\t", "\r", "1.", "a", "img src=x onerror=alert(1)", "javascript:alert(1)",
          "https://evil.example/x.png", "&lt;", "&#60;", "{", "}", "TOC", "---", "==="]


@settings(max_examples=150, derandomize=True, database=None, deadline=None)
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=40).map("".join).filter(str.strip))
def test_any_rule_text_makes_no_markup_but_inline_code_and_emphasis(text):
    """Whatever a rule's prose, names and parameters hold, its page keeps its sections and makes no element of its
    own but inline code and emphasis: no attribute, no link, no heading, list, quote, code block or table."""
    base = load_rules([])[0]
    rule = replace(base, summary=text.strip(), description=text.strip(), fix=text.strip(), no_repair=text.strip(),
                   repair=None, references=[text], ops=[text], params={"note": text}, example=text.strip(),
                   message=text.strip(), source=f"/rules/{text}.yaml")
    page = Rendered(rule_page(rule))
    check_markup(page, [])
    assert [t for tag, t in page.texts if tag in ("h1", "h2")] == [
        "PA101 eps-underflow", "What it checks", "Example", "Message", "Fix", "precaudit fix", "Condition",
        "Parameters", "References"]
    assert Counter(tag for tag, _ in page.elements if tag in BLOCK_TAGS) == \
        {"h1": 1, "h2": 8, "pre": 3, "table": 1, "tr": 2, "ul": 1, "li": 1}


RULE = "id: US101\nname: own-page\nseverity: warning\nsummary: s\nsites: [norm]\ncondition: has_eps\nmessage: m\nfix: f\n"


@pytest.mark.parametrize("name", ["index.md", "US101-own-page.md", "rule-schema.json"])
def test_pages_are_never_written_over_a_rule_file_the_run_reads(name, tmp_path, capsys):
    out = tmp_path / "pages"
    out.mkdir()
    rule = out / name
    rule.write_text(RULE)
    assert main(["rules", "--rules", str(rule), "--write-pages", str(out)]) == 2
    assert capsys.readouterr().err == f"precaudit: {rule}: refusing to write the rule page over one of the inputs\n"
    assert rule.read_text() == RULE and [p.name for p in out.iterdir()] == [name]  # no page written


def test_a_page_that_is_a_rule_file_of_a_rules_folder_by_another_name_is_refused(tmp_path, capsys):
    out = tmp_path / "pages"
    folder = out / "rules"
    folder.mkdir(parents=True)
    rule = folder / "US101-own-page.yaml"
    rule.write_text(RULE)
    os.link(rule, out / "index.md")  # the same file: writing the index would replace the rule the run read
    assert main(["rules", "--rules", str(folder), "--write-pages", str(out)]) == 2
    assert capsys.readouterr().err == \
        f"precaudit: {out / 'index.md'}: refusing to write the rule page over one of the inputs ({rule})\n"
    assert sorted(p.name for p in out.iterdir()) == ["index.md", "rules"]
    assert (out / "index.md").stat().st_ino == rule.stat().st_ino and rule.read_text() == RULE


@pytest.mark.parametrize("obstacle", ["symlink", "folder"])
def test_no_page_is_written_when_one_of_them_cannot_be(obstacle, tmp_path, capsys):
    out = tmp_path / "pages"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("mine")
    schema = out / "rule-schema.json"  # the last page written
    if obstacle == "symlink":
        schema.symlink_to(elsewhere)
    else:
        schema.mkdir()
    assert main(["rules", "--write-pages", str(out)]) == 2
    problem = "is a symlink: precaudit writes no output through one (it could point at an input)" \
        if obstacle == "symlink" else "is a directory: precaudit writes outputs over regular files only"
    assert capsys.readouterr().err == f"precaudit: {schema}: {problem}\n"
    assert [p.name for p in out.iterdir()] == ["rule-schema.json"] and elsewhere.read_text() == "mine"


def test_the_pages_folder_may_not_be_a_symlink(tmp_path, capsys):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert main(["rules", "--write-pages", str(tmp_path / "link")]) == 2
    assert capsys.readouterr().err == \
        f"precaudit: {tmp_path / 'link'}: --write-pages: is a symlink; precaudit writes pages into a real folder\n"
    assert list(real.iterdir()) == []


@pytest.mark.parametrize("key, value", [("name", "../../outside"), ("id", "../US101"), ("name", "a/b")])
def test_no_page_lands_outside_the_folder_whatever_a_rule_is_called(key, value, tmp_path):
    """Page names are made of the rule's id and name, which the loader allows only as PA101 and kebab-case."""
    rule = tmp_path / "r.yaml"
    rule.write_text(json.dumps({**yaml.safe_load(RULE), key: value}))
    out = tmp_path / "a" / "b" / "pages"
    out.mkdir(parents=True)
    assert main(["rules", "--rules", str(rule), "--write-pages", str(out)]) == 2
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == \
        ["a", "a/b", "a/b/pages", "r.yaml"]


@pytest.mark.parametrize("case", HOSTILE)
def test_a_strangers_rule_in_sarif_help_makes_no_markup(case, tmp_path):
    """Code scanning renders a rule's help.markdown: the same escaping as the pages, and no link at all from a
    reference that is not http(s)."""
    text, _ = HOSTILE[case]
    rule = write_hostile_rule(tmp_path, text)
    out = tmp_path / "r.sarif"
    model = DOCS.parent.parent / "examples" / "tiny_block_fp16.onnx"
    main([str(model), "--rules", str(rule), "--select", "US101", "-f", "sarif", "-o", str(out)])
    [help_md] = [r["help"]["markdown"] for r in json.loads(out.read_text())["runs"][0]["tool"]["driver"]["rules"]
                 if r["id"] == "US101"]
    check_markup(Rendered(help_md), [])  # no element but Markdown's own, no link, no src, no handler


def test_an_http_reference_in_sarif_help_is_a_link_and_others_are_text(tmp_path):
    rule = write_hostile_rule(tmp_path, "x")
    data = json.loads(rule.read_text())
    data["references"] = ["https://example.com/a_b", "javascript:alert(1)", "https://evil.example/<x>"]
    rule.write_text(json.dumps(data))
    out = tmp_path / "r.sarif"
    main([str(DOCS.parent.parent / "examples" / "tiny_block_fp16.onnx"), "--rules", str(rule), "--select", "US101", "-f", "sarif",
          "-o", str(out)])
    [help_md] = [r["help"]["markdown"] for r in json.loads(out.read_text())["runs"][0]["tool"]["driver"]["rules"]
                 if r["id"] == "US101"]
    check_markup(Rendered(help_md), ["https://example.com/a_b"])
