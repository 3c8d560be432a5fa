"""Real-shaped code from reviewed MLX serving bugs: each fixture gets exactly its `# expect:` findings.

`inv*_fixed.py` and `clean_*.py` are the corrected versions and must stay silent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_invariants.checker import config
from mlx_invariants.checker.rule import Example
from mlx_invariants.checker.rules import RULES
from mlx_invariants.checker.runner import check_paths

FIXTURES = Path(__file__).parent / "fixtures"
FILES = sorted(FIXTURES.glob("*.py"))


@pytest.fixture(scope="module")
def findings() -> dict[str, list[tuple[int, str]]]:
    # every rule, the opt-in ones too: a fixture tests its rule, not the default selection
    settings = config.from_table({"select": ["INV", *(r.id for r in RULES if not r.default_enabled)]}, FIXTURES,
                                 "fixtures", RULES)
    found: dict[str, list[tuple[int, str]]] = {}
    for finding in check_paths([str(FIXTURES)], settings, use_cache=False).findings:
        found.setdefault(Path(finding.path).name, []).append((finding.line, finding.rule))
    return found


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_fixture_gets_exactly_its_expected_findings(path: Path, findings: dict) -> None:
    expected = sorted(Example(path.read_text()).expected())
    if path.name.startswith("clean_") or path.stem.endswith("_fixed"):
        assert not expected
    else:
        assert expected, "a bug fixture marks at least one finding"
    assert sorted(findings.get(path.name, [])) == expected


def test_every_rule_is_exercised_by_a_fixture() -> None:
    marked = {rule for path in FILES for _, rule in Example(path.read_text()).expected()}
    seed_rules = {"INV101", "INV102", "INV103", "INV104", "INV106", "INV108", "INV109", "INV110", "INV111"}
    assert seed_rules <= marked
