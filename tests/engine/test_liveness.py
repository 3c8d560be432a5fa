"""Owner liveness over real HTTP: a dead or wedged owner thread makes /health 503, refuses new requests
at once with a stable code, and ends the requests in flight with that error, instead of hanging them.

The owner is killed by an exception that escapes its loop (a `BaseException`, which no per-request
handler catches) raised by the points hook, and wedged by holding it at a point. Nothing here asserts a
duration: each test waits for its condition with the WAIT_S deadline.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest

from mlx_invariants.engine.points import Point, set_hook

from mlx_invariants.engine import BatchedEngine, SimpleEngine

from ..conftest import WAIT_S, ServerThread, wait_for
from .conftest import Hold, consume, request, run_engine

ENGINES = ["simple", "batched"]
STALL_S = 2.0  # the wedge tests' stall_timeout_s: above a prefill of the tiny model on a loaded box


class OwnerKilled(BaseException):
    """Escapes `except Exception` everywhere in the engine, as a bug in the owner loop itself would."""


def _chat(server: ServerThread, max_tokens: int = 200) -> dict[str, Any]:
    return {"model": server.model_id, "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True}


class StreamInBackground:
    """A streamed request read to its end on a thread: its SSE data lines, or the exception it raised."""

    def __init__(self, server: ServerThread, rid: str, max_tokens: int = 200):
        self.lines: list[str] = []
        self.status: int | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(server, rid, max_tokens), daemon=True)
        self._thread.start()

    def _run(self, server: ServerThread, rid: str, max_tokens: int) -> None:
        try:
            with httpx.stream("POST", server.url + "/v1/chat/completions", json=_chat(server, max_tokens),
                              headers={"X-Request-Id": rid}, timeout=2 * WAIT_S) as response:
                self.status = response.status_code
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.lines.append(line[len("data: "):])
        except BaseException as exc:  # reported by `ended`
            self.error = exc

    def ended(self) -> list[str]:
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), "the request in flight never ended"
        assert self.error is None, repr(self.error)
        return self.lines


def _error_frame(lines: list[str]) -> dict[str, Any]:
    assert lines[-1] == "[DONE]", lines[-3:]
    return json.loads(lines[-2])["error"]


def _health(server: ServerThread) -> httpx.Response:
    return httpx.get(server.url + "/health", timeout=WAIT_S)


def _refusal(server: ServerThread) -> httpx.Response:
    body = {**_chat(server, 4), "stream": False}
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=WAIT_S)


def _kill_at(points, point: Point, rid: str, step: int | None = None) -> Hold:
    hold = Hold(point, rid, step, error=OwnerKilled(f"owner killed at {point.name}"))
    hold.release.set()
    points._holds.append(hold)
    return hold


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("point, step", [(Point.BEFORE_DECODE, 2), (Point.WORKER_STARTED, None)])
def test_a_dead_owner_fails_health_refuses_at_once_and_ends_the_request_in_flight(points, tiny_model, engine,
                                                                                   point, step):
    with ServerThread(engine, model=tiny_model) as server:
        assert _health(server).status_code == 200
        killed = _kill_at(points, point, "chatcmpl-dies", step=step)
        flight = StreamInBackground(server, "dies")
        lines = flight.ended()
        assert killed.reached.is_set()
        assert flight.status == 200 and len(lines) >= 3  # the role chunk (and any tokens) came before the death
        # Its work is over, and marked so before its slot went: the fuzzer's slot-freed-early judges by it.
        assert wait_for(lambda: points.count(Point.SLOT_RELEASED, "chatcmpl-dies") == 1)
        assert points.count(Point.FINISHED, "chatcmpl-dies") == 1
        order = points.order("chatcmpl-dies")
        assert order.index(Point.FINISHED) < order.index(Point.SLOT_RELEASED), order
        error = _error_frame(lines)
        assert error["code"] == "engine_dead" and "OwnerKilled" in error["message"], error

        assert wait_for(lambda: _health(server).status_code == 503)
        health = _health(server).json()["error"]
        assert health["code"] == "engine_dead", health
        refused = _refusal(server)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "engine_dead"
        assert server.status()["owner"] == "dead"
        assert wait_for(lambda: server.status()["held"]["streams"] == 0), server.status()


@pytest.mark.parametrize("engine", ENGINES)
def test_a_wedged_owner_fails_health_refuses_at_once_ends_the_request_and_recovers(points, tiny_model, engine):
    with ServerThread(engine, model=tiny_model, stall_timeout_s=STALL_S) as server:
        wedge = points.hold(Point.BEFORE_DECODE, "chatcmpl-wedged", step=1)
        try:
            flight = StreamInBackground(server, "wedged", max_tokens=400)
            lines = flight.ended()  # ends on its own: nothing released the wedge
            assert wedge.reached.is_set() and not wedge.release.is_set()
            error = _error_frame(lines)
            assert error["code"] == "engine_stalled", error

            health = _health(server)
            assert health.status_code == 503 and health.json()["error"]["code"] == "engine_stalled", health.text
            refused = _refusal(server)
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "engine_stalled"
            assert server.status()["owner"] == "stalled"
        finally:
            wedge.release.set()
        # The owner moves again: the aborted request stops and the engine serves again.
        assert wait_for(lambda: _health(server).status_code == 200)
        assert server.wait_idle()
        again = httpx.post(server.url + "/v1/chat/completions", json={**_chat(server, 3), "stream": False},
                           timeout=WAIT_S)
        assert again.status_code == 200, again.text


def test_a_busy_owner_is_not_stalled(points, tiny_model):
    """Progress resets the stall clock: a request whose decode steps are each held for less than the
    timeout, and all of them together for longer, is never failed and health stays 200."""
    stall_s, held_s = 3.0, 1.2
    with ServerThread("batched", model=tiny_model, stall_timeout_s=stall_s) as server:
        holds = [points.hold(Point.BEFORE_DECODE, "chatcmpl-slow", step=s) for s in range(1, 4)]
        flight = StreamInBackground(server, "slow", max_tokens=6)
        for hold in holds:
            assert wait_for(hold.reached.is_set)
            threading.Event().wait(held_s)  # the owner sits at the point: no progress for this long
            assert _health(server).status_code == 200
            hold.release.set()
        lines = flight.ended()
        assert lines[-1] == "[DONE]" and "error" not in json.loads(lines[-2]), lines[-3:]


@pytest.mark.parametrize("engine_cls", [SimpleEngine, BatchedEngine])
def test_a_dying_owner_is_unhealthy_before_it_tells_the_loop_a_request_is_over(points, engine_cls):
    """The loop may end the request, and a client read `/health`, in the turn it hears the owner is done with
    it: by then the owner must have recorded its death (a 10-minute runner run once read healthy there)."""
    dead_at_finished: list[bool] = []

    def watch(point: Point, rid: str, info: dict[str, Any]) -> None:
        if point is Point.FINISHED and rid == "dies":
            dead_at_finished.append(owner.crashed is not None)
        points(point, rid, info)

    async def body(engine) -> None:
        nonlocal owner
        owner = engine._owner
        _kill_at(points, Point.BEFORE_DECODE, "dies", step=2)
        previous = set_hook(watch)
        try:
            await consume(await engine.submit(request(engine, "dies", max_tokens=50)))
        except Exception:  # the death's error frame: not what this test judges
            pass
        finally:
            set_hook(previous)
        assert dead_at_finished == [True]
        assert not engine.healthy

    owner = None
    run_engine(engine_cls, body)
