"""The runtime models as people and scripts read them: `precaudit runtimes` (text, JSON) and docs/runtimes.md."""

from __future__ import annotations

import json
from typing import Any

from . import RUNTIME_NAMES, runtime_classes
from .base import Fact, Runtime

__all__ = ["render_runtimes_json", "render_runtimes_text", "runtimes_page"]

_RUNS = {"onnx": "ONNX files", "torch": "PyTorch modules"}


def _doc(cls: type[Runtime]) -> str:
    """The module's docstring, one paragraph: what the runtime does and what it was read in."""
    import sys

    doc = sys.modules[cls.__module__].__doc__ or ""
    return " ".join(doc.split())


def _versions(fact: Fact) -> str:
    if fact.since and fact.until:
        return f"{fact.since} to before {fact.until}"
    if fact.since:
        return f"{fact.since} and later"
    if fact.until:
        return f"before {fact.until}"
    return "every modelled version"


def _record(cls: type[Runtime]) -> dict[str, Any]:
    return {"name": cls.name, "title": cls.title, "versions": list(cls.versions), "default": cls.versions[-1],
            "runs": list(cls.runs), "about": _doc(cls),
            "facts": [{"key": f.key, "says": f.says, "source": f.source, "how": f.how,
                       "since": f.since, "until": f.until} for f in cls.facts]}


def render_runtimes_json() -> str:
    classes = runtime_classes()
    return json.dumps({"schema_version": 1, "runtimes": [_record(classes[n]) for n in RUNTIME_NAMES]}, indent=2,
                      ensure_ascii=False) + "\n"


def render_runtimes_text() -> str:
    classes = runtime_classes()
    lines = []
    for name in RUNTIME_NAMES:
        cls = classes[name]
        runs = " and ".join(_RUNS[r] for r in cls.runs)
        lines.append(f"{name:<13} {cls.title}; versions {', '.join(cls.versions)} (default {cls.versions[-1]}); "
                     f"runs {runs}")
        for fact in cls.facts:
            lines.append(f"  {fact.key} ({_versions(fact)}, {fact.how}): {fact.says}")
            lines.append(f"      source: {fact.source}")
    return "\n".join(lines) + "\n"


def runtimes_page() -> str:
    """docs/runtimes.md: every runtime, its versions and each fact with where it was read or measured."""
    from ..report.markdown import cell, prose

    classes = runtime_classes()
    out = ["# Runtimes", "",
           "What each runtime really computes in, as `--runtime NAME[@VERSION]` models it. Every fact says where it "
           "was read (a source file, a pull request, an issue) or that it was measured on this project's machines "
           "(the tests measure it again where the runtime installs). Generated from `precaudit/runtime/` by "
           "`precaudit runtimes --write-page docs/runtimes.md`.", "",
           "| runtime | what | versions | runs |", "|---|---|---|---|"]
    out += [f"| [`{n}`](#{n}) | {cell(classes[n].title)} | {cell(', '.join(classes[n].versions))} | "
            f"{cell(' and '.join(_RUNS[r] for r in classes[n].runs))} |" for n in RUNTIME_NAMES]
    for name in RUNTIME_NAMES:
        cls = classes[name]
        out += ["", f"## {name}", "", prose(_doc(cls)), "",
                "| fact | holds in | how | source |", "|---|---|---|---|"]
        out += [f"| {cell(f.says)} | {cell(_versions(f))} | {f.how} | "
                f"{cell(f.source)} |" for f in cls.facts]
    return "\n".join(out) + "\n"
