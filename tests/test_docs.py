"""The README stays short and its links lead somewhere; every docs page is in the site's nav. mkdocs build --strict
(in .ci/run) checks the pages' own links; this runs where mkdocs is not installed, and checks the README, which is
not part of the site."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target)


def relative_links(markdown: str) -> list[str]:
    """The targets of inline links that are neither URLs nor anchors on the same page, without their #anchor."""
    targets = [t for t in LINK.findall(markdown) if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]
    return [t.split("#", 1)[0] for t in targets]


def nav_pages(nav) -> set[str]:
    """Every page file a mkdocs nav names, at any depth (entries are `title: file` or `title: [entries]`)."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*map(nav_pages, nav)) if nav else set()
    if isinstance(nav, dict):
        return set().union(*map(nav_pages, nav.values())) if nav else set()
    return set()


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move the detail into docs/"


def test_every_relative_link_in_the_readme_exists():
    links = relative_links((ROOT / "README.md").read_text())
    assert "docs/index.md" in links  # the way into the documentation
    missing = [t for t in links if not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_every_docs_page_is_in_the_nav():
    """Rule pages are generated and reached from rules/index.md (mkdocs.yml's not_in_nav); every other page must be
    in the nav, or a reader of the site never finds it."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["docs_dir"] == "docs"
    listed = nav_pages(config["nav"])
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    rule_pages = {p for p in pages if re.fullmatch(r"rules/PA\d+-[a-z0-9-]+\.md", p)}
    assert not pages - rule_pages - listed, f"docs pages missing from mkdocs.yml's nav: {sorted(pages - rule_pages - listed)}"
    assert not listed - pages, f"mkdocs.yml's nav names pages that do not exist: {sorted(listed - pages)}"


def test_the_link_checks_can_fail():
    assert relative_links("[a](docs/nope.md#x) [b](https://x.org) [c](#here) [d](docs/cli.md)") == \
        ["docs/nope.md", "docs/cli.md"]
    assert nav_pages([{"A": "a.md"}, {"B": [{"C": "c.md"}, "d.md"]}]) == {"a.md", "c.md", "d.md"}
