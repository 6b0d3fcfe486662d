"""Which rules run and which findings count: --select / --ignore selectors, preview rules, per-model and per-node ignores."""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase
from pathlib import Path

from .errors import InputError
from .finding import Finding
from .options import shown
from .rules.loader import Rule

__all__ = ["active_rules", "check_selectors", "drop_ignored", "selects", "selects_exactly"]


def selects(selector: str, rule: Rule) -> bool:
    """A selector is ALL, a rule id, a rule name, or an id prefix (PA, PA1)."""
    code = selector.upper()
    return bool(code) and (code == "ALL" or selector == rule.name or rule.id.startswith(code))


def selects_exactly(selector: str, rule: Rule) -> bool:
    """Only an exact id or name turns on a preview rule without --preview."""
    return selector.upper() == rule.id or selector == rule.name


def check_selectors(selectors: Iterable[str], rules: list[Rule], file: str | None, key: str) -> None:
    """A selector that matches no rule is almost always a typo: refuse it rather than silently select nothing."""
    for selector in selectors:
        if not any(selects(selector, rule) for rule in rules):
            raise InputError(file, f"{key}: {shown(selector)} matches no rule id, name or id prefix (see `precaudit rules`)")


def active_rules(rules: list[Rule], select: list[str], ignore: list[str], preview: bool) -> list[Rule]:
    """The rules that run: selected (all by default), not ignored (--ignore wins), preview ones only when asked for."""
    chosen = []
    for rule in rules:
        if select and not any(selects(s, rule) for s in select):
            continue
        if any(selects(s, rule) for s in ignore):
            continue
        # A preview rule needs an explicit opt-in so that upgrading precaudit never breaks a CI gate.
        if rule.preview and not (preview or any(selects_exactly(s, rule) for s in select)):
            continue
        chosen.append(rule)
    return chosen


def drop_ignored(findings: list[Finding], rules: dict[str, Rule], per_model: dict[str, list[str]],
                 per_node: dict[str, list[str]], root: Path | None) -> list[Finding]:
    """Findings not covered by a per-model ignore (glob on the model path) or a per-node ignore (glob on node or scope)."""
    def ignored(f: Finding) -> bool:
        rule = rules[f.rule_id]
        model = _model_key(f.model, root)
        for pattern, selectors in per_model.items():
            if fnmatchcase(model, pattern) and any(selects(s, rule) for s in selectors):
                return True
        for pattern, selectors in per_node.items():
            if (fnmatchcase(f.node_name, pattern) or (f.scope and fnmatchcase(f.scope, pattern))) \
                    and any(selects(s, rule) for s in selectors):
                return True
        return False

    return [f for f in findings if not ignored(f)]


def _model_key(model: str, root: Path | None) -> str:
    """Model globs are written relative to the folder of the pyproject.toml that holds them."""
    if root is not None:
        try:
            return Path(model).resolve().relative_to(root).as_posix()
        except ValueError:
            pass
    return Path(model).as_posix()
