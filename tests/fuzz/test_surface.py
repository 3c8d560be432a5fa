"""The whole request surface: sampling, log-probabilities, stop strings and edge lengths, drawn by the
strategy, sent by both transports, judged where a client sees them (fuzz/surface.py), and replayable."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import find, settings

from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.scenario import At, RequestSpec, Scenario
from mlx_invariants.fuzz.session import run_scenario
from mlx_invariants.fuzz.strategies import TOP_LOGPROBS, _asks, scenarios
from mlx_invariants.fuzz.target import Target
from mlx_invariants.mutants.copies import import_copy
from mlx_invariants.mutants.mutant import Edit, Mutant

from .test_transport import REMOTE

# Stop strings the embedded model's first tokens hold ("e" within its first dozen on every prompt tried). One
# after the other (a serialized route refuses what waits past its bound), each once the one before let go.
ASKING = Scenario((
    RequestSpec("r0", prompt_len=6, max_tokens=12, stop=("e", "gh"), logprobs=True, top_logprobs=3),
    RequestSpec("r1", prompt_len=3, max_tokens=8, temperature=1.0, top_p=0.9, seed=7, logprobs=True, route="chat",
                arrival=At("r0", "SLOT_RELEASED")),
    RequestSpec("r2", prompt_len=1, max_tokens=1, arrival=At("r1", "SLOT_RELEASED")),
    RequestSpec("r3", prompt_len=5, max_tokens=6, stream=False, stop=("a",), arrival=At("r2", "SLOT_RELEASED"))))
BATCHED_SERVER = f"{sys.executable} -m mlx_invariants serve --engine batched --host 127.0.0.1 --port {{port}}"
# A copy of the engine that returns a stop string and one alternative too few.
CARELESS = Mutant(
    "T-careless", "stop strings returned, alternatives short", "planted by this test", "the request's own fields",
    killers=(), edits=(
        Edit("engine/sampling.py", 'return self._text[start:cut] if cut > start else "", True',
             "return segment, True"),
        Edit("engine/sampling.py", "k = min(k, logprobs.shape[-1])", "k = min(k - 1, logprobs.shape[-1])")))


def _ends(trace) -> dict:
    return {end.rid: end.info for end in trace.of("request", "end")}


@pytest.mark.parametrize("route", ["simple", "batched"])
def test_a_reference_engine_honours_what_each_request_asks_for(route: str):
    trace = run_scenario(Target.reference(route).build(), ASKING)
    assert judge(trace) == [], [v.message for v in judge(trace)]
    ends = _ends(trace)
    assert ends["r0"]["reason"] == "stop" and ends["r0"]["logprobs"] and all(ends["r0"]["logprobs"])
    assert set(ends["r0"]["alternatives"]) == {3}
    assert all(ends["r1"]["logprobs"]) and not any(ends["r2"]["logprobs"]) and ends["r2"]["tokens"] == 1


def test_a_stop_string_returned_and_alternatives_short_are_found(tmp_path: Path):
    trace = run_scenario(Target.reference("simple", package=import_copy(CARELESS, tmp_path)).build(), ASKING)
    found = {(v.kind, v.rid) for v in judge(trace)}
    assert found == {("stop-string-returned", "r0"), ("logprobs-not-as-asked", "r0")}, found


def test_the_reference_server_honours_them_over_http_on_both_routes_and_transports():
    engines = Target.server(BATCHED_SERVER, model="mlx-invariants-tiny").build()
    try:
        # the sampled token's log-probability only: the reference server refuses top_logprobs, as the runner knows
        over_http = Scenario((replace(ASKING.requests[0], top_logprobs=0), *ASKING.requests[1:]))
        trace = run_scenario(engines, over_http, settings=REMOTE)
    finally:
        engines.close()
    assert judge(trace) == [], [v.message for v in judge(trace)]
    ends = _ends(trace)
    assert {rid: end["outcome"] for rid, end in ends.items()} == dict.fromkeys(["r0", "r1", "r2", "r3", "followup"],
                                                                              "completed")
    assert "e" not in ends["r0"]["text"] and ends["r0"]["reason"] == "stop" and all(ends["r0"]["logprobs"])
    assert all(ends["r1"]["logprobs"]) and ends["r3"]["text"] and "a" not in ends["r3"]["text"]


def test_a_scenario_file_keeps_the_fields_and_an_old_one_reads_as_plain_greedy():
    assert Scenario.loads(ASKING.dumps()) == ASKING
    plain = Scenario.loads('{"requests": [{"rid": "r0", "prompt_len": 2, "max_tokens": 3, "stream": true, '
                           '"route": "completions", "arrival": null}]}')
    assert plain.requests[0] == RequestSpec("r0", 2, 3) and plain.requests[0].greedy
    assert plain.dumps() == Scenario((RequestSpec("r0", 2, 3),)).dumps() and "temperature" not in plain.dumps()
    assert "r1(p3 m8 stream chat t1 top_p0.9 seed7 logprobs" in ASKING.describe()
    with pytest.raises(ValueError, match="top_logprobs"):
        Scenario((RequestSpec("r0", top_logprobs=2),)).validate()


def test_drawn_fields_shrink_towards_the_plain_greedy_request():
    quiet = settings(database=None, max_examples=500)
    assert find(_asks(TOP_LOGPROBS, 300), lambda ask: ask[0].get("stop"), settings=quiet) == ({"stop": ("e",)}, None)
    assert find(_asks(TOP_LOGPROBS, 300), lambda ask: True, settings=quiet) == ({}, None)
    smallest = find(scenarios(max_requests=1, max_faults=1), lambda s: s.requests[0].stop, settings=quiet)
    assert smallest.requests[0].asks() == "stop['e']", smallest.describe()  # greedy, nothing else
