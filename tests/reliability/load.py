"""A bounded loopback load generator: steady clients, bursts beyond capacity, and clients that walk away.

Every attempt ends in exactly one outcome, judged by the client:
    completed     200 with a whole answer (SSE: a finish chunk, then `[DONE]`)
    busy          503 with a busy/shutting-down code and Retry-After
    disconnected  the client hung up on purpose (early, mid-generation or mid-stream)
    unexpected    anything else: a 5xx, a dropped connection, a stream without `[DONE]`, an error event
The run stops by itself at its deadline, or, for the outcomes in `Plan.until_seen`,
once each has happened (a loaded machine fits fewer attempts in the time); the pauses
below are the clients' pace (think time, a jittered back-off), never a way to order events.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import httpx

from .answers import BUSY_CODES

WORDS = "the model token stream thread lock request cancel worker owner batch decode prefill hello world".split()
ROUTE = "/v1/chat/completions"


@dataclass(frozen=True)
class Plan:
    seconds: float
    clients: int = 4                 # steady clients, each one request at a time
    burst_size: int = 24             # simultaneous requests fired every `burst_every_s`
    burst_every_s: float = 3.0
    walk_away: float = 0.35          # share of steady attempts that disconnect on purpose
    max_tokens: int = 40
    seed: int = 0
    finish_reasons: frozenset = frozenset({"stop", "length"})
    until_seen: frozenset = frozenset()  # outcomes the run goes on for past `seconds` until each has happened
    backstop_s: float = 120.0            # ... but no longer than this past `seconds`


@dataclass
class Attempt:
    stream: bool
    max_tokens: int
    prompt_words: int
    leave: Optional[str] = None      # None, "early" (queue or prefill), "mid-generation", "mid-stream"
    leave_after: float = 0.0         # seconds (early, mid-generation) or chunks (mid-stream)


@dataclass
class Result:
    outcomes: collections.Counter = field(default_factory=collections.Counter)
    left: collections.Counter = field(default_factory=collections.Counter)
    unexpected: list[str] = field(default_factory=list)
    attempts: int = 0
    seconds: float = 0.0

    def add(self, outcome: str, detail: str = "") -> None:
        self.outcomes[outcome] += 1
        if outcome == "unexpected" and len(self.unexpected) < 20:
            self.unexpected.append(detail)

    def line(self) -> str:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.outcomes.items()))
        left = ", ".join(f"{n} {k}" for k, n in sorted(self.left.items()))
        return f"{self.attempts} attempts in {self.seconds:.0f}s: {kinds} (left: {left or 'none'})"


def chat_body(model: str, attempt: Attempt, rng: random.Random) -> dict[str, Any]:
    text = " ".join(rng.choice(WORDS) for _ in range(attempt.prompt_words))
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": attempt.max_tokens,
            "temperature": 0.8, "seed": rng.randrange(2**31), "stream": attempt.stream}


def judge_once(response: httpx.Response, finish_reasons: frozenset) -> tuple[str, str]:
    if response.status_code == 503:
        code = _error_code(response.content)
        if code in BUSY_CODES and response.headers.get("retry-after"):
            return "busy", ""
        return "unexpected", f"503 with code {code!r} or no Retry-After"
    if response.status_code != 200:
        return "unexpected", f"{response.status_code}: {response.text[:200]}"
    reason = response.json()["choices"][0]["finish_reason"]
    return ("completed", "") if reason in finish_reasons else ("unexpected", f"finish_reason {reason!r}")


def judge_stream(events: list[str], finish_reasons: frozenset) -> tuple[str, str]:
    if not events or events[-1] != "[DONE]":
        return "unexpected", f"stream ended without [DONE] after {len(events)} events"
    payloads = [json.loads(e) for e in events[:-1]]
    if any("error" in p for p in payloads):
        return "unexpected", f"error event in stream: {next(p for p in payloads if 'error' in p)}"
    reasons = [c["finish_reason"] for p in payloads for c in p.get("choices", []) if c.get("finish_reason")]
    if len(reasons) != 1 or reasons[0] not in finish_reasons:
        return "unexpected", f"finish reasons {reasons}"
    return "completed", ""


def _error_code(raw: bytes) -> Optional[str]:
    try:
        return json.loads(raw)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


async def attempt_once(client: httpx.AsyncClient, model: str, attempt: Attempt, rng: random.Random,
                       finish_reasons: frozenset) -> tuple[str, str]:
    """One request, driven to its outcome; a planned hang-up closes the connection at the chosen moment."""
    body = chat_body(model, attempt, rng)
    try:
        if attempt.leave in ("early", "mid-generation"):
            try:
                response = await asyncio.wait_for(client.post(ROUTE, json=body), attempt.leave_after)
            except asyncio.TimeoutError:
                return "disconnected", ""
            return _finished_first(response, attempt, finish_reasons)
        async with client.stream("POST", ROUTE, json=body) as response:
            if response.status_code != 200 or not attempt.stream:
                await response.aread()
                return judge_once(response, finish_reasons)
            events: list[str] = []
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
                    if attempt.leave == "mid-stream" and len(events) >= attempt.leave_after:
                        return "disconnected", ""  # leaving the block closes the connection mid-stream
            return judge_stream(events, finish_reasons)
    except httpx.HTTPError as exc:
        return "unexpected", f"{type(exc).__name__}: {exc}"


def _finished_first(response: httpx.Response, attempt: Attempt, finish_reasons: frozenset) -> tuple[str, str]:
    """The answer came before the planned hang-up: judge it like any other."""
    if attempt.stream and response.status_code == 200:
        events = [l.removeprefix("data: ") for l in response.text.split("\n\n") if l.startswith("data: ")]
        return judge_stream(events, finish_reasons)
    return judge_once(response, finish_reasons)


def plan_attempt(plan: Plan, rng: random.Random, steady: bool) -> Attempt:
    attempt = Attempt(stream=rng.random() < 0.5, max_tokens=rng.randint(1, plan.max_tokens),
                      prompt_words=rng.choice([3, 10, 60, 300]))
    if steady and rng.random() < plan.walk_away:
        attempt.leave = rng.choice(["early", "mid-generation"] + (["mid-stream"] if attempt.stream else []))
        attempt.leave_after = rng.randint(1, 6) if attempt.leave == "mid-stream" else (
            rng.uniform(0.0, 0.02) if attempt.leave == "early" else rng.uniform(0.02, 0.3))
    return attempt


async def run(url: str, model: str, plan: Plan) -> Result:
    """Steady clients and periodic bursts until `plan.seconds` have passed; every started attempt is awaited."""
    result = Result()
    deadline = time.monotonic() + plan.seconds
    started = time.monotonic()

    def going(ahead_s: float = 0.0) -> bool:
        """Before the deadline (`ahead_s` from now); past it while an outcome of `until_seen` is missing."""
        now = time.monotonic() + ahead_s
        missing = any(not result.outcomes[kind] for kind in plan.until_seen)
        return now < deadline or (missing and now < deadline + plan.backstop_s)

    # Idle connections expire well before uvicorn's 5 s keep-alive timeout: reusing one the server is closing
    # at that moment is a client-side race of HTTP/1.1, not a server fault.
    limits = httpx.Limits(max_connections=plan.burst_size + plan.clients, keepalive_expiry=1.0)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def one(rng: random.Random, steady: bool) -> None:
            attempt = plan_attempt(plan, rng, steady)
            outcome, detail = await attempt_once(client, model, attempt, rng, plan.finish_reasons)
            if outcome == "unexpected":
                detail = f"{detail} ({attempt})"
            result.attempts += 1
            if outcome == "disconnected":
                result.left[attempt.leave] += 1
            result.add(outcome, detail)
            if outcome == "busy":
                await asyncio.sleep(rng.uniform(0.005, 0.05))  # a client's jittered back-off

        async def steady(index: int) -> None:
            rng = random.Random(plan.seed * 1000 + index)
            while going():
                await one(rng, True)

        async def bursts() -> None:
            rng = random.Random(plan.seed * 1000 - 1)
            while going(plan.burst_every_s):
                await asyncio.sleep(plan.burst_every_s)  # the burst schedule, not an ordering device
                await asyncio.gather(*(one(random.Random(rng.random()), False) for _ in range(plan.burst_size)))

        await asyncio.gather(bursts(), *(steady(i) for i in range(plan.clients)))
    result.seconds = time.monotonic() - started
    return result
