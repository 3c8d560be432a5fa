"""Rest state: once every request has ended, the engine is back where it was.

SGLang's tests check that the KV and token pools are empty after a workload
with aborts, llama.cpp's that every slot is idle. `nothing_leaked`
(`fuzz/oracles.py`) reads what the engine's own `status()` says it holds;
this module looks at what it cannot hide: the process's threads and MLX's
active memory (`mx.get_active_memory()`, the bytes of arrays still alive),
sampled at rest (`RestSample`).

Caches hold memory legitimately (a prompt cache, a compiled sampler, the first
use of a shape), so no single scenario's excess over a fresh engine is judged.
Two comparisons are, each against the same engine at rest:

- one request on a warm engine at rest leaves it as it found it: the driver
  samples before the follow-up request and after it (`follow-up` below); a
  thread that request started and that is still alive, or memory beyond
  `REST_NOISE_BYTES`, stays behind per request. Judged only on a warm engine
  (one that completed a request before), so first-use allocations never count;
- the rest state after each scenario on one engine (`RestSeries`, after the
  same follow-up each time) does not climb scenario after scenario: a leak of
  one KV row per aborted request raises it with every abort, while a cache
  fills up and stops. A launched server is sampled by its injected sentinel
  (the lowest thread count and active memory at any MLX entry of a scenario,
  before which every earlier request had ended: `server_floor`).

Threads: everything here runs on the loop thread, between scenarios' requests.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Optional

from mlx_invariants.fuzz.collect import harness_collect
from mlx_invariants.fuzz.executors import THREAD_PREFIX
from mlx_invariants.fuzz.trace import Trace
from mlx_invariants.fuzz.violation import Violation, ViolationKind, yields

# MLX active memory one greedy follow-up on a warm engine may leave at rest: the reference engines' rest
# state moved by up to 56 KB from one scenario to the next on the embedded model (arrays an emptied batch or a
# sampler keeps, sized by the last batch), against 256 KB and more for one KV row (a 256-token step of the
# cache); twice the noise, or a thousandth of what is active at rest for a real model's weights.
REST_NOISE_BYTES = 128 * 1024
REST_NOISE_SHARE = 0.001
# The rest state climbing over this many scenarios on one engine in a row (each at most the noise lower
# than the one before), by more than `DRIFT_STEPS` times the noise in all: a leak, not a cache filling up.
DRIFT_SCENARIOS = 8
DRIFT_STEPS = 4
# Threads a launched server may add at rest over `DRIFT_SCENARIOS` (a worker pool growing to its size).
DRIFT_THREADS = 4
THREAD_JOIN_S = 2.0   # how long a thread the follow-up started gets to end once the follow-up ended
# The threads of Python's default executor at most (`concurrent.futures.ThreadPoolExecutor`, 3.8 and later), on
# this machine, where a launched server runs too.
DEFAULT_POOL_THREADS = min(32, (os.cpu_count() or 1) + 4)


@dataclass(frozen=True)
class RestSample:
    """What a process holds at rest: its live threads (the fuzzer's executor threads left out) and MLX's
    active memory in bytes (None where MLX is not loaded)."""

    threads: int
    mlx_active: Optional[int]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RestSample":
        return cls(int(data["threads"]), data.get("mlx_active"))


def held_counts(status: dict[str, Any]) -> dict[str, int]:
    """What a status in the reference engine's schema says is held, by kind (every count zero at rest):
    admission's `active` and `queued`, the requests it still tracks, and each count under `held`."""
    held = {key: status[key] for key in ("active", "queued") if isinstance(status.get(key), int)}
    if isinstance(status.get("requests"), dict):
        held["requests"] = len(status["requests"])
    if isinstance(status.get("held"), dict):  # every resource by kind: streams, jobs, rows, seats, inboxes
        held.update({k: v for k, v in status["held"].items() if isinstance(v, int) and not isinstance(v, bool)})
    return held


def sample_here() -> RestSample:
    """This process at rest, after a collection (an array only a reference cycle kept is not held)."""
    harness_collect()
    mx = sys.modules.get("mlx.core")
    active = int(mx.get_active_memory()) if mx is not None and hasattr(mx, "get_active_memory") else None
    return RestSample(len(own_threads()), active)


def own_threads() -> list[threading.Thread]:
    """Live threads that are not the fuzzer's executor threads."""
    return [t for t in threading.enumerate() if t.is_alive() and not t.name.startswith(THREAD_PREFIX)]


def lingering(before: set[threading.Thread]) -> list[str]:
    """Names of the threads started since `before` that are still alive after a short join (`THREAD_JOIN_S`
    in all): a thread on its way out is not left behind."""
    new = [t for t in own_threads() if t not in before]
    deadline = time.monotonic() + THREAD_JOIN_S
    for thread in new:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    return [t.name for t in new if t.is_alive()]


def server_floor(trace: Trace) -> Optional[RestSample]:
    """The lowest thread count and active memory a launched server's sentinel saw at an MLX entry in this
    scenario (`rest` on its spans); None if it recorded none."""
    seen = [RestSample.from_json(span.info["rest"]) for span in trace.of("mlx") if span.info.get("rest")]
    if not seen:
        return None
    memory = [s.mlx_active for s in seen if s.mlx_active is not None]
    return RestSample(min(s.threads for s in seen), min(memory) if memory else None)


@dataclass
class RestSeries:
    """The rest state after each scenario on one engine (or one launched server), oldest first."""

    samples: list[RestSample] = field(default_factory=list)
    completed: int = 0  # requests this engine completed, so far: warm once it has one
    first_threads: Optional[int] = None  # threads at its first sample
    peak: int = 0  # the most requests one scenario on it sent (its follow-up counted)

    def add(self, sample: RestSample, requests: int = 0) -> list[dict[str, Any]]:
        """Append `sample`, taken after a scenario of `requests`; the window the drift is judged on, as the
        trace records it."""
        self.samples.append(sample)
        del self.samples[:-(DRIFT_SCENARIOS + 1)]
        self.first_threads = sample.threads if self.first_threads is None else self.first_threads
        self.peak = max(self.peak, requests)
        return [s.to_json() for s in self.samples]

    @property
    def pool_bound(self) -> int:
        """The most threads a pool sized by demand may leave at rest, over the first sample: one per request
        at once, or as many as Python's default executor (`asyncio.to_thread`) holds on this machine, whichever
        is more. That executor starts a thread for a job no idle one takes and keeps it: on GPU runs the
        reference server's went from 4 to 14 as scenarios of up to 10 requests came, and from 6 to 23 on a
        16-core machine (its bound there is 20), with nothing leaked."""
        return (self.first_threads or 0) + max(self.peak, DEFAULT_POOL_THREADS)


def tolerance(sample: RestSample) -> int:
    """The memory one scenario may move the rest state by: the noise, or a share of what is active."""
    return max(REST_NOISE_BYTES, int((sample.mlx_active or 0) * REST_NOISE_SHARE))


def climbs(values: list[int], step: int, total: int) -> bool:
    """Whether `values` never fell by more than `step` from one to the next, and rose by more than half of
    `total` in each half: still climbing at the end, unlike a cache that filled up early in the window."""
    if len(values) <= DRIFT_SCENARIOS or any(b < a - step for a, b in zip(values, values[1:])):
        return False
    mid = len(values) // 2
    return values[mid] - values[0] > total / 2 and values[-1] - values[mid] > total / 2


@yields(
    ViolationKind(
        "thread-left-at-rest", "One request on a warm engine at rest left a thread behind it.", exact=False,
        why="Threads started during the follow-up request (the scenario's own requests had ended, and the engine "
            "had completed one before) were still alive after it ended and a 2 s join: one more per request. "
            "Leftovers: a thread slower than the join to end counts, so it counts once it replays.",
        known_problems="In-process targets only (a server's threads are judged by `rest-drift`); a pool that "
                       "starts its first worker on a request it could have served idle is reported."),
    ViolationKind(
        "memory-left-at-rest", "One request on a warm engine at rest left MLX memory behind it.", exact=False,
        why="MLX active memory after the follow-up request against before it, both at rest on a warm engine, "
            "beyond 128 KiB (twice the 56 KB the reference engines' rest state moves by) or 0.1 % of what is "
            "active: arrays a finished request still holds. Leftovers and sizes: a cache the request filled "
            "(a prompt cache of a new prompt) looks the same, so it counts once it replays.",
        known_problems="In-process targets only; blind to a leak under the tolerance per request (see "
                       "`rest-drift`), and MLX's active memory counts arrays, not the allocator's cache."),
    ViolationKind(
        "rest-drift", "The rest state climbed scenario after scenario on one engine (threads or MLX memory).",
        exact=False,
        why="The rest state after each of the last 9 scenarios on one engine never fell by more than the noise "
            "and rose in each half of them by more than twice it (MLX active memory), or by more than 2 threads "
            "on a launched server, there to past its first count plus the most requests one scenario sent or "
            "the size of Python's default executor on the machine, whichever is more (a pool that grows to the "
            "demand it met and keeps its threads stays under that): one leak per request "
            "or per abort, still going at the end. A cache still filling up looks the same for its first "
            "scenarios, so it counts once it replays: the scenario again and again on one fresh engine, where a "
            "cache would fill again. Not shrunk.",
        known_problems="Needs 9 scenarios on one engine: a violation retires it earlier. A bounded cache larger "
                       "than 9 scenarios' prompts grows as a leak does until it is full. A server's thread leak "
                       "counts only past its pool allowance, so one of a thread per abort shows late."),
)
def stays_at_rest(trace: Trace) -> Iterator[Violation]:
    """Once every request has ended the engine is back at rest: one request leaves nothing behind, and
    scenario after scenario the rest state does not climb."""
    for check in trace.of("check", "rest"):
        info = check.info
        if info.get("warm") and info.get("before") and info.get("after"):
            before, after = RestSample.from_json(info["before"]), RestSample.from_json(info["after"])
            if info.get("threads_left"):
                yield Violation("thread-left-at-rest",
                                f"the follow-up request left {len(info['threads_left'])} thread(s) alive at rest: "
                                f"{', '.join(info['threads_left'])} ({before.threads} threads before it, "
                                f"{after.threads} after)")
            grew = (after.mlx_active or 0) - (before.mlx_active or 0)
            if before.mlx_active is not None and after.mlx_active is not None and grew > tolerance(before):
                yield Violation("memory-left-at-rest",
                                f"the follow-up request left {grew} bytes of MLX memory active at rest "
                                f"({before.mlx_active} before it, {after.mlx_active} after; tolerance "
                                f"{tolerance(before)})")
        yield from _drift(info.get("series") or [], info.get("where", "in-process"), info.get("pool_bound", 0))


def _drift(series: list[dict[str, Any]], where: str, pool_bound: int = 0) -> Iterator[Violation]:
    """The window's rest state climbing: MLX memory anywhere, a launched server's threads once past what a
    pool sized by demand may hold (`RestSeries.pool_bound`)."""
    samples = [RestSample.from_json(s) for s in series]
    memory = [s.mlx_active for s in samples]
    if samples and all(m is not None for m in memory):
        noise = tolerance(samples[0])
        if climbs(memory, noise, DRIFT_STEPS * noise):
            yield Violation("rest-drift", f"MLX active memory at rest climbed over {len(memory) - 1} scenarios "
                                          f"on one engine ({where}): {memory[0]} -> {memory[-1]} bytes "
                                          f"(noise {noise})", detail=" ".join(map(str, memory)))
            return
    threads = [s.threads for s in samples]
    if where == "server" and climbs(threads, 0, DRIFT_THREADS) and threads[-1] > pool_bound:
        yield Violation("rest-drift", f"threads at rest climbed over {len(threads) - 1} scenarios on the server: "
                                      f"{threads[0]} -> {threads[-1]}, past {pool_bound} (a pool of one thread per "
                                      f"request at once)", detail=" ".join(map(str, threads)))


REST_ORACLES = (stays_at_rest,)
# Kinds a single scenario on a fresh engine cannot show: their replays repeat the scenario on one engine, and
# they are not shrunk (fuzz/runner.py).
REPEATED_KINDS = frozenset({"rest-drift"})
