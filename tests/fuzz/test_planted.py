"""Proof that the fuzzer bites: each seed bug, planted into a copy of the engine, is found by
generation alone, shrunk to a one-fault scenario, and its report replays."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_invariants.fuzz.adapters.reference import reference_engine
from mlx_invariants.fuzz.corpus import SEED_SCENARIOS
from mlx_invariants.fuzz.driver import run_scenario
from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.replay import replay
from mlx_invariants.fuzz.runner import run_fuzz
from tests.fuzz.planted import PLANTS, plant


@pytest.fixture(scope="module")
def plants_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("plants")


@pytest.mark.parametrize("name", sorted(PLANTS))
def test_fuzzer_finds_shrinks_and_replays_planted_bug(name: str, plants_root: Path, tmp_path: Path):
    spec = PLANTS[name]
    factory = reference_engine(spec.engine, package=plant(name, plants_root))
    result = run_fuzz(factory, profile="ci", examples=150, budget=90, explicit=(), replays=2,
                      report_dir=tmp_path, shrink_s=60, debug_run=False)
    assert result.failure is not None, f"missed alarm: {name} ({spec.why}) survived {result.examples} examples"
    failure = result.failure
    assert failure.violations[0].kind in spec.finds, failure.headline
    assert len(failure.scenario.requests) <= 2 and len(failure.scenario.faults) <= 1, failure.scenario.describe()
    assert failure.reproduced is not None and failure.reproduced[0] >= 1
    report = (result.report_dir / "report.txt").read_text()
    assert f"invariants fuzz --replay {result.report_dir / 'scenario.json'}" in report
    assert "reproduced:" in report and "device:" in report and "event trace" in report
    replayed = replay(result.report_dir / "scenario.json", factory)
    assert replayed.reproduced == 1 and replayed.runs[0][0].kind in spec.finds


@pytest.mark.parametrize("name", sorted(SEED_SCENARIOS))
def test_seed_scenario_catches_its_plant_and_passes_on_the_reference(name: str, plants_root: Path):
    spec = PLANTS[name]
    scenario = SEED_SCENARIOS[name]
    planted = judge(run_scenario(reference_engine(spec.engine, package=plant(name, plants_root)), scenario))
    assert planted and planted[0].kind in spec.finds, f"missed alarm on {name}: {[v.kind for v in planted]}"
    reference = judge(run_scenario(reference_engine(spec.engine), scenario))
    assert [v.kind for v in reference] == [], f"false alarm on the reference engine: {reference}"
