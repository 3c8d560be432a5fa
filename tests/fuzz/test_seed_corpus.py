"""What every run tries first beyond the catalogue's seeds: a burst past the capacity the target reports, the class
scenarios aimed at points it marks, and a tour of the request surface; a burst started past the batch's seats, and
a log-probability that crosses to the loop unevaluated, are found among them."""

from __future__ import annotations


import pytest

from mlx_invariants.fuzz.corpus import CLASS_SCENARIOS, SEED_SCENARIOS, aimed_within, burst, surface_tour
from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.runner import run_fuzz
from mlx_invariants.fuzz.session import run_scenario
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.target import Target
from mlx_invariants.mutants.mutant import Edit
from tests.conftest import BACKSTOP_S
from tests.fuzz.plants import plant

CORPUS = len(SEED_SCENARIOS) + 1 + len(CLASS_SCENARIOS) + 1  # the seeds, the burst, the class scenarios, the tour
BURST_AT = len(SEED_SCENARIOS) + 1  # right after the seeds


def test_a_burst_holds_one_request_more_than_the_capacity_and_seeds_and_class_scenarios_need_their_points():
    assert len(burst(28).requests) == 29
    reference = Target.reference("batched")
    every = (reference.points, reference.fault_kinds)
    assert aimed_within(CLASS_SCENARIOS, *every) == list(CLASS_SCENARIOS.values())
    assert aimed_within(SEED_SCENARIOS, *every) == list(SEED_SCENARIOS.values())
    two = (("ADMITTED", "CHUNK_SENT"), reference.fault_kinds)  # the points vllm-mlx's engines declare
    assert aimed_within(CLASS_SCENARIOS, *two) == [CLASS_SCENARIOS["shutdown_as_one_arrives"]]
    kept = aimed_within(SEED_SCENARIOS, *two)
    assert SEED_SCENARIOS["lock_freed_on_cancel"] in kept and SEED_SCENARIOS["shutdown_leaves_waiters"] not in kept
    # A launched server is not shut down by the fuzzer: no corpus scenario delivers a shutdown to one.
    server = Target.server("python -m some.server --port {port}")
    assert "shutdown" not in {f.kind for s in aimed_within({**SEED_SCENARIOS, **CLASS_SCENARIOS}, server.points,
                                                           server.fault_kinds) for f in s.faults}


@pytest.fixture(scope="module")
def starts_the_whole_inbox(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The batched engine starting every request it took at once, seats or not."""
    edit = Edit("engine/batched.py", """
        while self._waiting and len(self._active) + len(started) < self.max_batch:
        """, """
        while self._waiting:
        """)
    return plant(tmp_path_factory, "starts-the-whole-inbox", "batched", edit)


def test_the_seed_corpus_bursts_past_the_reported_capacity_and_finds_a_bound_overrun(starts_the_whole_inbox: str):
    target = Target.reference("batched", package=starts_the_whole_inbox)
    result = run_fuzz(target, FuzzSettings(profile="ci", examples=BURST_AT, budget_s=BACKSTOP_S, debug_run=False))
    assert [f.kind for f in result.findings][:1] == ["engine-invariant-broken"], result.findings
    assert result.findings[0].examples_before == BURST_AT, result.findings[0]


def test_the_tour_asks_for_every_request_field_on_both_transports_and_routes():
    requests = surface_tour(2).requests
    assert {r.stream for r in requests} == {True, False} and {r.route for r in requests} == {"completions", "chat"}
    assert all(r.logprobs for r in requests) and max(r.top_logprobs for r in requests) == 2
    assert any(r.temperature and r.top_p < 1 and r.seed is not None and r.stop for r in requests)
    assert surface_tour(0).requests[0].top_logprobs == 0  # over HTTP: the sampled token's only


@pytest.fixture(scope="module")
def logprob_left_lazy(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The batched engine handing each token's log-probability to the loop as an unevaluated MLX array, and the
    chat payload reading it there with `float()`: only a request that asks for log-probabilities goes that way."""
    edits = (Edit("engine/batched.py", """
        logprob = logprob_of(logprobs, token) if params.logprobs else None
        """, """
        logprob = logprobs[token] if params.logprobs else None
        """), Edit("engine/http/payloads.py", """
        return {"content": [{"token": t.text, "logprob": t.logprob, "bytes": list(t.text.encode()),
        """, """
        return {"content": [{"token": t.text, "logprob": float(t.logprob), "bytes": list(t.text.encode()),
        """))
    return plant(tmp_path_factory, "logprob-left-lazy", "batched", *edits)


def test_the_seed_corpus_renders_a_log_probability_and_finds_one_that_crossed_threads_lazily(logprob_left_lazy: str):
    target = Target.served("batched", package=logprob_left_lazy)
    result = run_fuzz(target, FuzzSettings(profile="ci", examples=CORPUS, budget_s=BACKSTOP_S, debug_run=False))
    assert result.findings, "the seed corpus never asked for a log-probability over HTTP"
    assert {f.kind for f in result.findings} & {"mlx-no-stream", "mlx-off-owner"}, result.findings
    assert result.findings[0].examples_before <= CORPUS, result.findings[0]


@pytest.fixture(scope="module")
def keeps_the_failed_batch(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The batched engine failing a step's requests and rebuilding its generator, but keeping them as active."""
    edit = Edit("engine/batched.py", """
        for active in list(self._active.values()):
            self._end(active.pending, Failed(active.pending.rid, message), events)
        self._active.clear()
        """, """
        for active in list(self._active.values()):
            self._end(active.pending, Failed(active.pending.rid, message), events)
        """)
    return plant(tmp_path_factory, "keeps-the-failed-batch", "batched", edit)


def test_a_step_failing_under_two_requests_shows_books_a_failure_left(keeps_the_failed_batch: str):
    scenario = CLASS_SCENARIOS["step_fails_under_two"]
    found = judge(run_scenario(Target.reference("batched", package=keeps_the_failed_batch).build(), scenario))
    assert "slot-leaked" in {v.kind for v in found}, found
    assert judge(run_scenario(Target.reference("batched").build(), scenario)) == []


@pytest.fixture(scope="module")
def aborts_only_started_rows(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The batched engine applying an abort only to a request already in the batch: one still waiting for its
    seat, or taken from the inbox with its abort, starts anyway."""
    edit = Edit("engine/batched.py", """
            if pending.rid in aborts:
                self._end(pending, Finished(pending.rid, "abort", len(pending.prompt), 0), events)
            else:
                waiting.append(pending)
        """, """
            waiting.append(pending)
        """)
    return plant(tmp_path_factory, "aborts-only-started-rows", "batched", edit)


def test_a_request_cancelled_as_it_arrives_mid_step_is_never_decoded(aborts_only_started_rows: str):
    scenario = CLASS_SCENARIOS["cancelled_while_owner_steps"]
    found = judge(run_scenario(Target.reference("batched", package=aborts_only_started_rows).build(), scenario))
    assert "abort-ignored" in {v.kind for v in found}, found
    assert judge(run_scenario(Target.reference("batched").build(), scenario)) == []


@pytest.fixture(scope="module")
def stop_drops_the_inbox(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The batched engine whose owner polls its inbox every 0.2 s and goes when asked to stop before it takes the
    inbox again, ending only what it had taken, and whose shutdown stops the owner at once and leaves the streams
    still open as they are: a request handed in just before the shutdown waits for ever (vllm-mlx 0.6.0's
    `stop()`, docs/zoo.md, is this class)."""
    edits = (Edit("engine/owner.py", """
        self._wake.wait()
        """, """
        time.sleep(0.2)
        """), Edit("engine/batched.py", """
        self._wait_if_idle()
        new, aborts = self._take_inbox()
        """, """
        self._wait_if_idle()
        if self.stopping:
            return
        new, aborts = self._take_inbox()
        """), Edit("engine/batched.py", """
        for pending in [*self._waiting, *queued]:
        """, """
        for pending in self._waiting:
        """), Edit("engine/frontend.py", """
        await self._wait_streams_ended(grace_s)
        for stream in list(self._streams.values()):
            stream.abort()
        await self._wait_streams_ended(max(grace_s, 1.0))
        """, """
        """), Edit("engine/frontend.py", """
        for stream in list(self._streams.values()):
            stream.push_terminal_if_open("the engine shut down")
        """, """
        """))
    return plant(tmp_path_factory, "stop-drops-the-inbox", "batched", *edits)


def test_a_shutdown_as_a_request_arrives_finds_an_engine_that_strands_what_it_was_handed(stop_drops_the_inbox: str):
    scenario = CLASS_SCENARIOS["shutdown_as_one_arrives"]
    found = judge(run_scenario(Target.reference("batched", package=stop_drops_the_inbox).build(), scenario))
    assert {"shutdown-left-waiter", "stalled"} & {v.kind for v in found}, found
    seed = SEED_SCENARIOS["shutdown_leaves_waiters"]  # the catalogue's seed: the request already decoding
    assert judge(run_scenario(Target.reference("batched", package=stop_drops_the_inbox).build(), seed)) == []
    assert judge(run_scenario(Target.reference("batched").build(), scenario)) == []


@pytest.fixture(scope="module")
def granted_waiter_keeps_its_place(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The serialized route's wait-mode admission whose cancelled waiter only leaves the queue, even when the
    place was granted to it in the same loop turn: that place is never handed on (planted P04's class)."""
    edit = Edit("engine/admission.py", """
        except asyncio.CancelledError:
            if grant.done() and not grant.cancelled() and grant.exception() is None:
                self.leave()  # granted in the same turn we were cancelled: pass the place on
            elif grant in self._waiters:
                self._waiters.remove(grant)
            raise
        """, """
        except asyncio.CancelledError:
            if grant in self._waiters:
                self._waiters.remove(grant)
            raise
        """)
    return plant(tmp_path_factory, "granted-waiter-keeps-its-place", "simple", edit)


def test_a_waiter_cancelled_as_the_place_frees_finds_an_admission_that_loses_the_place(granted_waiter_keeps_its_place):
    scenario = CLASS_SCENARIOS["waiter_cancelled_as_granted"]
    found = judge(run_scenario(Target.reference("simple", package=granted_waiter_keeps_its_place).build(), scenario))
    assert {"slot-leaked", "followup-differs"} & {v.kind for v in found}, found
    assert judge(run_scenario(Target.reference("simple").build(), scenario)) == []
