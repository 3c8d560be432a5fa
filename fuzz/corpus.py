"""The seed bugs' minimal scenarios: every fuzz run tries these first (Hypothesis `@example`s).

Each is what the fuzzer shrank the corresponding bug to: the regression
catalogue's entries the fuzzer must kill name theirs (`Mutant.seed`, see
tests/mutants/test_fuzz_kills.py); together they replay the history this
harness exists to prevent from coming back.
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
