"""Findings as text (`path:line:col: CODE message`), json, sarif 2.1.0, or GitHub annotations."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

import mlx_invariants
from mlx_invariants.checker.rule import Finding, Rule  # Rule for typing only; rule.py imports no libcst

FORMATS = ("text", "json", "sarif", "github")
BUILTIN = {
    "INV000": ("unreadable-file", "The file or folder cannot be read or parsed, so it was not checked."),
    "INV001": ("unused-suppression", "A suppression comment silences nothing on its statement."),
}
# SARIF level of each rule, the same in its descriptor and in its results. Every rule's
# finding fails the run (exit 1), and so does a file that could not be checked; an unused
# suppression is reported only on request and hides nothing.
LEVELS = {"INV000": "error", "INV001": "warning"}
RULE_LEVEL = "error"
# Relative artifact URIs are relative to this base, which the log defines as the folder
# the check ran in (a file URI): code scanning runs `invariants check` at the checkout root.
BASE_ID = "%SRCROOT%"


def render(findings: Sequence[Finding], fmt: str, rules: Sequence[type[Rule]], base: Path | None = None) -> str:
    if fmt == "json":
        return json.dumps([f.as_dict() for f in findings], indent=2) + "\n"
    if fmt == "sarif":
        return json.dumps(sarif(findings, rules, base or Path.cwd()), indent=2) + "\n"
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


def level(rule_id: str) -> str:
    return LEVELS.get(rule_id, RULE_LEVEL)


def artifact_location(path: str, base: Path) -> dict[str, str]:
    """A finding's path as a SARIF artifact location: a percent-encoded URI relative to
    BASE_ID when the file is inside `base`, else an absolute file URI with no base id."""
    full = Path(os.path.abspath(base / path))
    try:
        relative = full.relative_to(os.path.abspath(base))
    except ValueError:
        return {"uri": full.as_uri()}
    return {"uri": quote(relative.as_posix(), safe="/"), "uriBaseId": BASE_ID}


def fingerprints(findings: Sequence[Finding], base: Path) -> list[str]:
    """One fingerprint per finding that survives lines added or removed elsewhere in its file:
    a hash of its path, rule and the text of its line (whitespace collapsed), and which of
    the same rule's findings on identical lines of that file it is (`hash:occurrence`)."""
    texts: dict[str, list[str]] = {}
    seen: dict[str, int] = {}
    found = []
    for f in findings:
        if f.path not in texts:
            texts[f.path] = _lines(base / f.path)
        lines = texts[f.path]
        text = " ".join(lines[f.line - 1].split()) if 0 < f.line <= len(lines) else ""
        digest = hashlib.sha256("\0".join((f.path.replace(os.sep, "/"), f.rule, text)).encode()).hexdigest()[:16]
        seen[digest] = seen.get(digest, 0) + 1
        found.append(f"{digest}:{seen[digest]}")
    return found


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except (OSError, ValueError):  # an INV000 file or a folder: the fingerprint rests on path and rule
        return []


def sarif(findings: Sequence[Finding], rules: Sequence[type[Rule]], base: Path) -> dict:
    """A SARIF 2.1.0 log GitHub code scanning accepts."""
    descriptors = [
        {
            "id": rule_id,
            "name": name,
            "shortDescription": {"text": summary},
            "fullDescription": {"text": summary},
            "defaultConfiguration": {"level": level(rule_id)},
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
            "defaultConfiguration": {"level": level(rule.id)},
        }
        for rule in rules
    ]
    index = {d["id"]: i for i, d in enumerate(descriptors)}
    results = [
        {
            "ruleId": f.rule,
            "ruleIndex": index[f.rule],
            "level": level(f.rule),
            "message": {"text": f.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": artifact_location(f.path, base),
                        "region": {"startLine": f.line, "startColumn": f.col},
                    }
                }
            ],
            "partialFingerprints": {"primaryLocationLineHash": fingerprint},
        }
        for f, fingerprint in zip(findings, fingerprints(findings, base))
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
                "originalUriBaseIds": {BASE_ID: {"uri": Path(os.path.abspath(base)).as_uri().rstrip("/") + "/"}},
                "columnKind": "unicodeCodePoints",
                "results": results,
            }
        ],
    }
