"""Rule documentation: the `precaudit rules` table and the `precaudit explain RULE` page."""

from __future__ import annotations

import json
import re

from ..escape import printable
from ..rules.loader import Rule

__all__ = ["placeholders", "render_explanation", "render_rule_json", "render_rule_table"]


def placeholders(template: str) -> str:
    """A message template with its {fact:.3g} fields shown as <fact>, for docs where no site fills them in."""
    return re.sub(r"\{(\w+)(?:[:!][^}]*)?\}", r"<\1>", template)


def default_state(rule: Rule) -> str:
    return "off (preview)" if rule.preview else "on"


def fixable(rule: Rule) -> str:
    """What `precaudit fix` does with the rule's findings: its repair kind, keep-list, or no."""
    if rule.repair:
        return rule.repair
    return "keep-list" if rule.keep_instead else "no"


def render_rule_table(rules: list[Rule]) -> str:
    """One line per rule: id, name, severity, on/off by default, what fix does, summary."""
    width = max((len(r.name) for r in rules), default=4)
    fix_width = max((len(fixable(r)) for r in rules), default=3)
    lines = [f"{'id':<6} {'name':<{width}}  {'severity':<8}  {'default':<13}  {'fix':<{fix_width}}  summary"]
    lines += [f"{r.id:<6} {r.name:<{width}}  {r.severity:<8}  {default_state(r):<13}  {fixable(r):<{fix_width}}  "
              f"{printable(' '.join(r.summary.split()))}" for r in rules]
    return "\n".join(lines) + "\n"


def render_rule_json(rules: list[Rule]) -> str:
    return json.dumps([{"id": r.id, "name": r.name, "severity": r.severity, "enabled_by_default": not r.preview,
                        "preview": r.preview, "summary": r.summary, "source": r.source,
                        "repair": r.repair, "no_repair": r.no_repair, "keep_fp32_instead": r.keep_instead}
                       for r in rules], indent=2) + "\n"


def render_explanation(rule: Rule) -> str:
    """Everything a user needs to act on a finding of this rule, with the worked example in numbers."""
    sections = [f"{rule.id} {rule.name}  ({rule.severity}, {default_state(rule)} by default)", rule.summary]
    if rule.description:
        sections.append(rule.description)
    if rule.example:
        sections.append("Example:\n" + _indent(rule.example))
    sections.append("Message:\n" + _indent(placeholders(rule.message)))
    sections.append("Fix:\n" + _indent(placeholders(rule.fix)))
    sections.append("precaudit fix:\n" + _indent(_repair_words(rule)))
    if rule.params:
        sections.append("Parameters (override with --rules):\n"
                        + "\n".join(f"  {k} = {v}" for k, v in rule.params.items()))
    if rule.references:
        sections.append("References:\n" + "\n".join(f"  {ref}" for ref in rule.references))
    sections.append(f"Defined in {rule.source}")
    # a rule file may be a stranger's: what a terminal would act on (escape sequences, bidi) shows escaped, line by line
    return "\n".join(printable(line) for line in "\n\n".join(sections).split("\n")) + "\n"


def _repair_words(rule: Rule) -> str:
    from ..repairs import REPAIR_KINDS

    if rule.repair:
        return f"repairs it ({rule.repair}): {REPAIR_KINDS[rule.repair]}"
    if rule.no_repair:
        return f"leaves it: {rule.no_repair}"
    return "has no repair for this rule"


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" if line else "" for line in text.splitlines())
