"""What every run tries first beyond the catalogue's seeds: a burst past the capacity the target reports, and
the class scenarios aimed at points it marks; a burst started past the batch's seats is found among them."""

from __future__ import annotations

import dataclasses

import pytest

from mlx_invariants.fuzz.corpus import CLASS_SCENARIOS, SEED_SCENARIOS, burst, class_scenarios
from mlx_invariants.fuzz.runner import run_fuzz
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.target import Target
from mlx_invariants.mutants import CATALOGUE
from mlx_invariants.mutants.copies import import_copy
from mlx_invariants.mutants.mutant import Edit
from tests.conftest import BACKSTOP_S

CORPUS = len(SEED_SCENARIOS) + len(CLASS_SCENARIOS) + 1  # the seeds, the class scenarios, the burst


def test_a_burst_holds_one_request_more_than_the_capacity_and_class_scenarios_need_their_points():
    assert len(burst(28).requests) == 29
    assert class_scenarios(Target.reference("batched").points) == list(CLASS_SCENARIOS.values())
    assert class_scenarios(("ADMITTED", "CHUNK_SENT")) == []


@pytest.fixture(scope="module")
def starts_the_whole_inbox(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The batched engine starting every request it took at once, seats or not."""
    edit = Edit("engine/batched.py", """
        while self._waiting and len(self._active) + len(started) < self.max_batch:
        """, """
        while self._waiting:
        """)
    base = next(m for m in CATALOGUE if "batched" in m.routes)
    plant = dataclasses.replace(base, id="starts-the-whole-inbox", edits=(edit,), routes=("batched",))
    return import_copy(plant, tmp_path_factory.mktemp("plants"))


def test_the_seed_corpus_bursts_past_the_reported_capacity_and_finds_a_bound_overrun(starts_the_whole_inbox: str):
    target = Target.reference("batched", package=starts_the_whole_inbox)
    result = run_fuzz(target, FuzzSettings(profile="ci", examples=CORPUS, budget_s=BACKSTOP_S, debug_run=False))
    assert [f.kind for f in result.findings][:1] == ["engine-invariant-broken"], result.findings
    assert result.findings[0].examples_before == CORPUS, result.findings[0]
