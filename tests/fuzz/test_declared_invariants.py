"""Invariants an engine declares (`broken_invariants`) are asked at every point it reaches, and one that
does not hold is `engine-invariant-broken`: the batched reference engine's seats, judged on its owner thread, and
both routes' admission books (a queue within its bound; on the serialized route one request past admission at a
time), judged on the loop."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.scenario import RequestSpec, Scenario
from mlx_invariants.fuzz.session import run_scenario
from mlx_invariants.fuzz.target import Target
from mlx_invariants.mutants.mutant import Edit
from tests.fuzz.plants import plant

# More requests at once than the batch's 8 seats, each long enough to still run when the next ones start.
BURST = Scenario(tuple(RequestSpec(f"r{i}", 3, 30, True) for i in range(14)), followup=False)


@pytest.fixture(scope="module")
def one_seat_too_many(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The batched engine, its admission loop counting `<=` where it means `<`: one request more than the
    batch's seats is started, and decodes in it."""
    edit = Edit("engine/batched.py", """
        while self._waiting and len(self._active) + len(started) < self.max_batch:
        """, """
        while self._waiting and len(self._active) + len(started) <= self.max_batch:
        """)
    return plant(tmp_path_factory, "one-seat-too-many", "batched", edit)


@pytest.fixture(scope="module")
def admits_under_its_lock(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The batched engine, its owner holding the inbox lock while it admits: the owner reaches its prefill points
    inside its own critical section, where the fuzzer asks for the engine's invariants."""
    edit = Edit("engine/batched.py", """
            self._admit(events)
        """, """
            with self.lock:
                self._admit(events)
        """)
    return plant(tmp_path_factory, "admits-under-its-lock", "batched", edit)


def _burst(package: str | None) -> list:
    target = Target.reference("batched", **({"package": package} if package else {}))
    return judge(run_scenario(target.build(), BURST))


def test_a_burst_started_past_the_batchs_seats_breaks_the_invariant_the_engine_declares(one_seat_too_many: str):
    found = [v for v in _burst(one_seat_too_many) if v.kind == "engine-invariant-broken"]
    assert found and "more than the batch's 8 seats" in found[0].message, found


def test_the_reference_engine_holds_its_seats_through_the_same_burst():
    assert _burst(None) == []


def test_asking_for_the_invariants_inside_the_owners_critical_section_does_not_deadlock(admits_under_its_lock: str):
    """The seats are the owner's own books: asking for them at a point the owner reached holding its inbox lock
    must not wait for that lock (it once did, and the fuzz run of such an engine hung for good)."""
    found: list = []
    run = threading.Thread(target=lambda: found.extend(_burst(admits_under_its_lock)), daemon=True)
    run.start()
    run.join(120)
    assert not run.is_alive(), "the scenario never ended: the invariant check waited for a lock its thread held"
    assert not [v for v in found if v.kind == "engine-invariant-broken"], found


# Two more requests at once than the serialized route holds (its slot and a wait queue of 4, as the fuzzer runs
# it): the last ones must wait in admission's queue or be refused, never wait anywhere else.
CROWD = Scenario(tuple(RequestSpec(f"r{i}", 3, 12, True) for i in range(7)), followup=False)


@pytest.fixture(scope="module")
def queues_behind_the_lock(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The serialized route whose admission lets a busy request through to wait for the generation lock instead
    of refusing it: it never leaves admission's books, and waits with no bound."""
    edit = Edit("engine/admission.py", """
        if len(self._waiters) >= self.max_queue:
            raise self._busy("the engine is busy generating")
        """, """
        if len(self._waiters) >= self.max_queue:
            self.holders += 1  # let it queue on the engine's own lock: it gets its turn
            return
        """)
    return plant(tmp_path_factory, "queues-behind-the-lock", "simple", edit)


@pytest.fixture(scope="module")
def queue_counts_from_the_holders(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Both routes' admission measuring its queue's bound from the requests it holds: one more may wait."""
    edit = Edit("engine/admission.py", """
        if len(self._waiters) >= self.max_queue:
        """, """
        if len(self._waiters) >= self.max_queue + self.holders:
        """)
    return plant(tmp_path_factory, "queue-counts-from-the-holders", "simple", edit)


def test_a_request_let_past_admission_to_wait_on_the_generation_lock_breaks_the_serialized_route(
        queues_behind_the_lock: str):
    found = judge(run_scenario(Target.reference("simple", package=queues_behind_the_lock).build(), CROWD))
    assert [v for v in found if v.kind == "engine-invariant-broken" and "generation slot" in v.message], found


def test_an_admission_queue_one_past_its_bound_breaks_it(queue_counts_from_the_holders: str):
    found = judge(run_scenario(Target.reference("simple", package=queue_counts_from_the_holders).build(), CROWD))
    assert [v for v in found if v.kind == "engine-invariant-broken" and "wait for admission" in v.message], found


@pytest.mark.parametrize("route", ["simple", "batched"])
def test_the_reference_routes_keep_their_admission_books_under_a_crowd(route: str):
    assert judge(run_scenario(Target.reference(route).build(), CROWD)) == []
