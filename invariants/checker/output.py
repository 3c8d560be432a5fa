"""Findings as text (`path:line:col: CODE message`), json, sarif 2.1.0, or GitHub annotations."""

from __future__ import annotations

import json
from collections.abc import Sequence

import mlx_invariants
from mlx_invariants.checker.rule import Finding, Rule  # Rule for typing only; rule.py imports no libcst

FORMATS = ("text", "json", "sarif", "github")
BUILTIN = {
    "INV000": ("unreadable-file", "The file cannot be read or parsed, so it was not checked."),
    "INV001": ("unused-suppression", "A suppression comment silences nothing on its statement."),
}


def render(findings: Sequence[Finding], fmt: str, rules: Sequence[type[Rule]]) -> str:
    if fmt == "json":
        return json.dumps([f.as_dict() for f in findings], indent=2) + "\n"
    if fmt == "sarif":
        return json.dumps(sarif(findings, rules), indent=2) + "\n"
    if fmt == "github":
        return "".join(_annotation(f) + "\n" for f in findings)
    return "".join(f"{f.path}:{f.line}:{f.col}: {f.rule} {f.message}\n" for f in findings)


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _annotation(f: Finding) -> str:
    props = f"file={_escape_property(f.path)},line={f.line},col={f.col},title={_escape_property(f.rule)}"
    return f"::error {props}::{_escape_data(f.rule + ' ' + f.message)}"


def sarif(findings: Sequence[Finding], rules: Sequence[type[Rule]]) -> dict:
    """A SARIF 2.1.0 log GitHub code scanning accepts."""
    descriptors = [
        {
            "id": rule_id,
            "name": name,
            "shortDescription": {"text": summary},
            "fullDescription": {"text": summary},
            "defaultConfiguration": {"level": "error" if rule_id == "INV000" else "warning"},
        }
        for rule_id, (name, summary) in BUILTIN.items()
    ]
    descriptors += [
        {
            "id": rule.id,
            "name": rule.name(),
            "shortDescription": {"text": rule.summary()},
            "fullDescription": {"text": rule.why()},
            "help": {"text": f"{rule.why()}\n\nKnown problems: {rule.known_problems}"},
            "defaultConfiguration": {"level": "error"},
        }
        for rule in rules
    ]
    index = {d["id"]: i for i, d in enumerate(descriptors)}
    results = [
        {
            "ruleId": f.rule,
            "ruleIndex": index.get(f.rule, 0),
            "level": "warning" if f.rule in ("INV000", "INV001") else "error",
            "message": {"text": f.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": f.path.replace("\\", "/"), "uriBaseId": "%SRCROOT%"},
                        "region": {"startLine": f.line, "startColumn": f.col},
                    }
                }
            ],
        }
        for f in findings
    ]
    return {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "invariants",
                        "version": mlx_invariants.__version__,
                        "informationUri": "https://github.com/mlx-invariants/mlx-invariants",
                        "rules": descriptors,
                    }
                },
                "columnKind": "unicodeCodePoints",
                "results": results,
            }
        ],
    }
