"""A request's answer with others in flight against its answer alone (fuzz/differential.py), on real engines:
the planted mix-up (catalogue M24) is found, both reference routes are clean, and the lone answers are kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_invariants.fuzz.adapters.http import _lead
from mlx_invariants.fuzz.corpus import SEED_SCENARIOS
from mlx_invariants.fuzz.differential import CLEAR_LEAD, Alone, AloneCache
from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.scenario import RequestSpec
from mlx_invariants.fuzz.session import run_scenario
from mlx_invariants.fuzz.target import Target
from mlx_invariants.mutants import select
from mlx_invariants.mutants.copies import import_copy

TOGETHER = SEED_SCENARIOS["tokens_decoded_together"]  # two greedy streams decoding side by side


def test_tokens_handed_to_the_wrong_request_are_found(tmp_path: Path):
    (mutant,) = select(["M24"])
    trace = run_scenario(Target.reference("batched", package=import_copy(mutant, tmp_path)).build(), TOGETHER)
    assert [v.kind for v in judge(trace)] == ["output-differs-alone"] * 2, [v.message for v in judge(trace)]


@pytest.mark.parametrize("route", ["batched", "simple"])
def test_the_reference_engines_answer_alone_what_they_answer_together(route: str):
    trace = run_scenario(Target.reference(route).build(), TOGETHER)
    checks = trace.of("check", "alone")
    assert [c.rid for c in checks] == ["r0", "r1"]
    for check in checks:  # judged, not skipped: the same tokens, and steps the lone run decided clearly
        assert check.info["got"] == check.info["alone"] and len(check.info["got"]) == 6
        assert sum(lead >= CLEAR_LEAD for lead in check.info["leads"]) >= 3
    assert judge(trace) == []


def test_a_lone_answer_is_kept_for_shorter_budgets_and_run_again_for_longer_ones():
    cache = AloneCache()
    spec = RequestSpec("r0~7", prompt_len=3, max_tokens=3)
    cache.put(spec, Alone((5, 6, 7), (2.0, 0.5, 3.0), budget=3, budget_ended=True))
    assert cache.get(RequestSpec("r0~9", prompt_len=3, max_tokens=2)).tokens == (5, 6)  # another run's suffix
    assert cache.get(RequestSpec("r0", prompt_len=3, max_tokens=4)) is None  # it may go on past 3
    assert cache.get(RequestSpec("r0", prompt_len=4, max_tokens=2)) is None  # another prompt
    cache.put(spec, Alone((5, 2), (2.0, 4.0), budget=3, budget_ended=False))  # ended at its end-of-sequence
    assert cache.get(RequestSpec("r0", prompt_len=3, max_tokens=9)).tokens == (5, 2)
    cache.put(spec, Alone(("a", "bc"), (2.0, 4.0), budget=3, budget_ended=True))  # text chunks: budget as run
    assert cache.get(RequestSpec("r0", prompt_len=3, max_tokens=2)) is None
    assert cache.get(RequestSpec("r0", prompt_len=3, max_tokens=3)).tokens == ("a", "bc")


def test_a_servers_lead_is_read_from_either_routes_top_logprobs_and_only_there():
    chat = {"content": [{"token": "a", "logprob": -0.1, "top_logprobs": [{"token": "a", "logprob": -0.1},
                                                                         {"token": "b", "logprob": -2.6}]}]}
    assert _lead(chat) == pytest.approx(2.5)
    assert _lead({"top_logprobs": [{"a": -0.2, "b": -0.5}, {"c": -0.1, "d": -3.0}]}) == pytest.approx(0.3)
    assert _lead({"content": [{"token": "a", "logprob": -0.1, "top_logprobs": []}]}) is None  # none asked for
    assert _lead({"tokens": ["a"], "token_logprobs": [-0.1], "top_logprobs": None}) is None
    assert _lead(None) is None
