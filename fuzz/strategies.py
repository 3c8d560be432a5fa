"""`scenarios()`: the Hypothesis strategy behind every fuzz run.

Drawn so that shrinking removes whole requests and faults and moves points
towards the front of `POINTS` (the simplest timing). Requests and faults are
Hypothesis lists, whose elements the shrinker deletes without shifting the
draws after them; faults and arrivals aim at a request by number, clamped to
the requests there are. (A count drawn up front made every deletion
reinterpret the draws that followed, so shrinking stalled at three requests.)

Lengths (prompt words, token budgets, decode steps aimed at) are short
(1..`short`) unless a rare selector draw makes them long (up to the
profile's `long_prompt` / `long_tokens`): long prompts and budgets reach the
windows that only open during a long prefill or a long decode, while the
selector shrinks to "short", so a found bug still shrinks to small numbers.
A "cancel-in-call" fault (the worker goes on into its next MLX call while
the cancel lands) gives its request a long prompt one time in
`IN_CALL_LONG_ODDS`, where the profile allows long ones: the prefill it
races is then long enough to be a real window.

One fault of a kind that hits a client (`VICTIM_KINDS`) in `ACROSS_ODDS`
hits another request than the one whose point triggers it ("cancel r1 at
r0@BEFORE_DECODE(2)"): a request waiting in the engine's admission queue
reaches no point, so only another request's point can cancel it while it
waits. Victims are drawn last (`_victims`) and shrink to "the same request".

A request a client goes away from (a cancel or disconnect, `GONE_KINDS`) draws, one time in `GONE_ODDS`,
a budget of `gone_tokens` (`_outlast`): at least `GONE_TOKENS` (`GONE_STEPS` + 2), past what the compute
oracle allows after a client went, and where the runner measured the pace about a second of decoding,
past a server's disconnect poll (fuzz/pace.py: `gone_budget`). Short budgets end before either window
opens, and a correct engine stops such a request at once, so the long budget costs little where there is
no bug. Drawn last, after the crowd, and shrinks to the budget drawn before.

Every "one time in N" is `_one_in`, fair coins rather than a bounded integer's
top value, which Hypothesis draws less often than 1 in N. Measured over 2000
derandomized scenarios (runner shapes, a crowd of 29): surface asks 24.5 %
(designed 25), edge lengths 12.5 % (12.5), long lengths 11.5 % (12.5), a
fault delivered together 29.5 % (33); the draws at a scenario's tail still
come out lower, crowds 21 % and victims 18 % (25), which is why a burst past
the capacity is in the seed corpus too (fuzz/corpus.py).

Each request also draws what it asks for beyond the plain greedy answer
(`_asks`, in the reference engine's terms, `RequestSpec`): now and then
sampling, log-probabilities and stop strings, now and then an edge length (a
one-word prompt, a one-token budget, the profile's longest prompt). Each draw's
0 is the plain request, so shrinking drops whatever a finding does not need.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from hypothesis import strategies as st

from mlx_invariants.fuzz.compute import GONE_TOKENS
from mlx_invariants.fuzz.faults import IN_CALL
from mlx_invariants.fuzz.scenario import (AFTER_END_POINTS, DEFAULT_KINDS, EXECUTORS, FAULT_KINDS, INDEXED_POINTS,
                                          POINTS, ROUTES, MAX_STOPS, VICTIM_KINDS, At, FaultKind, FaultSpec,
                                          RequestSpec, Scenario, aimable)
from mlx_invariants.points import Point


def _first_index(point: str) -> int:
    """Decode step k follows k produced tokens: the first is step 1 (the prefill samples token 0)."""
    return Point[point].first_index


SHORT_PROMPT = 12   # prompt words drawn when a length is short
SHORT_TOKENS = 10   # token budget (and decode step aimed at) when short
LONG_ODDS = 8       # one length in this many is drawn long (where the profile allows long ones)
DEEP_ODDS = 4       # one decode step aimed at in this many is drawn long: it reaches deep only into a long request
TOGETHER_ODDS = 3   # one fault in this many is delivered together with the fault before it
IN_CALL_LONG_ODDS = 2   # one cancel-in-call in this many gives its request a long prompt (where allowed)
ACROSS_ODDS = 4     # one fault of a victim kind in this many hits another request than the one at its point


@st.composite
def _one_in(draw: st.DrawFn, odds: int) -> bool:
    """True one time in `odds` (exactly for a power of two, else within 1/16 of it), from fair coins: Hypothesis's
    bounded integers favour small values, so `integers(0, 3) == 3` came out 18 to 24 % over 2000 draws, not 25.
    Shrinks to False."""
    if odds & (odds - 1) == 0:
        return all(draw(st.booleans()) for _ in range(odds.bit_length() - 1))
    bits = odds.bit_length() + 3
    value = 0
    for _ in range(bits):
        value = value * 2 + draw(st.booleans())
    return value >= 2 ** bits - round(2 ** bits / odds)


@st.composite
def _length(draw: st.DrawFn, short: int, long: int, odds: int = LONG_ODDS) -> int:
    """1..short, or short+1..long one time in `odds`; both shrink towards 1 through the short branch."""
    if long > short and draw(_one_in(odds)):
        return draw(st.integers(short + 1, long))
    return draw(st.integers(1, short))


Aim = tuple[int, str, int]  # request number, point, index: resolved against the drawn requests


@st.composite
def _aim(draw: st.DrawFn, points: tuple[str, ...], max_requests: int, max_tokens: int, long_tokens: int) -> Aim:
    point = draw(st.sampled_from(points))
    index = draw(_length(max_tokens, long_tokens, DEEP_ODDS)) - 1 if point in INDEXED_POINTS else 0
    return draw(st.integers(0, max_requests - 1)), point, index


def _resolve(aim: Aim, candidates: list[RequestSpec]) -> At:
    """The aimed request (clamped to those there are) and an index its decode can reach."""
    number, point, index = aim
    target = candidates[min(number, len(candidates) - 1)]
    first = _first_index(point)
    return At(target.rid, point, max(first, min(index, target.max_tokens - 1)))


@st.composite
def _fault(draw: st.DrawFn, kinds: tuple[str, ...], points: tuple[str, ...], max_requests: int,
           max_tokens: int, long_tokens: int, long_prompt: int, armed: bool) -> tuple[str, Aim, bool, Optional[int]]:
    """A kind, an aim, whether it rides on the fault before it instead (one time in `TOGETHER_ODDS`), and
    for a cancel-in-call now and then a long prompt for the request it aims at (None: leave it)."""
    kind = draw(st.sampled_from(kinds))
    allowed = tuple(p for p in points if aimable(kind, p, armed))
    aim = draw(_aim(allowed, max_requests, max_tokens, long_tokens))
    together = draw(_one_in(TOGETHER_ODDS))
    prompt = None
    if kind == IN_CALL and long_prompt > SHORT_PROMPT and draw(_one_in(IN_CALL_LONG_ODDS)):
        prompt = draw(st.integers(SHORT_PROMPT + 1, long_prompt))
    return kind, aim, together, prompt


def _faults(drawn: list[tuple[str, Aim, bool]], requests: list[RequestSpec], armed: bool = False) -> tuple[FaultSpec, ...]:
    """Faults at their aims; one drawn "together" is delivered right after the fault before it, at its point,
    in the same loop turn: a second cancel before the first is taken, a cancel while shutdown is closing."""
    faults: list[FaultSpec] = []
    for kind, aim, together in drawn:
        same = together and bool(faults) and aimable(kind, faults[-1].at.point, armed)
        faults.append(FaultSpec(kind, faults[-1].at if same else _resolve(aim, requests)))
    return tuple(faults)


@st.composite
def _victims(draw: st.DrawFn, faults: tuple[FaultSpec, ...], requests: list[RequestSpec]) -> tuple[FaultSpec, ...]:
    """`faults`, one of a victim kind in `ACROSS_ODDS` given another request to hit, where there is one.

    Drawn after everything else in a scenario, so the rest is drawn as it was before victims existed
    (the derandomized ci draws, and where shrinking ends for the catalogue's mutants, stay put)."""
    out = []
    for fault in faults:
        others = [r.rid for r in requests if r.rid != fault.at.rid]
        if fault.kind in VICTIM_KINDS and others and draw(_one_in(ACROSS_ODDS)):
            fault = replace(fault, rid=others[draw(st.integers(0, len(others) - 1))])
        out.append(fault)
    return tuple(out)


def _lengthen(requests: list[RequestSpec], faults: tuple[FaultSpec, ...],
              prompts: list[Optional[int]]) -> list[RequestSpec]:
    """`requests` with each long prompt drawn with a fault given to the request that fault landed on."""
    longest = {r.rid: r.prompt_len for r in requests}
    for fault, prompt in zip(faults, prompts):
        if prompt is not None:
            longest[fault.at.rid] = max(longest[fault.at.rid], prompt)
    return [replace(r, prompt_len=longest[r.rid]) for r in requests]


SURFACE_ODDS = 4    # one request in this many asks for more than the plain greedy answer (`_asks`)
EDGE_ODDS = 8       # one request in this many gets an edge length: a one-word prompt, one token, the longest
                    # prompt or budget
TOP_LOGPROBS = 5    # most alternatives asked for per token, where the target takes them (0: none)
TEMPERATURES = (0.0, 0.7, 1.0, 1.5)
TOP_PS = (1.0, 0.9, 0.5)
# Short strings that the embedded model's gibberish (and any English) often produces, so a stop is often hit.
STOPS = ("e", " ", "a", "th", "in", "\n")


Ask = tuple[dict, Optional[str]]  # a request's fields beyond the plain greedy one, and an edge length to take


@st.composite
def _asks(draw: st.DrawFn, top_logprobs: int, long_prompt: int) -> Ask:
    """One time in `SURFACE_ODDS` sampling (temperature, top-p, a seed), log-probabilities and stop strings,
    one time in `EDGE_ODDS` an edge length. Every draw's 0 is the plain greedy request, so a found bug that
    needs none of them shrinks back to it; drawn with the request's shape, so deleting a request deletes
    its asks too."""
    fields: dict = {}
    if draw(_one_in(SURFACE_ODDS)):
        temperature = draw(st.sampled_from(TEMPERATURES))
        if temperature:
            fields.update(temperature=temperature, top_p=draw(st.sampled_from(TOP_PS)),
                          seed=draw(st.none() | st.integers(0, 2**31 - 1)))
        if draw(st.booleans()):
            fields.update(logprobs=True, top_logprobs=draw(st.integers(0, top_logprobs)) if top_logprobs else 0)
        fields["stop"] = tuple(draw(st.lists(st.sampled_from(STOPS), max_size=MAX_STOPS, unique=True)))
    edge = None
    if draw(_one_in(EDGE_ODDS)):
        longest = ("longest prompt", "longest budget") if long_prompt else ()
        edge = draw(st.sampled_from(("one-word prompt", "one token") + longest))
    return fields, edge


def _ask(request: RequestSpec, ask: Optional[Ask], aims: tuple[At, ...], long_prompt: int,
         long_tokens: int) -> RequestSpec:
    """`request` asking for what `ask` drew; a budget cut to one token only where no fault or arrival aims
    at a later step of it."""
    if ask is None:
        return request
    fields, edge = ask
    request = replace(request, **fields)
    if edge == "one-word prompt":
        return replace(request, prompt_len=1)
    if edge == "one token" and not any(at.rid == request.rid and at.index > 0 for at in aims):
        return replace(request, max_tokens=1)
    # One dimension each, so a finding that needs one long shrinks the other back (a long prompt to one token).
    if edge == "longest prompt":
        return replace(request, prompt_len=long_prompt)
    if edge == "longest budget":
        return replace(request, max_tokens=max(request.max_tokens, long_tokens))
    return request


GONE_ODDS = 2       # one request a client goes away from in this many draws the gone budget (`_outlast`)
# The kinds whose client goes away (fuzz/compute.py's gone clients); an abort keeps its client.
GONE_KINDS = frozenset(VICTIM_KINDS - {FaultKind.ABORT.value})
# Points a request reaches once its decoding is over: a long budget for a client that goes there is spent in full.
DECODED_POINTS = frozenset({Point.FINISHED.name, Point.SLOT_RELEASED.name}) | AFTER_END_POINTS


@st.composite
def _outlast(draw: st.DrawFn, requests: list[RequestSpec], faults: tuple[FaultSpec, ...],
             tokens: int) -> list[RequestSpec]:
    """`requests`, each one a gone-client fault hits before its decoding is over given `tokens` more steps than
    the step its client goes at, one time in `GONE_ODDS` (a budget already longer stays): a correct engine stops it at once, one that
    decodes on for a gone client or notices only at its next poll is still decoding when the oracle looks.
    A coin for each such request, in request order, whatever `tokens` is, so the draws do not depend on
    the measured pace."""
    leaves: dict[str, int] = {}  # each hit request's step when its client goes (0 at another request's point)
    for f in faults:
        if f.kind in GONE_KINDS and (f.victim != f.at.rid or f.at.point not in DECODED_POINTS):
            step = f.at.index if f.victim == f.at.rid and f.at.point in INDEXED_POINTS else 0
            leaves[f.victim] = min(leaves.get(f.victim, step), step)
    longer = {r.rid for r in requests if r.rid in leaves and draw(_one_in(GONE_ODDS))}
    # `tokens` left after the step the client goes at: a client drawn to leave at its fifth chunk still leaves the
    # compute oracle room past its bound (with the budget alone, 10, it left 4 steps: an oracle that cannot fire)
    return [replace(r, max_tokens=max(r.max_tokens, tokens + leaves[r.rid])) if r.rid in longer else r
            for r in requests]


CROWD_ODDS = 4      # one scenario in this many fills a target that holds more than lists usually draw (`_crowd`)


@st.composite
def _crowd(draw: st.DrawFn, drawn: int, crowd: int, max_requests: int, max_tokens: int,
           routes: tuple[str, ...]) -> list[RequestSpec]:
    """Plain requests after the `drawn` ones, one time in `CROWD_ODDS`, so that the scenario holds `crowd`
    to `max_requests` in all (none where it has `crowd` already, or `crowd` is 0).

    A Hypothesis list has a handful of elements on average, so a target holding dozens (the batched
    reference engine: 28) would almost never meet a full queue and the requests past it. Sent with the
    others, after them: the drawn requests take the seats, the crowd fills the queue behind them and
    overflows it. Drawn after the faults and their victims, so no fault aims at the crowd; the selector
    shrinks to "no crowd"."""
    if not crowd or drawn >= crowd or not draw(_one_in(CROWD_ODDS)):
        return []
    count = draw(st.integers(crowd, max(crowd, max_requests))) - drawn
    shapes = draw(st.lists(st.tuples(_length(SHORT_PROMPT, 0), _length(max_tokens, 0), st.booleans(),
                                     st.sampled_from(routes)), min_size=count, max_size=count))
    return [RequestSpec(f"r{drawn + i}", prompt_len=prompt_len, max_tokens=budget, stream=stream, route=route)
            for i, (prompt_len, budget, stream, route) in enumerate(shapes)]


@st.composite
def scenarios(draw: st.DrawFn, *, max_requests: int = 3, min_faults: int = 1, max_faults: int = 2,
              kinds: tuple[str, ...] = DEFAULT_KINDS, points: tuple[str, ...] = POINTS,
              executors: tuple[str, ...] = EXECUTORS, max_tokens: int = SHORT_TOKENS,
              routes: tuple[str, ...] = ROUTES, arrivals: bool = True, long_prompt: int = 0,
              long_tokens: int = 0, across: bool = True, armed: bool = False, surface: bool = True,
              top_logprobs: int = TOP_LOGPROBS, crowd: int = 0, gone_tokens: int = GONE_TOKENS) -> Scenario:
    """Scenarios of 1..max_requests requests and min..max faults, each fault aimed at a named point.

    Prompts run to `SHORT_PROMPT` words and budgets to `max_tokens`, now and then
    to `long_prompt` / `long_tokens` (0: never longer). "raise" faults are only
    aimed at points inside the worker's MLX work, where they stand for an
    error inside an MLX call. `across`: faults may hit another request than the one at their point.
    `armed`: the target is a launched server whose sentinel arms worker faults, so those may be aimed at
    any of its points (`aimable`). `surface`: requests may ask for sampling, log-probabilities (up to
    `top_logprobs` alternatives) and stop strings, and take edge lengths (`_asks`). `crowd`: now and then
    plain requests are added up to at least this many (0: never; `_crowd`). `gone_tokens`: the budget a
    request a client goes away from draws now and then (`_outlast`; 0: never).
    """
    aim = _aim(points, max_requests, max_tokens, long_tokens)
    shapes = draw(st.lists(st.tuples(
        _length(SHORT_PROMPT, long_prompt), _length(max_tokens, long_tokens), st.booleans(), st.sampled_from(routes),
        st.none() | aim if arrivals else st.none(), _asks(top_logprobs, long_prompt) if surface else st.none()),
        min_size=1, max_size=max_requests))
    requests: list[RequestSpec] = []
    for i, (prompt_len, budget, stream, route, arrival, _) in enumerate(shapes):
        requests.append(RequestSpec(f"r{i}", prompt_len=prompt_len, max_tokens=budget, stream=stream, route=route,
                                    arrival=_resolve(arrival, requests) if arrival and requests else None))
    kinds = tuple(k for k in kinds if any(aimable(k, p, armed) for p in points))
    drawn = draw(st.lists(_fault(kinds, points, max_requests, max_tokens, long_tokens, long_prompt, armed),
                          min_size=min_faults, max_size=max_faults))
    faults = _faults([d[:3] for d in drawn], requests, armed)
    requests = _lengthen(requests, faults, [d[3] for d in drawn])
    executor = draw(st.sampled_from(executors))
    faults = draw(_victims(faults, requests)) if across else faults
    aims = tuple(f.at for f in faults) + tuple(r.arrival for r in requests if r.arrival)
    requests = [_ask(r, shape[-1], aims, long_prompt, long_tokens) for r, shape in zip(requests, shapes)]
    requests += draw(_crowd(len(requests), crowd, max_requests, max_tokens, routes))
    if gone_tokens:
        requests = draw(_outlast(requests, faults, gone_tokens))
    return Scenario(tuple(requests), faults, executor)
