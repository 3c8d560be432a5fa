"""The OpenAI routes an HTTP target serves: stated with `--routes`, kept in the target's JSON form, and
used by every request, the follow-up included, so a chat-only server gets no spurious `followup-differs`
from a completions follow-up it can only answer 404."""

from __future__ import annotations

import json
import sys

import pytest

from mlx_invariants.cli import main
from mlx_invariants.fuzz.followup import FollowupOutcome
from mlx_invariants.fuzz.errors import TargetError
from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.scenario import RequestSpec, Scenario
from mlx_invariants.fuzz.session import run_scenario
from mlx_invariants.fuzz.target import Target
from zoo.recipes import RECIPES

CHAT_ONLY = f"{sys.executable} tests/fuzz/gone_server.py {{port}} --chat-only"


def test_routes_round_trip_through_the_json_form_and_show_only_when_narrowed():
    chat = Target.server("srv {port}", routes=("chat",))
    assert chat.to_dict()["routes"] == ["chat"]
    assert Target.from_dict(json.loads(json.dumps(chat.to_dict()))) == chat
    assert chat.describe().endswith("routes ['chat']")
    assert "routes" not in Target.server("srv {port}").describe()
    assert Target.from_dict({"kind": "url", "name": "http://127.0.0.1:1"}).routes == ("completions", "chat")


@pytest.mark.parametrize("bad", [dict(routes=()), dict(routes=("embeddings",))])
def test_a_route_no_server_has_is_refused(bad):
    with pytest.raises(TargetError, match="routes"):
        Target.server("srv {port}", **bad)


def test_routes_apply_to_http_targets_only():
    with pytest.raises(TargetError, match="HTTP targets"):
        Target.from_dict({"kind": "route", "name": "simple", "routes": ["chat"]})


@pytest.mark.parametrize("argv", [["--engine", "simple", "--routes", "chat"],
                                  ["--server-cmd", "srv {port}", "--routes", "chat,embeddings"]])
def test_the_routes_flag_is_checked_as_a_usage_error(argv, capsys):
    assert main(["fuzz", *argv, "--examples", "1"]) == 2
    assert "--routes" in capsys.readouterr().err


def test_the_chat_only_zoo_recipe_states_its_route():
    recipe = next(r for r in RECIPES if r.name == "mlx-openai-server")
    assert recipe.routes == "chat"
    assert next(r for r in RECIPES if r.name == "mlx-lm").routes == "completions,chat"


def _followup(routes: tuple[str, ...]) -> tuple[FollowupOutcome, list]:
    engines = Target.server(CHAT_ONLY, routes=routes).build()
    try:
        fresh = run_scenario(engines, Scenario(()))
        trace = run_scenario(engines, Scenario((RequestSpec("r0", 3, 4, False),)),
                             expected_followup=FollowupOutcome.of_trace(fresh))
    finally:
        engines.close()
    return FollowupOutcome.of_trace(trace), judge(trace)


def test_a_chat_only_server_stated_so_gets_its_follow_up_on_the_chat_route():
    got, found = _followup(("chat",))
    assert got.kind == "completed" and got.tokens, got
    assert found == []


def test_the_same_server_asked_on_both_routes_refuses_the_completions_follow_up():
    got, _ = _followup(("completions", "chat"))
    assert got.kind == "refused", got
