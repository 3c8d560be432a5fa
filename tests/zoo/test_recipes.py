"""The zoo's data and its report writer, without installing or starting any server."""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from zoo import doc, install
from zoo.recipes import ALL, BLOCKED, CHAT, COMPLETIONS, FUZZ_DEPS, IN_PROCESS, PIN, RECIPES, find
from zoo.run import FOUND, PROFILE, REPRODUCERS, _finding, _reproducer_for, fuzz_argv


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.name)
def test_recipe_is_pinned_and_starts_on_loopback(recipe):
    assert all(PIN.match(req) for req in recipe.requirements), recipe.requirements
    assert f"{recipe.package}=={recipe.version}" in recipe.requirements
    assert all(PIN.match(line) for line in recipe.overrides)
    for slot in ("{venv}", "{port}"):
        assert slot in recipe.command
    assert "{model}" in recipe.command + recipe.model_name  # started with the model, or loads the one requests name
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
        assert blocked.reason and blocked.error.strip()  # the line that stops it, as the server or installer says it


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


def test_each_recipe_is_fuzzed_long_seeded_and_to_the_end_of_its_budget():
    """The runner profile (long prompts and budgets), the recorded seed, --keep-going and the budget;
    no example cap that could end a run before its budget."""
    http = fuzz_argv(find("mlx-lm"), Path("/V"), "srv --port {port}", 90.0, 42, Path("/R"))
    inproc = fuzz_argv(find("vllm-mlx-simple-inproc"), Path("/V"), "", 90.0, 42, Path("/R"))
    for argv in (http, inproc):
        pairs = dict(zip(argv, argv[1:]))
        assert pairs["--profile"] == PROFILE == "runner" and pairs["--seed"] == "42" and pairs["--budget"] == "90"
        assert "--keep-going" in argv and "--examples" not in argv and pairs["--report"] == "/R"
    assert dict(zip(http, http[1:]))["--routes"] == "completions,chat"
    assert inproc[0] == "/V/bin/python" and dict(zip(inproc, inproc[1:]))["--engine"].endswith("vllm_engines:simple")
    assert "--capacity" not in http  # mlx-lm's queue is longer than any scenario
    one_at_a_time = fuzz_argv(find("vllm-mlx"), Path("/V"), "srv --port {port}", 90.0, 42, Path("/R"))
    assert dict(zip(one_at_a_time, one_at_a_time[1:]))["--capacity"] == "1"


def _gone_finding(oracle: str, stream: bool) -> dict:
    scenario = {"requests": [{"rid": "r0", "stream": stream}, {"rid": "r1", "stream": not stream}],
                "faults": [{"kind": "disconnect", "at": {"rid": "r0", "point": "ADMITTED", "index": 0}}]}
    return {"oracle": oracle, "scenario_json": scenario}


def test_a_finding_is_checked_only_by_a_reproducer_of_its_kind_of_gone_client():
    """mlx-lm's reproducer shows a non-streaming client that has gone: it cannot confirm a streaming one."""
    recipe = find("mlx-lm")
    assert _reproducer_for(recipe, _gone_finding("compute-after-disconnect", stream=False)).slug == "gone-nonstream"
    assert _reproducer_for(recipe, _gone_finding("compute-after-disconnect", stream=True)) is None
    assert _reproducer_for(recipe, _gone_finding("mlx-concurrent", stream=False)) is None
    assert _reproducer_for(recipe, {"oracle": "compute-after-disconnect", "scenario_json": None}) is None
    swallowed = _reproducer_for(find("vllm-mlx-batched"), {"oracle": "cancel-swallowed", "scenario_json": None})
    assert swallowed.engine_api and swallowed.script == "vllm_stream_swallows_cancel.py"


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
            "findings": list(findings), "known": list(known), "profile": "runner", "seeds": [42], "budget_s": 90.0,
            "runs": [{"seed": 42, "examples": 250, "elapsed_s": 90.0, "load": [3.5, 6.25],
                      "finding_ids": [f["id"] for f in findings]}],
            "requests": {"most": 10, "capacity": None, "source": "unknown"}, "model": "/M"}


def _fuzz_finding(oracle, codes):
    reproducer = {"slug": "s", "script": "r.py", "args": ["--x"], "codes": codes, "output": "BUG: shown"}
    return {"id": oracle[:4], "status": "violation", "oracle": oracle, "headline": f"{oracle}: h",
            "scenario": "[r0(p1 m1)] cancel at r0@ADMITTED", "scenario_json": {"requests": [{"rid": "r0"}], "faults": [], "target": {"kind": "server"}},
            "replayed": [3, 3], "shrunk": True, "seeds": [42], "first_finds_s": [12.5],
            "reproducer": reproducer if codes else None}


CANNED = {
    "generated": "2026-11-25 03:00 UTC", "budget_s": 90.0, "profile": "runner", "seeds": [42],
    "host": {"platform": "Linux-x", "python": "3.11.7", "cpus": 2, "note": "Shared with six other jobs."},
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
    assert rows["[clean-server](#clean-server-10)"].endswith("| 250 | 0 | 0 | 0 | 0 | clean |")
    assert rows["[buggy-server](#buggy-server-10)"].endswith("| 1 | 0 | 2 (`cancel-swallowed`, `loop-lag`) | 0 | bug |")
    assert rows["[quiet-bug](#quiet-bug-10)"].endswith("| 0 | 1 | 0 | 0 | bug |")
    assert rows["[broken](#broken-10)"].endswith("not fuzzed (error) |")
    assert "**Clean**: the fuzzer found nothing in 250 scenarios, and no reproducer shows a bug." in page
    assert "The fuzzer found nothing in 250 scenarios; the bugs below come from reproducers." in page
    clean, rest = page.split("## buggy-server 1.0")
    bugs, unconfirmed = rest.split("### Unconfirmed findings")
    assert "### Bugs found by the fuzzer" in bugs and "`mlx-concurrent`" in bugs
    assert "found by 1 of 1 run(s); time to first find after the fuzz command started: 12.5 s (seed 42)" in bugs
    assert "replay rate: 3/3" in bugs
    assert "shows it in 1/2 run(s)" in bugs
    assert "`cancel-swallowed`" in unconfirmed and "`loop-lag`" in unconfirmed
    assert "shows it in 0/2 run(s)" in unconfirmed
    scenario = bugs.split("```json\n", 1)[1].split("\n```", 1)[0]
    assert json.loads(scenario) == {"requests": [{"rid": "r0"}], "faults": []}
    assert "### Bugs shown by a reproducer that the fuzzer did not find" in page
    assert "**Not fuzzed:**" in page and "boom" in page
    assert "## Tried here, not in the zoo" in page and "RuntimeError: no metal" in page


def test_doc_says_how_each_server_was_fuzzed_and_under_what_load():
    page = doc.write(CANNED)
    header = page.split("## Summary")[0]
    assert "once per seed (42): `invariants fuzz --profile runner --seed SEED --keep-going --budget 90`" in header
    assert "prompts to 300 words, budgets to 200 tokens" in header
    assert "**Machine load:** Shared with six other jobs." in header
    clean = page.split("## clean-server 1.0")[1].split("## ")[0]
    assert "profile `runner`, seeds 42 (a run each), `--keep-going`, capacity unknown" in clean
    assert "up to 10 requests" in clean
    assert "  - seed 42: 250 scenarios in 90.0 s, nothing found; load average 3.5 before, 6.25 after" in clean
    given = {**_server("s"), "requests": {"most": 6, "capacity": 4, "source": "given"}}
    assert "capacity 4 (given with --capacity), so up to 6 requests" in doc.write({**CANNED, "servers": [given]})


def test_an_unconfirmed_finding_says_why_it_has_no_reproducer():
    known_server = {**_server("vllm-mlx"), "findings": [_fuzz_finding("cancel-swallowed", [])]}
    unconfirmed = doc.write({**CANNED, "servers": [known_server]}).split("### Unconfirmed findings")[1]
    assert "- reproducer: none. " + dict(find("vllm-mlx").why_unconfirmed)["cancel-swallowed"] in unconfirmed
    unexplained = doc.write({**CANNED, "servers": [_server("s", findings=[_fuzz_finding("mlx-gc", [])])]})
    assert "- reproducer: none yet" in unexplained


def test_a_false_alarm_is_listed_apart_with_why_it_is_wrong():
    """A finding the recipe names a false alarm is counted as one and shown under its own heading with the reason,
    not among the unconfirmed ones; another oracle's finding of that server stays unconfirmed."""
    server = {**_server("mlx-openai-server"),
              "findings": [_fuzz_finding("request-crashed", []), _fuzz_finding("mlx-gc", [])]}
    page = doc.write({**CANNED, "servers": [server]})
    assert "| 0 | 0 | 1 (`mlx-gc`) | 1 | unconfirmed findings only |" in page
    unconfirmed, wrong = page.split("### Unconfirmed findings")[1].split("### False alarms")
    assert "`mlx-gc`" in unconfirmed and "`request-crashed`" not in unconfirmed
    assert "`request-crashed`" in wrong
    assert "- false alarm: " + dict(find("mlx-openai-server").false_alarms)["request-crashed"] in wrong


def test_a_reproducer_on_the_engine_api_is_run_by_the_servers_python():
    engine_api = {"slug": "e", "script": "e.py", "args": ["--model", "{model}"], "codes": [1], "output": "BUG",
                  "in_process": True}
    finding = {**_fuzz_finding("cancel-swallowed", [1]), "reproducer": engine_api}
    page = doc.write({**CANNED, "servers": [_server("http-server", findings=[finding])]})
    assert "- run: `VENV/bin/python zoo/reproducers/e.py --model /M`" in page
    assert " -- " not in page.split("- run: ")[1].splitlines()[0]


def test_a_finding_without_a_showing_reproducer_is_never_a_bug():
    page = doc.write({**CANNED, "servers": [_server("s", findings=[_fuzz_finding("mlx-gc", [0, 2])])]})
    assert "### Bugs found by the fuzzer" not in page
    assert "| 0 | 0 | 1 (`mlx-gc`) | 0 | unconfirmed findings only |" in page


def test_run_zoo_records_seed_and_load_and_runs_each_reproducer_once(monkeypatch, tmp_path: Path):
    """Two findings of one oracle share one reproducer run; the seed, profile and load are recorded."""
    from zoo import run

    calls = []

    def reproduce(known, *args, **kwargs):
        calls.append(known.slug)
        return {"codes": [1]}

    def swallowed(id_):
        return {"id": id_, "oracle": "cancel-swallowed", "scenario_json": None, "first_find_s": 1.0}

    monkeypatch.setattr(run.install, "install", lambda recipe: tmp_path)
    monkeypatch.setattr(run, "fuzz_recipe", lambda *a, **k: {"examples": 5, "findings": [swallowed("a"), swallowed("b")]})
    monkeypatch.setattr(run, "reproduce", reproduce)
    result = run.run_zoo([find("vllm-mlx-batched")], 90.0, "/M", tmp_path, 1, [7], note="busy.", say=lambda _: None)
    assert calls == ["stream-swallows-cancel"]
    server = result["servers"][0]
    assert server["findings"][0]["reproducer"] is server["findings"][1]["reproducer"] and server["known"] == []
    assert (result["seeds"], server["seeds"], result["profile"], result["host"]["note"]) == ([7], [7], "runner", "busy.")
    load = server["runs"][0]["load"]
    assert len(load) == 2 and all(isinstance(x, float) for x in load)


def test_runs_of_several_seeds_merge_into_one_entry_each_finding_once_with_the_seeds_that_found_it():
    from zoo.run import merge_runs

    def found(id_, t):
        return {"id": id_, "oracle": "stalled", "first_find_s": t}

    runs = [{"seed": 1, "examples": 10, "scenario_runs": 12, "elapsed_s": 90.0, "findings": [found("a", 5.0)]},
            {"seed": 2, "error": "invariants fuzz exited with 2:\nboom"},
            {"seed": 3, "examples": 7, "scenario_runs": 9, "elapsed_s": 91.0, "pace": {"step_s": 0.01},
             "findings": [found("a", 40.0), found("b", None)]}]
    merged = merge_runs(runs)
    assert (merged["examples"], merged["scenario_runs"], merged["elapsed_s"]) == (17, 21, 181.0)
    assert "error" not in merged and merged["pace"] == {"step_s": 0.01}
    assert [(f["id"], f["seeds"], f["first_finds_s"]) for f in merged["findings"]] == [
        ("a", [1, 3], [5.0, 40.0]), ("b", [3], [None])]
    assert [r.get("finding_ids") for r in runs] == [["a"], None, ["a", "b"]]
    assert "boom" in merge_runs([runs[1]])["error"]


def test_an_in_process_vllm_engine_refuses_requests_after_shutdown():
    """A request that arrives after the scenario's shutdown is refused clearly, not crashed on a missing engine
    (the adapter's own AttributeError once showed up as a request-crashed finding)."""
    import asyncio

    from mlx_invariants.fuzz.errors import Refused
    from mlx_invariants.fuzz.scenario import RequestSpec
    from zoo.vllm_engines import VllmMlxAdapter

    adapter = VllmMlxAdapter("simple", "/M")
    asyncio.run(adapter.shutdown())
    with pytest.raises(Refused, match="shut down"):
        asyncio.run(adapter.submit(RequestSpec("r0", 1, 1, True)))


def test_each_servers_fuzz_command_names_its_flags_and_home_as_a_variable_the_shell_expands():
    """The doc's fuzz command is the run's argv (--model, --routes, --capacity included), typed from the checkout
    root; the home folder shows as $HOME, which a shell expands inside `--server-cmd "..."` (a `~` there it does not)."""
    home = str(Path.home())
    fuzzed = {"budget_s": 90.0, "seeds": [42, 43]}
    servers = [{**_server("mlx-lm"), **fuzzed, "command": f"{home}/z/bin/mlx_lm.server --port {{port}}"},
               {**_server("vllm-mlx"), **fuzzed, "command": f"{home}/z/bin/vllm-mlx serve --port {{port}}"},
               {**_server("vllm-mlx-simple-inproc"), **fuzzed,
                "command": "invariants fuzz --engine zoo.vllm_engines:simple"}]
    page = doc.write({**CANNED, "servers": servers})
    inproc_python = str(install.venv_dir(find("vllm-mlx-simple-inproc")) / "bin" / "python").replace(home, "$HOME")
    first = "- fuzz command (the first seed's run; the others differ only by `--seed`): "
    commands = ["- fuzz command: " + line[len(first):] for line in page.splitlines() if line.startswith(first)]
    assert commands == [
        '- fuzz command: `.venv/bin/invariants fuzz --server-cmd "$HOME/z/bin/mlx_lm.server --port {port}" '
        '--model default_model --routes completions,chat --profile runner --seed 42 --keep-going --budget 90`',
        '- fuzz command: `.venv/bin/invariants fuzz --server-cmd "$HOME/z/bin/vllm-mlx serve --port {port}" '
        '--model tiny --routes completions,chat --capacity 1 --profile runner --seed 42 --keep-going --budget 90`',
        f"- fuzz command: `PYTHONPATH=. {inproc_python} -m mlx_invariants fuzz --engine zoo.vllm_engines:simple "
        "--profile runner --seed 42 --keep-going --budget 90`"]
    assert home not in page and '"~' not in page


def test_an_in_process_recipe_imports_its_engine_from_the_checkout_whatever_the_working_folder(tmp_path: Path):
    from zoo import run

    checkout = Path(run.__file__).resolve().parents[1]
    env = run.fuzz_env(find("vllm-mlx-simple-inproc"), "/M", tmp_path)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(checkout) and env["MLX_INVARIANTS_ZOO_MODEL"] == "/M"
    assert run.fuzz_env(find("mlx-lm"), "/M", tmp_path).get("PYTHONPATH") == os.environ.get("PYTHONPATH")
    done = subprocess.run([sys.executable, "-c", "import zoo.vllm_engines as m; print(m.simple.__module__)"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "zoo.vllm_engines", done.stderr


def test_the_zoo_reads_and_writes_beside_itself_and_runs_from_any_folder(tmp_path: Path):
    from zoo import __main__ as entry

    checkout = Path(entry.__file__).resolve().parents[1]
    assert entry.RESULT == checkout / "zoo" / "results" / "zoo.json" and entry.RESULT.exists()
    assert entry.DOC == checkout / "docs" / "zoo.md" and install.CHECKOUT == checkout
    assert REPRODUCERS == checkout / "zoo" / "reproducers"
    done = subprocess.run([sys.executable, str(checkout / "zoo"), "list"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("mlx-lm "), done.stderr


@pytest.mark.parametrize("recipe, known", [(r, k) for r in ALL for k in r.known],
                         ids=lambda v: v.name if hasattr(v, "engine") else v.slug)
def test_every_known_bug_has_an_upstream_report(recipe, known):
    """Title, affected version, what happens and should, file:line of the server's code, upstream status."""
    report = known.report
    assert report is not None, f"{recipe.name}/{known.slug} has no report"
    assert report.headline and report.happens and report.should and report.upstream
    assert recipe.version in report.affected
    assert report.source and all(re.match(r"^[\w/.]+\.py:\d+: \S", line) for line in report.source), report.source


def test_a_shown_bug_carries_its_report_and_a_command_that_runs_as_pasted():
    """The reproducer command names the real server command, its ready path and the project's python; the report
    follows the reproducer's output only when the reproducer showed the bug."""
    home = str(Path.home())
    recipe = find("vllm-mlx")
    known = next(k for k in recipe.known if k.slug == "busy-stream-internal-error")
    ran = {"slug": known.slug, "title": known.title, "script": known.script, "args": list(known.args),
           "codes": [1], "output": "BUG: shown"}
    server = {**_server("vllm-mlx"), "command": f"{home}/z/bin/vllm-mlx serve /M --port {{port}}", "known": [ran]}
    page = doc.write({**CANNED, "servers": [server]})
    assert ("- run: `.venv/bin/python zoo/reproducers/cancelled_stream_then_followup.py --model tiny "
            "--ready-path /health -- $HOME/z/bin/vllm-mlx serve /M --port {port}`") in page
    assert f"#### {known.report.headline}" in page and "<summary>upstream report</summary>" in page
    assert "`vllm_mlx/engine/simple.py:739`: fail_fast admission" in page
    not_shown = doc.write({**CANNED, "servers": [{**server, "findings": [], "known": [{**ran, "codes": [0]}]}]})
    assert "<summary>upstream report</summary>" not in not_shown


def test_doc_command_lists_the_servers_that_do_not_run_here_as_the_recipes_say_now(tmp_path: Path):
    from zoo import __main__ as entry

    result, page = tmp_path / "zoo.json", tmp_path / "zoo.md"
    result.write_text(json.dumps(CANNED))  # its blocked list is an old run's
    assert entry.main(["doc", "--result", str(result), "--doc", str(page)]) == 0
    text = page.read_text()
    assert all(f"### {b.name} {b.version}" in text for b in BLOCKED) and "nometal" not in text
