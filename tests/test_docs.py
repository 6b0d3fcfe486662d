"""The README stays short and its links lead somewhere; every docs page is in the site's nav. mkdocs build --strict
(in .ci/run) checks the pages' own links; this runs where mkdocs is not installed, and checks the README, which is
not part of the site."""

import re
from pathlib import Path

import pytest
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


def reference_directives(page: str) -> list[str]:
    """The objects a page renders from their docstrings: mkdocstrings' `::: dotted.path` lines."""
    return re.findall(r"^::: ([\w.]+)$", page, re.M)


def test_the_api_reference_renders_every_public_name_and_result_type():
    """Every name `import precaudit` offers, and the type each API function returns, is rendered from its docstring
    on the Python API page (__version__, a string, is named in its text)."""
    import inspect

    import precaudit
    from precaudit import api

    page = (ROOT / "docs" / "python-api.md").read_text()
    rendered = {path.rpartition(".")[2] for path in reference_directives(page)}
    assert {name for name in precaudit.__all__ if not name.startswith("__")} <= rendered
    assert "precaudit.__version__" in page
    returned = {inspect.signature(getattr(api, name)).return_annotation
                for name in ("audit", "keep_list", "fix", "train_audit")}
    assert returned == {"Report", "KeepList", "FixResult"} and returned <= rendered
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert any(isinstance(p, dict) and "mkdocstrings" in p for p in config["plugins"])


@pytest.mark.requires("mkdocs", "mkdocstrings")
def test_the_reference_is_built_from_the_docstrings(tmp_path):
    """mkdocs build --strict (as .ci/run builds the site): each directive became a section with its docstring."""
    import subprocess
    import sys

    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    html = (site / "python-api" / "index.html").read_text()
    for path in reference_directives((ROOT / "docs" / "python-api.md").read_text()):
        assert f'id="{path}"' in html, path
    assert "<code>precaudit train</code>: a factory spec" in html  # train_audit's docstring, rendered
    signature = signature_of(html, "precaudit.api.train_audit")
    assert signature.startswith("train_audit(model: Any, inputs: Any = None,") and signature.endswith(") -> Report")
    from precaudit.api import train_audit

    assert re.findall(r"[(,] (\*|\w+)", signature.replace("(", "( ", 1)) == parameter_names(train_audit)


def signature_of(html: str, path: str) -> str:
    """The signature rendered under an object's heading, as text on one line."""
    from html import unescape

    section = html[html.index(f'id="{path}"'):]
    block = re.search(r'<div class="doc-signature[^"]*">(.*?)</div>', section, re.S)
    assert block is not None, path
    text = re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", "", block[1]))).strip()
    return text.replace("( ", "(").replace(", )", ")")


def parameter_names(function) -> list[str]:
    """The names in the signature's order, with the * before the keyword-only ones."""
    import inspect

    names: list[str] = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind is parameter.KEYWORD_ONLY and "*" not in names:
            names.append("*")
        names.append(parameter.name)
    return names
