"""benchmarks/precision_unstudied.py joins findings with blind verdicts by repository, path, line and rule.

A finding the rules still make keeps its verdict; one they make anew shows as not graded
(and gets a reviewer packet) until someone grades it; arguable counts against precision.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import precision_unstudied as pu  # noqa: E402


def _finding(line: int, rule: str = "INV108") -> dict:
    return {"repo": "acme/server", "commit": "0" * 40, "path": "server/app.py", "line": line, "rule": rule,
            "message": f"finding at {line}"}


def test_verdicts_are_joined_by_location_and_rule_and_arguable_counts_as_false(tmp_path: Path) -> None:
    verdicts = {
        "acme/server:server/app.py:10:INV108": {"verdict": "true", "reason": "blocks the loop"},
        "acme/server:server/app.py:20:INV108": {"verdict": "arguable", "reason": "start-up only"},
        "acme/server:server/app.py:30:INV107": {"verdict": "false", "reason": "another rule, same line"},
    }
    found = [_finding(10), _finding(20), _finding(30), _finding(40)]
    text = pu.render(found, verdicts, "abc1234")
    assert "**4 findings on 10 servers; 2 graded: 1 true, 1 arguable, 0 false (50 % true).**" in text
    assert "| INV108 | 4 | 1 | 1 | 0 | 2 |" in text
    assert "| `server/app.py:40` | INV108 | finding at 40 | not graded |" in text


def test_packets_are_written_only_for_findings_without_a_verdict(tmp_path: Path) -> None:
    verdicts = {"acme/server:server/app.py:10:INV108": {"verdict": "true", "reason": "r"}}
    count = pu.write_packets([_finding(10), _finding(20)], verdicts, tmp_path / "mirrors", tmp_path / "out")
    assert count == 1
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index == {"F1.1": "acme/server:server/app.py:20:INV108"}
    packet = (tmp_path / "out" / "batch1.md").read_text()
    assert "line 20" in packet and "finding at 20" in packet and "line 10" not in packet


def test_the_held_out_record_sums_each_rule_over_sets_with_its_verdicts() -> None:
    verdicts = {
        "acme/server:server/app.py:10:INV108": {"verdict": "true", "reason": "blocks the loop", "replayed": "exit 1"},
        "acme/server:server/app.py:20:INV107": {"verdict": "false", "reason": "under a lock", "replayed": "no"},
    }
    table = pu.rule_table({"b": [_finding(10), _finding(20, "INV107")], "c": [_finding(30)]}, verdicts)
    # Only a true finding counts as replayed.
    assert "| INV107 | 1 | 0 | 0 | 0 | 1 | 0 | b |" in table
    assert "| INV108 | 2 | 1 | 1 | 0 | 0 | 1 | b, c |" in table
    assert table.rstrip().endswith("| all | 3 | 1 | 1 | 0 | 1 | 1 | b, c |")
