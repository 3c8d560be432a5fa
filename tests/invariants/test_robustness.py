"""Files the checker cannot check are one INV000 line each; the run goes on and never crashes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.hostile_trees import call_chain, elif_chain
from mlx_invariants.checker import isolation, runner
from tests.invariants.conftest import BAD_LOCK, Project


def _inv000(project: Project, *args: str) -> dict[str, str]:
    run = project.run("check", *args)
    assert run.code == 1, run.err
    assert "Traceback" not in run.out + run.err
    found = {}
    for line in run.lines():
        path, _, _, rest = line.split(":", 3)
        rule, message = rest.strip().split(" ", 1)
        assert rule in ("INV000", "INV105"), line
        found[path] = message if rule == "INV000" else rule
    return found


def test_each_broken_file_is_one_clear_line_and_good_files_are_still_checked(project: Project) -> None:
    project.write("syntax.py", "async def f(:\n    pass\n")
    project.write("latin1.py", b"import asyncio\nname = '\xe9t\xe9'\n")
    project.write("nul.py", b"import asyncio\nx = 1\x00\n")
    project.write("zz_engine.py", BAD_LOCK)
    found = _inv000(project)
    assert found["syntax.py"].startswith("cannot check this file: syntax error")
    assert found["latin1.py"] == "cannot check this file: not valid UTF-8 (byte 0xe9); save it as UTF-8"
    assert found["nul.py"] == "cannot check this file: contains a NUL byte; Python cannot compile it"
    assert found["zz_engine.py"] == "INV105"
    run = project.run("check")
    assert "syntax.py:1:" in run.out and "nul.py:2:1:" in run.out and "latin1.py:2:1:" in run.out


def test_a_declared_source_encoding_is_honoured(project: Project) -> None:
    project.write("cp.py", b"# -*- coding: latin-1 -*-\nname = '\xe9t\xe9'\n")
    assert project.run("check").code == 0


def test_a_5_mb_generated_module_is_reported_as_too_large(project: Project) -> None:
    rows = "".join(f"    ({i}, 'token_{i}', {i * 0.5}),\n" for i in range(150_000))
    path = project.write("table.py", "import asyncio\nTABLE = [\n" + rows + "]\n")
    assert path.stat().st_size > 5_000_000
    found = _inv000(project)
    assert found["table.py"].startswith("cannot check this file: file is 5.")
    assert "over the 2.0 MB limit; exclude it or raise max-file-bytes" in found["table.py"]


@pytest.mark.parametrize("code", [
    "import asyncio\nx = " + "(" * 400 + "1" + ")" * 400 + "\n",
    "import asyncio\nx = " + "[" * 150 + "]" * 150 + "\n" + "y = " + "-" * 20000 + "1\n",
    "import asyncio\nx = 1" + " + 1" * 30000 + "\n",
    "import asyncio\nx = (\n" + "'a'\n" * 30000 + ")\n",
], ids=["parens-400", "unary-20000", "binop-30000", "strings-30000"])
def test_deeply_nested_code_is_one_inv000_line_or_checked(project: Project, code: str) -> None:
    project.write("deep.py", code)
    project.write("zz_engine.py", BAD_LOCK)
    run = project.run("check")
    assert run.code == 1 and "Traceback" not in run.err
    deep = [line for line in run.lines() if line.startswith("deep.py")]
    assert len(deep) <= 1
    if deep:
        assert " INV000 cannot check this file: " in deep[0]
    assert any(line.startswith("zz_engine.py") for line in run.lines())


@pytest.mark.timeout(900)  # libcst on 3000 nested operations: 92 s on a loaded 2-core box
def test_deep_nesting_with_a_finding_is_located_without_recursion_errors(project: Project) -> None:
    project.write("deep.py", "import asyncio\n\nasync def f(lock, step):\n    async with lock:\n"
                  "        return await asyncio.to_thread(step, " + "1 + " * 1500 + "1)\n")
    assert project.run("check").rules() == ["INV105"]


def test_symlink_loop_and_broken_symlink_are_reported(project: Project) -> None:
    os.symlink("b.py", project.root / "a.py")
    os.symlink("a.py", project.root / "b.py")
    os.symlink("missing.py", project.root / "gone.py")
    os.symlink(".", project.root / "loopdir")
    project.write("zz_engine.py", BAD_LOCK)
    found = _inv000(project)
    assert found["a.py"] == found["b.py"] == "cannot check this file: symlink loop; fix or exclude the link"
    assert found["gone.py"] == "cannot check this file: broken symlink; fix or exclude the link"
    assert found["zz_engine.py"] == "INV105"
    assert not any(p.startswith("loopdir") for p in found)


def test_a_fifo_named_like_python_is_reported_not_opened(project: Project) -> None:
    os.mkfifo(project.root / "pipe.py")
    found = _inv000(project)
    assert found["pipe.py"].startswith("cannot check this file: not a regular file")


def test_an_unreadable_file_is_reported(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests run as root, where chmod 000 still reads; make open() refuse instead."""
    secret = project.write("secret.py", "import asyncio\n")
    real_open = open

    def refusing_open(file, *args, **kwargs):
        if str(file) == str(secret):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", refusing_open)
    found = _inv000(project, "--no-cache")
    assert found["secret.py"] == "cannot check this file: permission denied; make it readable or exclude it"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_a_chmod_000_file_is_reported(project: Project) -> None:  # pragma: no cover - non-root only
    secret = project.write("secret.py", "import asyncio\n")
    secret.chmod(0)
    found = _inv000(project)
    assert "permission denied" in found["secret.py"]


def test_broken_files_as_a_subprocess_exit_1_and_print_no_traceback(tmp_path: Path) -> None:
    (tmp_path / "syntax.py").write_text("def f(:\n")
    (tmp_path / "deep.py").write_text("x = " + "(" * 5000 + ")" * 5000 + "\n")
    done = subprocess.run([sys.executable, "-m", "mlx_invariants", "check", "--no-cache", "."], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(line.split(":")[0] for line in done.stdout.splitlines()) == ["deep.py", "syntax.py"]
    assert all(" INV000 " in line for line in done.stdout.splitlines())


def test_a_checker_bug_on_one_file_is_an_inv000_line_and_the_run_goes_on(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlx_invariants.checker.rules.inv105_lock_released_before_worker import LockReleasedBeforeWorker

    def broken(self, node):
        raise ValueError("boom")

    monkeypatch.setattr(LockReleasedBeforeWorker, "visit_Await", broken)
    project.config('select = ["INV", "INV101"]\n')  # INV101 is opt-in
    project.write("a.py", BAD_LOCK)
    project.write("b.py", "import asyncio\n\nasync def handle():\n    await asyncio.wait_for(g(), timeout=60)\n")
    run = project.run("check", "--no-cache", "--jobs", "1")
    assert run.code == 1
    assert run.lines()[0] == ("a.py:1:1: INV000 cannot check this file: the checker failed on it "
                              "(ValueError: boom); please report it")
    assert run.lines()[1].startswith("b.py:4:") and " INV101 " in run.lines()[1]


# Hostile shapes from real code (issue 23), generated as the reliability run generates them.
def test_a_2000_branch_elif_chain_is_checked_and_the_run_goes_on(project: Project) -> None:
    """It crashed the whole run with a RecursionError (no finding for any file, the file unnamed):
    libcst's code generation, which places findings, recurses once per `elif`."""
    project.write("elif.py", elif_chain(2_000))  # twice the interpreter's default recursion limit
    project.write("zz_engine.py", BAD_LOCK)
    run = project.run("check", "--no-cache")
    assert run.code == 1 and "Traceback" not in run.out + run.err
    assert [line.split(":")[0] for line in run.lines()] == ["elif.py", "zz_engine.py"]
    assert run.rules() == ["INV105", "INV105"]


def test_a_file_too_deep_for_the_recursion_limit_is_one_inv000_line_and_the_run_goes_on(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the limit, libcst's cleanup turns the RecursionError into a KeyError whose message is the
    repr of a node as deep as the chain: that repr must not be taken, and the file is named. Here the
    positions pass (positions.py) must go through the chain to reach a finding below it; one whose
    findings all lie above the chain stops before it and reports them."""
    monkeypatch.setattr(isolation, "RECURSION_LIMIT", 1_200)
    below = "\n\nasync def late(lock, step):\n    async with lock:\n        await asyncio.to_thread(step)\n"
    project.write("elif.py", elif_chain(2_000) + below)
    project.write("zz_engine.py", BAD_LOCK)
    found = _inv000(project, "--no-cache")
    assert found == {"elif.py": "cannot check this file: nested too deeply to check", "zz_engine.py": "INV105"}
    project.write("elif.py", elif_chain(2_000))
    assert _inv000(project, "--no-cache") == {"elif.py": "INV105", "zz_engine.py": "INV105"}


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_call_chain_that_stalls_libcsts_parser_is_stopped_and_the_run_goes_on(
    project: Project, monkeypatch: pytest.MonkeyPatch, jobs: str
) -> None:
    """libcst's native parser took more than 300 s on such chains and cannot be interrupted in the
    process: the file is parsed in a child process that ends past max-file-seconds."""
    monkeypatch.setattr(runner, "_SMALL_RUN_CHARS", 0)  # --jobs 2 uses its processes even for two files
    project.config("max-file-seconds = 1\n")
    project.write("chain.py", call_chain(1_500))
    project.write("zz_engine.py", BAD_LOCK)
    found = _inv000(project, "--no-cache", "--jobs", jobs)
    assert found == {"chain.py": STOPPED_AFTER_1_S, "zz_engine.py": "INV105"}
    assert project.run("check").code == 1  # a stopped file is cached like any result: the re-run does not wait
    assert project.run("check").lines()[0] == f"chain.py:1:1: INV000 {STOPPED_AFTER_1_S}"


def test_python_code_that_runs_past_the_limit_is_stopped_in_the_process(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stall in the checker's own Python (a rule, the walk, positions) is stopped without a child
    process: the watchdog raises into the analysis thread."""
    from mlx_invariants.checker.rules.inv105_lock_released_before_worker import LockReleasedBeforeWorker

    real = LockReleasedBeforeWorker.visit_Await

    def stalls_on_stall(self, node):
        if getattr(getattr(node.expression, "func", None), "value", None) == "stall":
            while True:
                pass
        return real(self, node)

    monkeypatch.setattr(LockReleasedBeforeWorker, "visit_Await", stalls_on_stall)
    project.config("max-file-seconds = 1\n")
    project.write("a_stall.py", BAD_LOCK + "\n\nasync def later():\n    await stall()\n")
    project.write("b_engine.py", BAD_LOCK)
    project.write("c_engine.py", BAD_LOCK)
    found = _inv000(project, "--no-cache")
    assert found == {"a_stall.py": STOPPED_AFTER_1_S, "b_engine.py": "INV105", "c_engine.py": "INV105"}


def test_a_crash_in_the_child_process_is_an_inv000_line_naming_the_signal(
    project: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Native code that kills the process (libcst's parser overflowing its stack) kills only the
    child that parses the file."""
    from mlx_invariants.checker import analysis

    def segfaults(*args):
        os.kill(os.getpid(), signal.SIGSEGV)

    monkeypatch.setattr(analysis, "_isolated", segfaults)
    project.write("chain.py", call_chain(600))
    project.write("wide.py", BAD_LOCK + "\nWIDE = [" + "1, " * 3_000 + "]\n")
    project.write("zz_engine.py", BAD_LOCK)
    found = _inv000(project, "--no-cache")
    crashed = "cannot check this file: the checker crashed (killed by SIGSEGV) on it; please report it"
    assert found == {"chain.py": crashed, "wide.py": crashed, "zz_engine.py": "INV105"}


def test_the_time_limit_is_configured_and_checked(project: Project) -> None:
    project.config('max-file-seconds = "soon"\n')
    run = project.run("check")
    assert run.code == 2 and "'max-file-seconds' must be a non-negative number" in run.err
    project.config("max-file-seconds = 0\n")  # no limit
    project.write("engine.py", BAD_LOCK)
    assert project.run("check").rules() == ["INV105"]


STOPPED_AFTER_1_S = "cannot check this file: analysis stopped after 1 s (max-file-seconds); exclude it or raise max-file-seconds"
