"""benchmarks/zoo_time_to_find.py hunts the zoo's confirmed bugs with each server's own fuzz command, adding
only the settings measured, and its table counts a miss as past the cap. No server is started here."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.zoo_time_to_find import RESULTS, Bug, cells, confirmed_bugs, fuzz_argv, table
from zoo.recipes import ALL


def _recipe(name: str):
    return next(r for r in ALL if r.name == name)


def test_the_bugs_are_the_findings_a_reproducer_showed():
    results = {"servers": [{"name": "a", "findings": [
        {"oracle": "cancel-swallowed", "id": "1", "reproducer": {"codes": [0, 1]}},
        {"oracle": "rest-drift", "id": "2", "reproducer": None},
        {"oracle": "stalled", "id": "3", "reproducer": {"codes": [0, 2]}}]}]}
    assert confirmed_bugs(results) == [Bug("a", "cancel-swallowed", "1")]
    assert confirmed_bugs(json.loads(RESULTS.read_text())), "zoo/results/zoo.json lists no confirmed bug"


def test_default_settings_add_no_profile_and_the_runner_runs_name_theirs(tmp_path: Path):
    recipe = _recipe("mlx-vlm")
    ci = fuzz_argv(recipe, tmp_path / "venv", "/models/tiny", "ci", 3, 120, tmp_path / "r")
    assert "--profile" not in ci
    assert ci[ci.index("--server-cmd") + 1] == recipe.server_command(str(tmp_path / "venv"), "/models/tiny")
    assert ci[-9:] == ["--seed", "3", "--budget", "120", "--keep-going", "--jobs", "0", "--report",
                        str(tmp_path / "r")]
    runner = fuzz_argv(recipe, tmp_path / "venv", "/models/tiny", "runner", 3, 120, tmp_path / "r")
    assert runner[runner.index("--profile") + 1] == "runner"


def test_an_in_process_recipe_is_fuzzed_by_its_venv_python(tmp_path: Path):
    recipe = _recipe("vllm-mlx-batched-inproc")
    argv = fuzz_argv(recipe, tmp_path / "venv", "/models/tiny", "ci", 1, 60, tmp_path / "r")
    assert argv[0] == str(tmp_path / "venv" / "bin" / "python")
    assert argv[argv.index("--engine") + 1] == recipe.engine and "--server-cmd" not in argv


def _run(seed: int, s, profile: str = "ci") -> dict:
    return {"server": "a", "oracle": "k", "profile": profile, "seed": seed, "cap": 120.0, "s": s,
            "reported_s": None if s is None else s + 5, "status": None if s is None else "violation", "load": [2.0]}


def test_a_miss_counts_as_past_the_cap_in_the_median_and_the_max():
    assert cells([_run(1, 10.0), _run(2, None), _run(3, 30.0)]) == \
        "2/3 | 30.0 | 10.0 | > 120 | 10.0 (r 15.0), miss, 30.0 (r 35.0)"
    assert cells([_run(1, None), _run(2, None), _run(3, 30.0)]).startswith("1/3 | > 120 | 30.0 | > 120 |")


def test_the_table_has_a_row_per_bug_and_says_which_profile_was_not_run():
    lines = table([_run(1, 4.0)], [Bug("a", "k", "id")])
    assert lines[2] == "| `k` (id) | a | 1/1 | 4.0 | 4.0 | 4.0 | 4.0 (r 9.0) | - | - | - | - | not run |"
    assert len(lines[0].split("|")) == len(lines[1].split("|")) == len(lines[2].split("|"))
