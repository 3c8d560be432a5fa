"""The SARIF log is one GitHub code scanning can use: resolvable URIs, stable fingerprints, consistent levels.

No SARIF 2.1.0 schema ships in a package this project can depend on, so the schema's
rules that matter for code scanning are checked here directly: a relative `uri` only with
a `uriBaseId` that `originalUriBaseIds` defines as an absolute folder URI, an absolute
`uri` without one, URIs made only of URI characters, rule indexes and levels that agree
with the rule descriptors.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import pytest

from mlx_invariants.checker import output
from mlx_invariants.checker.rule import Finding
from tests.invariants.conftest import BAD_LOCK, Project

# RFC 3986: unreserved and reserved characters, and percent escapes; nothing else.
_URI_CHARS = re.compile(r"(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-F]{2})*")
_LEVELS = {"none", "note", "warning", "error"}


def _sarif(project: Project, *args: str) -> dict:
    run = project.run("check", "--format", "sarif", "--no-cache", *args)
    assert run.code == 1, run.err
    return json.loads(run.out)


def _check_structure(log: dict) -> None:
    """The parts of the SARIF 2.1.0 schema and spec that code scanning relies on."""
    assert log["version"] == "2.1.0" and log["$schema"].endswith("sarif-2.1.0.json")
    [run] = log["runs"]
    rules = run["tool"]["driver"]["rules"]
    ids = [r["id"] for r in rules]
    assert len(ids) == len(set(ids))
    for rule in rules:
        assert rule["shortDescription"]["text"] and rule["defaultConfiguration"]["level"] in _LEVELS
    bases = run.get("originalUriBaseIds", {})
    for base in bases.values():
        parsed = urlparse(base["uri"])
        assert parsed.scheme == "file" and base["uri"].endswith("/") and "uriBaseId" not in base
    assert run["columnKind"] == "unicodeCodePoints"
    for result in run["results"]:
        rule = rules[result["ruleIndex"]]
        assert rule["id"] == result["ruleId"]
        assert result["level"] == rule["defaultConfiguration"]["level"]
        assert result["message"]["text"]
        [location] = result["locations"]
        physical = location["physicalLocation"]
        assert physical["region"]["startLine"] >= 1 and physical["region"]["startColumn"] >= 1
        artifact = physical["artifactLocation"]
        assert _URI_CHARS.fullmatch(artifact["uri"]), artifact["uri"]
        if "uriBaseId" in artifact:
            assert artifact["uriBaseId"] in bases
            assert not urlparse(artifact["uri"]).scheme and not artifact["uri"].startswith("/")
        else:
            assert urlparse(artifact["uri"]).scheme == "file"
        fingerprint = result["partialFingerprints"]["primaryLocationLineHash"]
        assert re.fullmatch(r"[0-9a-f]{16}:[1-9][0-9]*", fingerprint)


def _resolved(log: dict, result: dict) -> Path:
    """The file a result names, resolved the way a SARIF consumer resolves it."""
    artifact = result["locations"][0]["physicalLocation"]["artifactLocation"]
    uri = artifact["uri"]
    if "uriBaseId" in artifact:
        uri = urljoin(log["runs"][0]["originalUriBaseIds"][artifact["uriBaseId"]]["uri"], uri)
    return Path(unquote(urlparse(uri).path))


def test_a_log_with_findings_and_an_unreadable_file_has_the_structure_code_scanning_needs(project: Project) -> None:
    project.write("pkg/engine.py", BAD_LOCK)
    project.write("pkg/broken.py", "def f(:\n")
    log = _sarif(project)
    _check_structure(log)
    results = log["runs"][0]["results"]
    assert sorted(r["ruleId"] for r in results) == ["INV000", "INV105"]
    for result in results:
        assert _resolved(log, result).is_file()


@pytest.mark.parametrize("name, uri", [
    ("my dir/engine one.py", "my%20dir/engine%20one.py"),
    ("café/ünïcode.py", "caf%C3%A9/%C3%BCn%C3%AFcode.py"),
    ("hash#1/a#b.py", "hash%231/a%23b.py"),
    ("pct%20/x.py", "pct%2520/x.py"),
])
def test_paths_are_percent_encoded_and_resolve_to_the_file(project: Project, name: str, uri: str) -> None:
    path = project.write(name, BAD_LOCK)
    log = _sarif(project)
    _check_structure(log)
    [result] = log["runs"][0]["results"]
    assert result["locations"][0]["physicalLocation"]["artifactLocation"] == {"uri": uri, "uriBaseId": "%SRCROOT%"}
    assert _resolved(log, result) == path.resolve()


def test_a_file_outside_the_folder_checked_from_gets_an_absolute_uri_without_a_base(project: Project, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere dir" / "engine.py"
    outside.parent.mkdir()
    outside.write_text(BAD_LOCK)
    log = _sarif(project, str(outside))
    _check_structure(log)
    [result] = log["runs"][0]["results"]
    artifact = result["locations"][0]["physicalLocation"]["artifactLocation"]
    assert artifact["uri"].startswith("file:///") and "%20" in artifact["uri"] and "uriBaseId" not in artifact
    assert _resolved(log, result) == outside


def _fingerprints(project: Project) -> dict[tuple[str, int], str]:
    log = _sarif(project)
    found = {}
    for r in log["runs"][0]["results"]:
        where = r["locations"][0]["physicalLocation"]
        found[(where["artifactLocation"]["uri"], where["region"]["startLine"])] = r["partialFingerprints"]["primaryLocationLineHash"]
    return found


def test_fingerprints_survive_lines_added_above_and_tell_identical_lines_apart(project: Project) -> None:
    twice = BAD_LOCK + "\n    async def again(self, step):\n        async with self._mlx_lock:\n            return await asyncio.to_thread(step)\n"
    project.write("a.py", twice)
    project.write("b.py", BAD_LOCK)
    before = _fingerprints(project)
    assert len(before) == 3 and len(set(before.values())) == 3  # same line text twice in a.py; same line in b.py
    project.write("a.py", "# a new comment\n\n" + twice.replace("    async def", "    # a comment between\n\n    async def", 1))
    after = _fingerprints(project)
    assert sorted(after.values()) == sorted(before.values())
    assert {line for _, line in after} != {line for _, line in before}  # the findings did move


def test_fingerprints_change_when_the_flagged_line_changes(project: Project) -> None:
    project.write("a.py", BAD_LOCK)
    [before] = _fingerprints(project).values()
    project.write("a.py", BAD_LOCK.replace("to_thread(step)", "to_thread(step, 1)"))
    [after] = _fingerprints(project).values()
    assert before != after


def test_each_level_is_the_rules_default_level() -> None:
    from mlx_invariants.checker.rules import RULES

    rules = list(RULES)
    findings = [Finding("a.py", 1, 1, "INV000", "x"), Finding("a.py", 2, 1, "INV001", "y"),
                Finding("a.py", 3, 1, rules[0].id, "z")]
    log = output.sarif(findings, rules, Path("/nonexistent"))
    _check_structure(log)
    levels = {r["ruleId"]: r["level"] for r in log["runs"][0]["results"]}
    assert levels == {"INV000": "error", "INV001": "warning", rules[0].id: "error"}
