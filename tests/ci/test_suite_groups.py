"""ci/test.sh runs the suite as pytest processes side by side over groups of folders and files: together
they must collect every test of `tests` exactly once, or a test would silently stop running in CI."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _groups() -> list[list[str]]:
    script = (REPO / "ci" / "test.sh").read_text()
    block = re.search(r"^GROUPS_=\((.*?)\)$", script, re.M | re.S)
    assert block, "ci/test.sh no longer declares GROUPS_=(...)"
    return [shlex.split(group) for group in re.findall(r'"([^"]+)"', block.group(1))]


def _collected(args: list[str]) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", *args],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if "::" in line]


def test_the_groups_collect_every_test_exactly_once() -> None:
    groups = _groups()
    assert len(groups) >= 2
    per_group = Counter(test for group in groups for test in _collected(group))
    assert [test for test, times in per_group.items() if times > 1] == []
    assert sorted(per_group) == sorted(_collected(["tests"]))
