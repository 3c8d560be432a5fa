"""The zoo's data and its report writer, without installing or starting any server."""

from __future__ import annotations

import ast
import importlib
import json
import sys
from pathlib import Path

import pytest

from mlx_invariants.fuzz.zoo import doc, install
from mlx_invariants.fuzz.zoo.recipes import ALL, BLOCKED, CHAT, COMPLETIONS, FUZZ_DEPS, IN_PROCESS, PIN, RECIPES, find
from mlx_invariants.fuzz.zoo.run import FOUND, REPRODUCERS, _finding


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.name)
def test_recipe_is_pinned_and_starts_on_loopback(recipe):
    assert all(PIN.match(req) for req in recipe.requirements), recipe.requirements
    assert f"{recipe.package}=={recipe.version}" in recipe.requirements
    assert all(PIN.match(line) for line in recipe.overrides)
    for slot in ("{venv}", "{model}", "{port}"):
        assert slot in recipe.command
    assert "127.0.0.1" in recipe.command and "0.0.0.0" not in recipe.command
    assert recipe.ready_path.startswith("/")
    assert recipe.endpoints and set(recipe.endpoints) <= {CHAT, COMPLETIONS}
    command = recipe.server_command("/V", "/M")
    assert "{venv}" not in command and "{model}" not in command and "{port}" in command


@pytest.mark.parametrize("recipe", IN_PROCESS, ids=lambda r: r.name)
def test_in_process_recipe_names_an_importable_factory(recipe):
    """The factory's module imports without vllm-mlx (it is imported when an engine starts)."""
    assert all(PIN.match(req) for req in recipe.requirements)
    assert set(FUZZ_DEPS) <= set(recipe.requirements) and recipe.in_process and not recipe.command
    module, _, attr = recipe.engine.partition(":")
    assert callable(getattr(importlib.import_module(module), attr))


def test_names_are_unique_and_found():
    names = [r.name for r in ALL] + [b.name for b in BLOCKED]
    assert len(names) == len(set(names))
    assert find("mlx-lm").package == "mlx-lm"
    with pytest.raises(KeyError):
        find("no-such-server")


def test_blocked_servers_say_why():
    for blocked in BLOCKED:
        assert PIN.match(f"{blocked.package}=={blocked.version}")
        assert blocked.reason and "Error" in blocked.error


def test_pin_rejects_ranges():
    assert PIN.match("mlx[cpu]==0.32.4")
    assert not PIN.match("mlx>=0.31") and not PIN.match("mlx-lm")


@pytest.mark.parametrize("known", [k for r in ALL for k in r.known], ids=lambda k: f"{k.script}-{k.slug}")
def test_reproducers_are_standalone(known):
    """A reproducer imports nothing of ours: the standard library, httpx, and the engine it reproduces on."""
    source = (REPRODUCERS / known.script).read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported - {"__future__", "httpx", "vllm_mlx"} <= set(sys.stdlib_module_names), imported


def test_resolved_versions_come_from_freeze():
    recipe = find("vllm-mlx")
    lines = ["mlx==0.32.4", "MLX-LM==0.31.3", "vllm-mlx==0.6.0", "numpy==2.4.6", "-e file:///x"]
    assert install.resolved(lines, recipe) == {"mlx": "0.32.4", "mlx-lm": "0.31.3", "vllm-mlx": "0.6.0"}


def test_progress_lines_give_finding_counts():
    assert FOUND.search("12/100000 (cap) examples, 4s/60s, 2 finding(s), generate: ...").group(1) == "2"
    assert FOUND.search("33 examples in 1 job(s), 1 failing, 6s").group(1) == "1"
    assert FOUND.search("1 new finding(s) in 32 example(s)").group(1) == "1"


def test_finding_reads_the_summary_entry(tmp_path: Path):
    (tmp_path / "scenario.json").write_text('{"scenario": {"requests": []}}')
    raw = {"id": "ab", "status": "violation", "oracle": "mlx-concurrent", "headline": "h", "scenario": "[r0]",
           "reproduced": [2, 3], "shrunk": True, "report": str(tmp_path)}
    finding = _finding(raw, 1, [3.5, 7.25])
    assert finding["first_find_s"] == 7.25 and finding["replayed"] == [2, 3]
    assert finding["scenario_json"] == {"scenario": {"requests": []}}
    assert _finding(raw, 2, [3.5])["first_find_s"] is None


def _server(name, findings=(), known=(), error=""):
    return {"name": name, "package": name, "version": "1.0", "versions": {"mlx": "0.32.4"},
            "command": f"{name} --port {{port}}", "endpoints": [CHAT], "notes": "", "error": error,
            "examples": 250, "scenario_runs": 260, "elapsed_s": 90.0, "pace": {"startup_s": 2.0, "step_s": 0.01},
            "findings": list(findings), "known": list(known)}


def _fuzz_finding(oracle, codes):
    reproducer = {"slug": "s", "script": "r.py", "args": ["--x"], "codes": codes, "output": "BUG: shown"}
    return {"id": oracle[:4], "status": "violation", "oracle": oracle, "headline": f"{oracle}: h",
            "scenario": "[r0(p1 m1)] cancel at r0@ADMITTED", "scenario_json": {"requests": [{"rid": "r0"}], "faults": [], "target": {"kind": "server"}},
            "replayed": [3, 3], "shrunk": True, "first_find_s": 12.5, "reproducer": reproducer if codes else None}


CANNED = {
    "generated": "2026-11-25 03:00 UTC", "budget_s": 90.0,
    "host": {"platform": "Linux-x", "python": "3.11.7", "cpus": 2},
    "servers": [
        _server("clean-server"),
        _server("buggy-server", findings=[_fuzz_finding("mlx-concurrent", [1, 0]),
                                          _fuzz_finding("cancel-swallowed", [0, 0]),
                                          _fuzz_finding("loop-lag", [])]),
        _server("quiet-bug", known=[{"slug": "k", "title": "keeps decoding", "script": "g.py", "args": [],
                                     "codes": [1, 1], "output": "BUG"}]),
        _server("broken", error="invariants fuzz exited with 2:\nboom"),
    ],
    "blocked": [{"name": "nometal", "package": "nometal", "version": "0.1", "reason": "needs Metal",
                 "error": "RuntimeError: no metal"}],
}


def test_doc_has_the_expected_sections():
    page = doc.write(CANNED)
    rows = {line.split("|")[1].strip(): line for line in page.splitlines() if line.startswith("| [")}
    assert rows["[clean-server](#clean-server-10)"].endswith("| 250 | 0 | 0 | 0 | clean |")
    assert rows["[buggy-server](#buggy-server-10)"].endswith("| 1 | 0 | 2 | bug |")
    assert rows["[quiet-bug](#quiet-bug-10)"].endswith("| 0 | 1 | 0 | bug |")
    assert rows["[broken](#broken-10)"].endswith("not fuzzed (error) |")
    assert "**Clean**: the fuzzer found nothing in 250 scenarios, and no reproducer shows a bug." in page
    assert "The fuzzer found nothing in 250 scenarios; the bugs below come from reproducers." in page
    clean, rest = page.split("## buggy-server 1.0")
    bugs, unconfirmed = rest.split("### Unconfirmed findings")
    assert "### Bugs found by the fuzzer" in bugs and "`mlx-concurrent`" in bugs
    assert "time to first find: 12.5 s" in bugs and "replay rate: 3/3" in bugs
    assert "shows it in 1/2 run(s)" in bugs
    assert "`cancel-swallowed`" in unconfirmed and "`loop-lag`" in unconfirmed
    assert "reproducer: none yet" in unconfirmed
    scenario = bugs.split("```json\n", 1)[1].split("\n```", 1)[0]
    assert json.loads(scenario) == {"requests": [{"rid": "r0"}], "faults": []}
    assert "### Bugs shown by a reproducer that the fuzzer did not find" in page
    assert "**Not fuzzed:**" in page and "boom" in page
    assert "## Tried here, not in the zoo" in page and "RuntimeError: no metal" in page


def test_a_finding_without_a_showing_reproducer_is_never_a_bug():
    page = doc.write({**CANNED, "servers": [_server("s", findings=[_fuzz_finding("mlx-gc", [0, 2])])]})
    assert "### Bugs found by the fuzzer" not in page
    assert "| 0 | 0 | 1 | unconfirmed findings only |" in page
