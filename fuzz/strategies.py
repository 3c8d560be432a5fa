"""`scenarios()`: the Hypothesis strategy behind every fuzz run.

Drawn as one composite so that shrinking removes whole requests and faults
and moves points towards the front of `POINTS` (the simplest timing).
"""

from __future__ import annotations

from hypothesis import strategies as st

from fuzz.scenario import (EXECUTORS, FAULT_KINDS, INDEXED_POINTS, POINTS, RAISE_POINTS, ROUTES, At, FaultSpec,
                           RequestSpec, Scenario)


@st.composite
def _at(draw: st.DrawFn, rids: list[str], max_tokens: dict[str, int], points: tuple[str, ...]) -> At:
    rid = draw(st.sampled_from(rids))
    point = draw(st.sampled_from(points))
    index = draw(st.integers(0, max_tokens[rid] - 1)) if point in INDEXED_POINTS else 0
    return At(rid, point, index)


@st.composite
def scenarios(draw: st.DrawFn, *, max_requests: int = 3, min_faults: int = 1, max_faults: int = 2,
              kinds: tuple[str, ...] = FAULT_KINDS, points: tuple[str, ...] = POINTS,
              executors: tuple[str, ...] = EXECUTORS, max_tokens: int = 10, routes: tuple[str, ...] = ROUTES,
              arrivals: bool = True) -> Scenario:
    """Scenarios of 1..max_requests requests and min..max faults, each fault aimed at a named point.

    "raise" faults are only aimed at points inside the worker's MLX work, where
    they stand for an error inside an MLX call.
    """
    count = draw(st.integers(1, max_requests))
    requests: list[RequestSpec] = []
    budget: dict[str, int] = {}
    for i in range(count):
        rid = f"r{i}"
        earlier = [r.rid for r in requests]
        arrival = None
        if arrivals and earlier and draw(st.booleans()):
            arrival = draw(_at(earlier, budget, points))
        spec = RequestSpec(
            rid=rid,
            prompt_len=draw(st.integers(1, 12)),
            max_tokens=draw(st.integers(1, max_tokens)),
            stream=draw(st.booleans()),
            route=draw(st.sampled_from(routes)),
            arrival=arrival,
        )
        requests.append(spec)
        budget[rid] = spec.max_tokens
    rids = [r.rid for r in requests]
    faults: list[FaultSpec] = []
    for _ in range(draw(st.integers(min_faults, max_faults))):
        kind = draw(st.sampled_from(kinds))
        allowed = tuple(p for p in points if p in RAISE_POINTS) if kind == "raise" else points
        if not allowed:
            continue
        faults.append(FaultSpec(kind, draw(_at(rids, budget, allowed))))
    return Scenario(tuple(requests), tuple(faults), draw(st.sampled_from(executors)))
