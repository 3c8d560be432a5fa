"""`invariants check / rules / explain` as a user runs them: exit codes, formats, config."""

from __future__ import annotations

import json
import subprocess
import sys

from mlx_invariants.checker.rules import RULES
from tests.invariants.conftest import BAD_LOCK, Project

CLEAN = "def add(a, b):\n    return a + b\n"


def test_clean_tree_exits_0_and_findings_exit_1_with_path_line_col(project: Project) -> None:
    project.write("pkg/clean.py", CLEAN)
    assert project.run("check", "pkg").code == 0
    project.write("pkg/engine.py", BAD_LOCK)
    run = project.run("check", "pkg")
    assert run.code == 1
    assert run.lines() == [
        "pkg/engine.py:11:20: INV105 cancelling this await leaves `async with self._mlx_lock` while the worker "
        "thread still runs: create a task, await it through a shield (`asyncio.shield`; on CPython 3.14+ a "
        "`shield_task` helper, INV117), and on CancelledError keep awaiting it until done, then re-raise"
    ]
    assert "1 finding in 2 files" in run.err


def test_default_path_is_the_current_folder(project: Project) -> None:
    project.write("mlx_invariants.engine.py", BAD_LOCK)
    assert project.run("check").rules() == ["INV105"]


def test_json_is_a_list_of_path_line_col_rule_message(project: Project) -> None:
    project.write("mlx_invariants.engine.py", BAD_LOCK)
    run = project.run("check", "--format", "json", ".")
    assert run.code == 1
    [item] = run.json()
    assert set(item) == {"path", "line", "col", "rule", "message"}
    assert (item["path"], item["line"], item["col"], item["rule"]) == ("mlx_invariants.engine.py", 11, 20, "INV105")


def test_sarif_is_2_1_0_with_rule_metadata_and_locations(project: Project) -> None:
    project.write("mlx_invariants.engine.py", BAD_LOCK)
    log = json.loads(project.run("check", "--format", "sarif").out)
    assert log["version"] == "2.1.0"
    run = log["runs"][0]
    rule_ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert {"INV000", "INV105"} <= set(rule_ids)
    [result] = run["results"]
    assert result["ruleId"] == "INV105" and rule_ids[result["ruleIndex"]] == "INV105"
    location = result["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == "mlx_invariants.engine.py"
    assert location["region"] == {"startLine": 11, "startColumn": 20}


def test_github_format_is_workflow_annotations_with_escaping(project: Project) -> None:
    project.write("a,b.py", BAD_LOCK)
    [line] = project.run("check", "--format", "github").lines()
    assert line.startswith("::error file=a%2Cb.py,line=11,col=20,title=INV105::INV105 cancelling this await")


def test_output_file_gets_the_findings(project: Project) -> None:
    project.write("mlx_invariants.engine.py", BAD_LOCK)
    run = project.run("check", "--format", "json", "-o", "out.json")
    assert run.code == 1 and run.out == ""
    assert json.loads((project.root / "out.json").read_text())[0]["rule"] == "INV105"


def test_select_and_ignore_on_the_command_line(project: Project) -> None:
    project.write("mlx_invariants.engine.py", BAD_LOCK)
    assert project.run("check", "--select", "INV101").code == 0
    assert project.run("check", "--ignore", "INV105").code == 0
    assert project.run("check", "--select", "INV10").rules() == ["INV105"]
    assert project.run("check", "--exit-zero").code == 0


def test_config_ignore_per_path_ignores_and_rule_paths(project: Project) -> None:
    project.write("engine/a.py", BAD_LOCK)
    project.write("tests/b.py", BAD_LOCK)
    assert [line.split(":")[0] for line in project.run("check").lines()] == ["engine/a.py", "tests/b.py"]
    project.config('per-path-ignores = { "tests/**" = ["INV105"] }\n')
    assert [line.split(":")[0] for line in project.run("check").lines()] == ["engine/a.py"]
    project.config('[tool.invariants.INV105]\npaths = ["tests/**"]\n')
    assert [line.split(":")[0] for line in project.run("check").lines()] == ["tests/b.py"]
    project.config('ignore = ["INV105"]\n')
    assert project.run("check").code == 0


def test_rule_options_in_config_change_the_threshold(project: Project) -> None:
    project.write("h.py", """
        import asyncio

        async def handle(engine, request):
            return await asyncio.wait_for(engine.generate(request), timeout=8)
    """)
    project.config('select = ["INV", "INV101"]\n')  # INV101 is opt-in
    assert project.run("check").rules() == ["INV101"]
    project.config('select = ["INV", "INV101"]\n[tool.invariants.INV101]\nmax-seconds = 10\n')
    assert project.run("check").code == 0


def test_excludes_and_gitignore_are_honoured_below_named_folders(project: Project) -> None:
    project.write("vendor/x.py", BAD_LOCK)
    project.write("generated/y.py", BAD_LOCK)
    project.write(".venv/lib/z.py", BAD_LOCK)
    project.write(".gitignore", "generated/\n")
    project.config('exclude = ["vendor/"]\n')
    assert project.run("check").code == 0
    # Named explicitly, an excluded folder is checked (say, an installed package inside .venv) ...
    assert project.run("check", ".venv/lib").rules() == ["INV105"]
    # ... unless --force-exclude, as the pre-commit hook passes.
    assert project.run("check", "--force-exclude", "vendor/x.py").code == 0
    assert project.run("check", "vendor/x.py").rules() == ["INV105"]


def test_usage_errors_exit_2_with_one_line(project: Project) -> None:
    for args, words in [
        (("check", "missing/"), "missing/: no such file or directory"),
        (("check", "--select", "INV999"), "'INV999', which matches no rule"),
        (("check", "--jobs", "-1"), "--jobs must be 0"),
    ]:
        run = project.run(*args)
        assert run.code == 2, args
        assert words in run.err and len(run.err.strip().splitlines()) == 1, run.err


def test_config_errors_exit_2_and_name_the_key(project: Project) -> None:
    project.write("a.py", CLEAN)
    for table, words in [
        ("selct = ['INV1']\n", "unknown key 'selct' in [tool.invariants]"),
        ("select = 'INV1'\n", "'select' must be a list of strings"),
        ("[tool.invariants.INV101]\nmax-secs = 3\n", "unknown option 'max-secs' for INV101"),
        ("[tool.invariants.INV101]\nmax-seconds = 'x'\n", "'INV101.max-seconds' must be a non-negative number"),
        ("per-path-ignores = { 'tests/**' = ['INV9'] }\n", "matches no rule"),
        ("mlx-lock = ['self._lock']\n", "unknown key 'mlx-lock' in [tool.invariants]"),
        ("mlx-locks = 'self._lock'\n", "'mlx-locks' must be a list of strings"),
        ("owner-functions = ['Engine.run()']\n", "'owner-functions' names 'Engine.run()', which is not a dotted name"),
        ("mlx-locks = ['']\n", "'mlx-locks' names '', which is not a dotted name"),
        ("[tool.invariants.INV125]\nmlx-locks = ['x']\n", "'mlx-locks' is a declared role"),
    ]:
        project.config(table)
        run = project.run("check")
        assert run.code == 2, table
        assert words in run.err and "pyproject.toml" in run.err, run.err
    (project.root / "pyproject.toml").write_text("[tool.invariants\n")
    run = project.run("check")
    assert run.code == 2 and "not valid TOML" in run.err


def test_explicit_config_file(project: Project) -> None:
    project.write("mlx_invariants.engine.py", BAD_LOCK)
    project.write("other.toml", "[tool.invariants]\nignore = ['INV105']\n")
    assert project.run("check", "--config", "other.toml").code == 0
    run = project.run("check", "--config", "nope.toml")
    assert run.code == 2 and "nope.toml: no such config file" in run.err


def test_rules_lists_every_rule_and_explain_prints_the_docs(project: Project) -> None:
    run = project.run("rules")
    assert run.code == 0
    ids = [line.split()[0] for line in run.lines() if line.startswith("INV")]
    assert ids == ["INV000", "INV001", *(rule.id for rule in RULES)]
    for rule in ("INV105", "lock-released-before-worker"):
        run = project.run("explain", rule)
        assert run.code == 0
        for section in ("INV105 lock-released-before-worker", "What", "Why", "Bad:", "Good:", "Known problems"):
            assert section in run.out
        assert "shield_task(task)" in run.out and "# <- INV105" in run.out
    assert "max-seconds = 5.0" in project.run("explain", "INV101").out
    run = project.run("explain", "INV999")
    assert run.code == 2 and "unknown rule 'INV999'" in run.err and "INV000, INV001, INV101" in run.err


def test_console_script_runs_as_a_subprocess(project: Project) -> None:
    project.write("mlx_invariants.engine.py", BAD_LOCK)
    done = subprocess.run([sys.executable, "-m", "mlx_invariants", "check", "--format", "json", "."],
                          cwd=project.root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert [f["rule"] for f in json.loads(done.stdout)] == ["INV105"]
    assert "1 finding in 1 file" in done.stderr


def test_a_reader_that_goes_away_gets_no_traceback() -> None:
    """`invariants explain INV105 | head -1`: the reader closes the pipe before the output is written."""
    child = subprocess.Popen([sys.executable, "-m", "mlx_invariants", "explain", "INV105"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.close()  # long before the interpreter has started, let alone printed
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
