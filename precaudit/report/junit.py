"""JUnit XML, for CI systems that show test reports: one test suite per model, one test case per rule.

A rule that found nothing in a model is a passing test case; a rule with findings is one failed case whose
text lists them all (JUnit readers expect at most one failure per case), so the report shows what was checked
as well as what failed. Models that could not be audited are errors.

Every string is escaped (escape.printable) as in the text report: XML 1.0 cannot carry most control characters
even as character references, so a \\x01 in a node name would otherwise make the whole file unreadable.
"""

from __future__ import annotations

from xml.etree import ElementTree as ET

from ..escape import printable
from .locations import full_message, node_phrase, shown
from .outcome import Outcome

__all__ = ["render_junit"]


def render_junit(outcome: Outcome) -> str:
    root = ET.Element("testsuites", name="precaudit")
    for model in outcome.result.models:
        findings = [f for f in outcome.result.findings if f.model == model]
        suite = ET.SubElement(root, "testsuite", name=printable(model))
        failures = 0
        for rule in outcome.rules:
            name = printable(f"{rule.id} {rule.name}")
            case = ET.SubElement(suite, "testcase", classname=printable(model), name=name)
            hits = [shown(f) for f in findings if f.rule_id == rule.id]
            if hits:
                failures += 1
                first = f"{hits[0].message} — {node_phrase(hits[0])}"
                summary = first if len(hits) == 1 else f"{len(hits)} findings; first: {first}"
                failure = ET.SubElement(case, "failure", type=rule.severity, message=summary)
                failure.text = "\n\n".join(full_message(f) for f in hits)
        suite.set("tests", str(len(outcome.rules)))
        suite.set("failures", str(failures))
        suite.set("errors", "0")
    for error in outcome.result.errors:
        name = printable(error.file or "precaudit")
        suite = ET.SubElement(root, "testsuite", name=name, tests="1", failures="0", errors="1")
        case = ET.SubElement(suite, "testcase", classname=name, name="load")
        ET.SubElement(case, "error", message=printable(error.problem)).text = str(error)  # str(): escaped already
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
