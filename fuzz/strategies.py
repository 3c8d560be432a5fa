"""`scenarios()`: the Hypothesis strategy behind every fuzz run.

Drawn so that shrinking removes whole requests and faults and moves points
towards the front of `POINTS` (the simplest timing). Requests and faults are
Hypothesis lists, whose elements the shrinker deletes without shifting the
draws after them; faults and arrivals aim at a request by number, clamped to
the requests there are. (A count drawn up front made every deletion
reinterpret the draws that followed, so shrinking stalled at three requests.)
"""

from __future__ import annotations

from hypothesis import strategies as st

from mlx_invariants.fuzz.scenario import (EXECUTORS, FAULT_KINDS, INDEXED_POINTS, POINTS, RAISE_POINTS, ROUTES, At, FaultSpec,
                           RequestSpec, Scenario)


def _first_index(point: str) -> int:
    """Decode step k follows k produced tokens: the first is step 1 (the prefill samples token 0)."""
    return 1 if point == "BEFORE_DECODE" else 0


Aim = tuple[int, str, int]  # request number, point, index: resolved against the drawn requests


@st.composite
def _aim(draw: st.DrawFn, points: tuple[str, ...], max_requests: int, max_tokens: int) -> Aim:
    point = draw(st.sampled_from(points))
    index = draw(st.integers(0, max_tokens - 1)) if point in INDEXED_POINTS else 0
    return draw(st.integers(0, max_requests - 1)), point, index


def _resolve(aim: Aim, candidates: list[RequestSpec]) -> At:
    """The aimed request (clamped to those there are) and an index its decode can reach."""
    number, point, index = aim
    target = candidates[min(number, len(candidates) - 1)]
    first = _first_index(point)
    return At(target.rid, point, max(first, min(index, target.max_tokens - 1)))


@st.composite
def _fault(draw: st.DrawFn, kinds: tuple[str, ...], points: tuple[str, ...], max_requests: int,
           max_tokens: int) -> tuple[str, Aim]:
    kind = draw(st.sampled_from(kinds))
    allowed = tuple(p for p in points if p in RAISE_POINTS) if kind == "raise" else points
    return kind, draw(_aim(allowed, max_requests, max_tokens))


@st.composite
def scenarios(draw: st.DrawFn, *, max_requests: int = 3, min_faults: int = 1, max_faults: int = 2,
              kinds: tuple[str, ...] = FAULT_KINDS, points: tuple[str, ...] = POINTS,
              executors: tuple[str, ...] = EXECUTORS, max_tokens: int = 10, routes: tuple[str, ...] = ROUTES,
              arrivals: bool = True) -> Scenario:
    """Scenarios of 1..max_requests requests and min..max faults, each fault aimed at a named point.

    "raise" faults are only aimed at points inside the worker's MLX work, where
    they stand for an error inside an MLX call.
    """
    aim = _aim(points, max_requests, max_tokens)
    shapes = draw(st.lists(st.tuples(
        st.integers(1, 12), st.integers(1, max_tokens), st.booleans(), st.sampled_from(routes),
        st.none() | aim if arrivals else st.none()), min_size=1, max_size=max_requests))
    requests: list[RequestSpec] = []
    for i, (prompt_len, budget, stream, route, arrival) in enumerate(shapes):
        requests.append(RequestSpec(f"r{i}", prompt_len=prompt_len, max_tokens=budget, stream=stream, route=route,
                                    arrival=_resolve(arrival, requests) if arrival and requests else None))
    if not any(p in RAISE_POINTS for p in points):
        kinds = tuple(k for k in kinds if k != "raise")
    faults = [FaultSpec(kind, _resolve(target, requests))
              for kind, target in draw(st.lists(_fault(kinds, points, max_requests, max_tokens),
                                                min_size=min_faults, max_size=max_faults))]
    return Scenario(tuple(requests), tuple(faults), draw(st.sampled_from(executors)))
