"""The seed bugs' minimal scenarios: every fuzz run tries these first (Hypothesis `@example`s).

Each is what the fuzzer shrank the corresponding bug to: the regression
catalogue's entries the fuzzer must kill name theirs (`Mutant.seed`, see
tests/mutants/test_fuzz_kills.py); together they replay the history this
harness exists to prevent from coming back. After them come a few scenarios
for a class of bug no entry seeds (`CLASS_SCENARIOS`); seeds and class
scenarios alike are tried only where the target marks the points they aim at
and takes the faults they deliver (`aimed_within`), one request of each transport asking
for every field of the request surface (`surface_tour`) and, where the
target reports its capacity, one burst past it (`burst`): generation draws
each only now and then.
Each costs every run's first seconds, so they stay few and short.
"""

from __future__ import annotations

from mlx_invariants.fuzz.scenario import At, FaultSpec, RequestSpec, Scenario


def _one(kind: str, point: str = "ADMITTED", index: int = 0, **request: object) -> Scenario:
    spec = RequestSpec("r0", **{"prompt_len": 1, "max_tokens": 1, "stream": False, **request})
    return Scenario((spec,), (FaultSpec(kind, At("r0", point, index)),))


SEED_SCENARIOS: dict[str, Scenario] = {
    # the slot freed when the waiting task is cancelled, while its worker still runs
    "lock_freed_on_cancel": _one("cancel"),
    # the cancel path re-acquires the lock its own task holds
    "nested_lock_reacquire": _one("cancel", max_tokens=2),
    # a long prompt's array built on the loop thread, evaluated on the owner
    "array_crosses_threads": _one("cancel", prompt_len=7, route="chat"),
    # an aborted request's row left in the batch generator, its books cleared: held at rest
    "aborted_row_left_in_generator": _one("abort", "BEFORE_DECODE", 1, max_tokens=10),
    # long generations handed to a pool thread
    "worker_on_pool_thread": _one("cancel", "FINISHED", max_tokens=9),
    # shutdown stops the owner and leaves the batch's requests waiting
    "shutdown_leaves_waiters": _one("shutdown", "BEFORE_DECODE", 1, max_tokens=4),
    # an abort reaching a request between leaving the inbox and its first decode step is dropped
    "abort_lost_between_sections": _one("cancel", "WORKER_STARTED", max_tokens=4),
    # a second cancel during the drain releases the slot
    "double_cancel_releases_slot": _one("cancel-twice"),
    # two greedy requests decoding together, each handed the other's tokens
    "tokens_decoded_together": Scenario(tuple(RequestSpec(rid, prompt_len=4, max_tokens=6) for rid in ("r0", "r1"))),
}


# Scenarios for a class of bug rather than a catalogue entry: tried after the seeds, where the target marks
# every point they aim at (`class_scenarios`).
CLASS_SCENARIOS: dict[str, Scenario] = {
    # a request posted while the owner, done with the one before, stands between its idle check and its wait:
    # an owner that loses that wake-up leaves it waiting
    "posted_while_owner_goes_idle": Scenario((RequestSpec("r0", 1, 1, False),
                                              RequestSpec("r1", 1, 1, False, arrival=At("r0", "OWNER_IDLE")))),
    # a request that arrives while the owner is in a step, its client gone at once: request and abort reach the
    # owner together, and an owner that matches aborts only against what it already held decodes it for nobody
    "cancelled_while_owner_steps": Scenario((RequestSpec("r0", 1, 8, False),
                                             RequestSpec("r1", 1, 12, False, arrival=At("r0", "BEFORE_DECODE", 2))),
                                            (FaultSpec("cancel", At("r1", "ADMITTED")),)),
    # a shutdown as a request is handed in, before its worker took it: an engine that stops its loop and ends
    # only what the loop had started leaves that request waiting for ever
    "shutdown_as_one_arrives": _one("shutdown", max_tokens=4),
    # an MLX error in a decode step two requests share: the engine fails what the step held and recovers, and
    # an engine that rebuilds its generator but keeps some of the old books holds them at rest
    "step_fails_under_two": Scenario((RequestSpec("r0", 1, 4, False), RequestSpec("r1", 1, 4, False)),
                                     (FaultSpec("raise", At("r0", "BEFORE_DECODE", 1)),)),
    # a waiter cancelled as the place it waits for frees: where the grant lands in the same loop turn as the
    # cancel, a waiter that only leaves the queue keeps a place nobody will give back (the lost wake-up CPython's
    # own asyncio.Lock and Semaphore had, gh-90155), and every later request is refused busy
    "waiter_cancelled_as_granted": Scenario((RequestSpec("r0", 1, 4, False),
                                             RequestSpec("r1", 1, 1, False, arrival=At("r0", "SLOT_ACQUIRED"))),
                                            (FaultSpec("cancel", At("r0", "SLOT_RELEASED"), rid="r1"),)),
}

BURST_TOKENS = 4  # each burst request still decodes while the ones after it start


def aimed_within(scenarios: dict[str, Scenario], points: tuple[str, ...], kinds: tuple[str, ...]) -> list[Scenario]:
    """The scenarios whose every aimed point is among `points` and every fault among `kinds`, the target's: one
    aimed at a point the target never reaches runs with no fault at all, a scenario spent (an engine that marks
    two points saves four of the seeds, and its shutdowns restart it); a fault the target does not take does
    something else there (a launched server is not shut down by the fuzzer: its `shutdown` closes the
    fuzzer's own client, which cut requests still waiting)."""
    def aims(scenario: Scenario) -> set[str]:
        return {f.at.point for f in scenario.faults} | {r.arrival.point for r in scenario.requests if r.arrival}

    return [s for s in scenarios.values()
            if aims(s) <= set(points) and {f.kind for f in s.faults} <= set(kinds)]


def surface_tour(top_logprobs: int) -> Scenario:
    """Every field a request may ask for beyond the plain greedy answer, once, on both transports and both
    routes: log-probabilities (with `top_logprobs` alternatives where the target takes them), sampling with a
    seed, a stop string. Generation asks for them in one request in `SURFACE_ODDS`, so a run that ends after
    a few examples (a slow server, a short budget) may never have rendered a log-probability; a bug on that
    path (a value that crosses threads unevaluated, a payload that cannot render it) shows on the first."""
    return Scenario((RequestSpec("r0", 4, 5, True, logprobs=True, top_logprobs=top_logprobs),
                     RequestSpec("r1", 4, 5, False, route="chat", logprobs=True, temperature=0.7, top_p=0.9, seed=7,
                                 stop=("e",))))


def burst(capacity: int) -> Scenario:
    """One more request at once than the target holds (`capacity`, seats and queue): every seat fills in one
    go, the queue behind it too, and the last is refused. A bound on how many start together, or on the
    queue, that a burst overruns shows here, where generated scenarios reach that many requests only now
    and then."""
    return Scenario(tuple(RequestSpec(f"r{i}", 1, BURST_TOKENS, False) for i in range(capacity + 1)))
