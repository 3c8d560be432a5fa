"""Engine-test helpers: run an engine on a fresh loop, and control the owner thread at named points."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional

import pytest

from mlx_invariants.engine import EngineConfig, Pending, SamplingParams
from mlx_invariants.engine.points import Point, set_hook

from ..conftest import WAIT_S


@dataclass
class Hold:
    """Stops the thread that reaches a point until `release` is set; optionally raises after."""

    point: Point
    rid: str
    step: Optional[int] = None
    error: Optional[BaseException] = None
    reached: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def matches(self, point: Point, rid: str, info: dict[str, Any]) -> bool:
        return (point is self.point and rid == self.rid and not self.reached.is_set()
                and (self.step is None or info.get("step") == self.step))


class Points:
    """The points hook for tests: records (point, rid, info, thread name) and applies holds/failures."""

    def __init__(self) -> None:
        self.events: list[tuple[Point, str, dict[str, Any], str]] = []
        self._holds: list[Hold] = []
        self._lock = threading.Lock()

    def __call__(self, point: Point, rid: str, info: dict[str, Any]) -> None:
        with self._lock:
            self.events.append((point, rid, dict(info), threading.current_thread().name))
            hold = next((h for h in self._holds if h.matches(point, rid, info)), None)
            if hold is not None:
                hold.reached.set()
        if hold is not None:
            assert hold.release.wait(2 * WAIT_S), f"test never released {point} for {rid}"
            if hold.error is not None:
                raise hold.error

    def hold(self, point: Point, rid: str, step: Optional[int] = None) -> Hold:
        hold = Hold(point, rid, step)
        self._holds.append(hold)
        return hold

    def fail(self, point: Point, rid: str, step: Optional[int] = None, held: bool = False) -> Hold:
        """Raise at the point (after a hold if `held`), as if the MLX call there had failed."""
        hold = Hold(point, rid, step, error=RuntimeError(f"injected failure at {point.name}"))
        if not held:
            hold.release.set()
        self._holds.append(hold)
        return hold

    def order(self, rid: str) -> list[Point]:
        return [p for p, r, _, _ in list(self.events) if r == rid]

    def count(self, point: Point, rid: str) -> int:
        return self.order(rid).count(point)


@pytest.fixture
def points():
    recorder = Points()
    previous = set_hook(recorder)
    yield recorder
    set_hook(previous)


def run_engine(engine_cls, body: Callable[[Any], Awaitable[None]], **config: Any) -> None:
    """Start the engine on a fresh event loop, run `body(engine)`, always shut it down."""

    async def main() -> None:
        engine = engine_cls(EngineConfig(**config))
        await engine.start()
        try:
            await body(engine)
        finally:
            await engine.shutdown(grace_s=2.0)

    asyncio.run(main())


def request(engine: Any, rid: str, max_tokens: int = 16, text: str = "hello world", **params: Any) -> Pending:
    prompt = tuple(engine.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                        add_generation_prompt=True))
    return Pending(rid, prompt, SamplingParams(max_tokens=max_tokens, **params))


async def consume(stream) -> list:
    """Read a stream to its end the way a server handler does: close it in `finally`."""
    try:
        return [token async for token in stream]
    finally:
        await stream.aclose()


async def wait_until(condition: Callable[[], bool], timeout: float = WAIT_S) -> bool:
    """Yield to the loop until `condition()` holds; False on timeout (callers assert it)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.001)
    return True
