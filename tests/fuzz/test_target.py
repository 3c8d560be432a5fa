"""The target and the settings as values: each kind round-trips through JSON, a mistake is a usage error
naming what to change, and a report's scenario file carries its target."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from mlx_invariants.errors import UsageError
from mlx_invariants.fuzz.case import load_case
from mlx_invariants.fuzz.errors import SettingsError
from mlx_invariants.fuzz.oracles import Violation
from mlx_invariants.fuzz.report import Failure, write_report
from mlx_invariants.fuzz.scenario import At, FaultSpec, RequestSpec, Scenario
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.target import Target, TargetKind
from mlx_invariants.fuzz.trace import Trace

TARGETS = [
    Target.reference("batched"),
    Target.reference("simple", package="my_copy_of_engine"),
    Target.engine("mypkg.fuzzing:make"),
    Target.url("http://127.0.0.1:8080", owner="worker*", model="m"),
    Target.server("python -m mlx_lm.server --port {port}"),
    Target.server("python -m mlx_lm.server --port {port}", health="/health"),
    Target.served("batched", package="my_copy_of_engine"),
]


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.kind.value)
def test_every_kind_of_target_round_trips_through_json(target: Target):
    assert Target.from_dict(json.loads(json.dumps(target.to_dict()))) == target


def test_the_engine_flag_names_a_route_or_a_module_factory_and_http_targets_aim_at_client_points():
    assert Target.engine("simple").kind is TargetKind.ROUTE
    assert Target.engine("pkg.mod:make").kind is TargetKind.FACTORY
    assert set(Target.server("cmd {port}").fault_kinds) == {"cancel", "disconnect"}
    # SERVER_STEP counts a launched server's recorded MLX calls: a bare URL has no records to count.
    assert "SERVER_STEP" in Target.server("cmd {port}").points
    assert "SERVER_STEP" not in Target.url("http://127.0.0.1:9").points and "BODY_PART" in Target.url("http://127.0.0.1:9").points
    assert Target.reference("simple").label == "simple"
    # http-ROUTE: the route behind its own HTTP app in this process: the in-process faults an HTTP client can
    # deliver, the engine's points and the client's half-sent body.
    served = Target.engine("http-simple")
    assert (served.kind, served.name, served.label) == (TargetKind.SERVED, "simple", "http-simple")
    assert "abort" not in served.fault_kinds and {"raise", "restart", "cancel"} <= set(served.fault_kinds)
    assert "BODY_PART" in served.points and "SERVER_STEP" not in served.points and "BEFORE_DECODE" in served.points
    assert Target.reference("simple", package="planted_x").label == "planted_x.simple"


@pytest.mark.parametrize("make, message", [
    (lambda: Target.module_factory("nocolon"), "MODULE:FACTORY"),
    (lambda: Target.server("python -m server"), "{port}"),
    (lambda: Target.url("http://10.0.0.1:8080"), "loopback"),
    (lambda: Target(TargetKind.ROUTE, "simple", owner="x*"), "HTTP targets"),
    (lambda: Target(TargetKind.FACTORY, "a:b", package="elsewhere"), "only a route"),
    (lambda: Target(TargetKind.ROUTE, "simple", fault_kinds=("explode",)), "fault kinds"),
    (lambda: Target(TargetKind.URL, "http://127.0.0.1:9", fault_kinds=("worker-dies",)), "a launched server"),
    (lambda: Target(TargetKind.ROUTE, "simple", health="/health"), "health route"),
    (lambda: Target.server("cmd {port}", health="health"), "health route"),
    (lambda: Target.from_dict({"kind": "carrier-pigeon", "name": "x"}), "target kind"),
    (lambda: Target.from_dict("simple"), "kind and a name"),
    (lambda: Target.reference("turbo").build(), "has no route 'turbo'"),
    (lambda: Target.reference("simple", package="no_such_engine_package").build(), "cannot import"),
    (lambda: Target.engine("no.such.module:make").build(), "cannot import"),
    (lambda: Target.engine("json:no_such_factory").build(), "no callable"),
])
def test_a_target_that_names_nothing_buildable_is_a_usage_error(make, message):
    with pytest.raises(UsageError, match=message):  # TargetError, or ServerError for a URL
        make()


def test_settings_round_trip_through_json_with_their_scenarios(tmp_path: Path):
    scenario = Scenario((RequestSpec("r0", 2, 3, False),), (FaultSpec("cancel", At("r0", "ADMITTED")),))
    settings = FuzzSettings(profile="runner", budget_s=5, examples=7, seed=3, replays=1, reuse=False, strict=True,
                            explicit=[scenario], report_dir=tmp_path, workdir=tmp_path / "work")
    assert settings.report_dir == str(tmp_path)  # JSON-able as given
    assert FuzzSettings.from_dict(json.loads(json.dumps(settings.to_dict()))) == settings


@pytest.mark.parametrize("changes, message", [
    ({"profile": "nightly"}, "profile must be one of"),
    ({"examples": 0}, "examples must be at least 1"),
    ({"budget_s": 0}, "positive number of seconds"),
    ({"replays": -1}, "must not be negative"),
])
def test_settings_out_of_range_are_a_usage_error(changes, message):
    with pytest.raises(SettingsError, match=message):
        FuzzSettings(**changes)
    with pytest.raises(SettingsError, match="unknown fuzz settings"):
        FuzzSettings.from_dict({"jobz": 2})


def test_a_report_names_its_target_in_the_scenario_file_and_the_report(tmp_path: Path):
    target = Target.reference("batched", package="planted_x")
    scenario = Scenario((RequestSpec("r0"),))
    folder = write_report(tmp_path, Failure(scenario, Trace(), [Violation("stalled", "nothing ran")], target))
    assert load_case(folder) == (scenario, target)
    assert load_case(folder / "report.json") == (scenario, target)
    text = (folder / "report.txt").read_text()
    assert "target:     route batched, package planted_x" in text
    assert f"replay:     {shlex.quote(sys.executable)} -m mlx_invariants fuzz --replay {folder / 'scenario.json'}\n" in text
    (tmp_path / "bare.json").write_text(scenario.dumps())  # written by hand: no target
    assert load_case(tmp_path / "bare.json") == (scenario, None)
