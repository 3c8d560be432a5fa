"""The adapter protocol: all the fuzzer needs from an engine, small enough to write in a page.

An adapter starts one fresh engine, opens requests described by `RequestSpec`
(for one scenario, or for many in a row when the fuzzer reuses the engine),
and shuts the engine down. A `Handle` is one open request: iterate it for its
tokens, abort it, close it (always, in a `finally`). Engines that mark named
points (`engine.points`-style modules) hand the fuzzer their hook setter, so
faults land exactly there; engines without points are fuzzed at the points
the client itself sees (ADMITTED, CHUNK_SENT).

An in-process adapter is also started again after its shutdown returned,
inside one scenario (the "restart" fault): the engine must then serve as a
fresh one would. Restart the same engine there, as a server does on a config
reload, so what its stop left behind is found; an adapter may build a new
engine instead, which the restart then does not test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Optional, Protocol

from mlx_invariants.fuzz.errors import TargetError
from mlx_invariants.fuzz.scenario import CLIENT_POINTS, POINTS, RequestSpec

if TYPE_CHECKING:
    from mlx_invariants.fuzz.transport import Answer

# What a point hook hands back, when not None, is awaited by a loop-side caller before it goes on.
PointHook = Callable[[Any, str, dict], Optional[Awaitable[None]]]
POINT_NAMES = POINTS + CLIENT_POINTS

_WORDS = ("the quick owner thread keeps every metal command buffer to itself while the loop streams "
          "tokens to each client and admission answers busy at once").split()


def prompt_text(spec: RequestSpec) -> str:
    """The deterministic prompt of `spec`: `prompt_len` words, different per request id (the driver's
    per-run suffix after "~" does not count)."""
    offset = sum(map(ord, spec.rid.split("~", 1)[0]))
    return " ".join(_WORDS[(offset + i) % len(_WORDS)] for i in range(spec.prompt_len))


@dataclass(frozen=True)
class Outcome:
    kind: str  # completed | aborted | error
    reason: str = ""
    message: str = ""
    answer: Optional["Answer"] = None  # over HTTP, how a failure was answered (status, where the error was)


@dataclass
class Returned:
    """What a client saw of its answer beyond the tokens: the text of each token (in-process) or chunk (over
    HTTP) that carried some, whether a log-probability came with it, and how many top alternatives (the
    fewest among a chunk's tokens). Judged against what the request asked for (fuzz/surface.py)."""

    unit: str = "token"  # "chunk" over HTTP, where a server may not offer log-probabilities at all
    texts: list[str] = field(default_factory=list)
    logprobs: list[bool] = field(default_factory=list)
    alternatives: list[int] = field(default_factory=list)

    def add(self, text: str, logprob: bool, alternatives: int = 0) -> None:
        if text:
            self.texts.append(text)
            self.logprobs.append(logprob)
            self.alternatives.append(alternatives)

    def to_info(self) -> dict[str, Any]:
        return {"text": "".join(self.texts), "logprobs": list(self.logprobs), "alternatives": list(self.alternatives),
                "unit": self.unit}


class Handle(Protocol):
    def __aiter__(self) -> AsyncIterator[Any]: ...   # the tokens, as the engine yields them
    async def wait_ended(self) -> None: ...           # non-streaming: until the terminal event
    def outcome(self) -> Outcome: ...                 # once ended
    def abort(self) -> bool: ...                      # True if the engine acknowledged it
    async def close(self) -> None: ...                # must be awaited in a finally
    # Optional: `returned` (a `Returned`), what the client saw of the text and log-probabilities so far.


class Adapter(Protocol):
    name: str
    owner: Optional[str]       # who may enter MLX: a thread-name glob, "sticky", or None
    busy_bound_s: float        # how long a refusal may take

    def set_point_hook(self, hook: Optional[PointHook]) -> None: ...   # no-op for engines without points
    async def start(self) -> None: ...                                 # also again, after shutdown() returned
    async def submit(self, spec: RequestSpec) -> Handle: ...           # raises fuzz.errors.Refused
    async def shutdown(self) -> None: ...                              # idempotent
    def status(self) -> dict[str, int]: ...                            # held slots/queue entries; {} if unknown
    # Optional: `healthy` (bool). False after a scenario makes the next one start a fresh engine.
    # Optional: `async submit_scored(spec) -> Handle`, greedy as `submit`, whose handle's `leads` (a list) holds
    # per token the likeliest log-probability minus the second's (None: unknown); without it, a request's
    # output with others in flight is not compared with its output alone (fuzz/differential.py).
    # Optional: `capacity()` (int or None): requests the engine holds at once, slots and queue; scenarios
    # then draw past it (`capacity_of`).
    # Optional: `points` (point names): the only points its engine reaches, where it marks few (an engine without
    # points of its own: the client's ADMITTED and CHUNK_SENT); faults are then aimed there alone (`points_of`).
    # Optional: `broken_invariants()` (list of str): the engine's own invariants that do not hold now, asked at
    # every point on the thread that reached it ([] where it cannot judge); each is `engine-invariant-broken`.
    # It may be asked inside the engine's own critical sections: it must take none of the engine's locks.


def points_of(adapter: Adapter) -> Optional[tuple[str, ...]]:
    """The points the adapter declares its engine reaches (`points`: names or `Point` members), None if it
    declares none (fuzz/aims.py then reads them off the baseline). An unknown name is a setup mistake."""
    declared = getattr(adapter, "points", None)
    if declared is None:
        return None
    names = tuple(getattr(p, "name", p) for p in declared)
    unknown = [n for n in names if n not in POINT_NAMES]
    if not names or unknown:
        raise TargetError(f"{getattr(adapter, 'name', 'the adapter')}: points must name some of "
                          f"{', '.join(POINT_NAMES)}, got {declared!r}")
    return names


def capacity_of(adapter: Adapter) -> Optional[int]:
    """The adapter's `capacity()` (or a plain `capacity` attribute), once its engine started; None if it
    gives none. A value that is not a positive whole number is a setup mistake, not "unknown"."""
    capacity = getattr(adapter, "capacity", None)
    value = capacity() if callable(capacity) else capacity
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TargetError(f"{getattr(adapter, 'name', 'the adapter')}: capacity() must be a positive number "
                          f"of requests or None, got {value!r}")
    return value
