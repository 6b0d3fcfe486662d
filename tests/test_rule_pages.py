"""docs/rules/: a page per rule and the index, generated from the rule files; the committed pages are current."""

from __future__ import annotations

from pathlib import Path

from precaudit.cli import main
from precaudit.report.rule_pages import rule_pages
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
    assert "a &lt;script&gt;alert(1)&lt;/script&gt; | b" in page
    assert "````text\n```\n</code><script>x</script>\n````" in page  # in a fence the example's ``` cannot close
    assert "| [US101](US101-hostile.md) | hostile | warning | on | no | a &lt;script&gt;alert(1)&lt;/script&gt; \\| b |" \
        in (out / "index.md").read_text()
    assert main(["rules", "--write-pages", str(tmp_path / "missing")]) == 2
    assert "--write-pages: no such folder" in capsys.readouterr().err


def test_every_shipped_rule_validates_against_the_published_schema():
    """docs/rules/rule-schema.json, made from the loader's keys, severities, site kinds and repair kinds: every
    shipped rule file validates, and what the loader refuses for its shape does not."""
    import json

    import jsonschema
    import yaml

    schema = json.loads((DOCS / "rule-schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    files = sorted((DOCS.parent.parent / "rules").glob("*.yaml"))
    assert len(files) == len(load_rules([]))
    for path in files:
        errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
        assert errors == [], (path.name, errors)
    good = yaml.safe_load(files[0].read_text())
    for bad in ({**good, "severity": "fatal"}, {**good, "id": "PA101\n"}, {**good, "colour": "red"},
                {**good, "sites": ["nowhere"]}, {**good, "repair": "rewrite-everything"},
                {k: v for k, v in good.items() if k != "fix"}):
        assert not validator.is_valid(bad), bad
