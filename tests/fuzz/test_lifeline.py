"""A fuzz process killed outright (SIGKILL: a CI timeout, the OOM killer, the zoo's killer) runs no atexit
handler; the server it started must die with it all the same, in one process (`--jobs 0`) and through a
job child (`--jobs 1`, the default), and not keep listening on its port."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlx_invariants.fuzz.lifeline import Lifeline
from tests.conftest import BACKSTOP_S, WAIT_S

ROOT = Path(__file__).resolve().parents[2]


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _alive(pid: int) -> bool:
    """Running, not a zombie left for an init that does not reap."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    return bool(state) and not state.startswith("Z")


def _until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.mark.parametrize("jobs", ["0", "1"])
def test_a_sigkilled_fuzz_run_takes_its_server_with_it(tmp_path: Path, jobs: str) -> None:
    started = tmp_path / "server.pid"
    server = (f"sh -c {shlex.quote(f'echo $$ {{port}} > {started}; exec {sys.executable} tests/fuzz/slow_server.py {{port}}')}")
    reports = tmp_path / "reports"
    fuzz = subprocess.Popen([sys.executable, "-m", "mlx_invariants", "fuzz", "--server-cmd", server, "--jobs", jobs,
                             "--budget", str(BACKSTOP_S), "--report", str(reports)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Mid-run: the server answers and a scenario has been handed to it.
        assert _until(lambda: started.is_file() and started.read_text().count(" ") == 1
                      and any(reports.glob("work/**/current.json")), 2 * WAIT_S), "the fuzz run never got going"
        pid, port = map(int, started.read_text().split())
        assert _alive(pid) and _answers(port)
        fuzz.kill()
        fuzz.wait()
        assert _until(lambda: not _answers(port) and not _alive(pid), WAIT_S), \
            f"the server (pid {pid}) outlived the fuzz process that started it"
    finally:
        if fuzz.poll() is None:
            fuzz.kill()
            fuzz.wait()
        if started.is_file() and started.read_text().count(" ") == 1:
            _stop_group(int(started.read_text().split()[0]))  # what a failing run left behind


def _stop_group(pid: int) -> None:
    try:
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_the_watchdog_is_the_server_to_its_owner(tmp_path: Path) -> None:
    """Exit status passes through, a SIGTERM to the group stops the server, and a server that ignores
    SIGTERM is killed once its owner lets go."""
    line = Lifeline([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert line.process.wait(WAIT_S) == 3
    line.cut()
    running = tmp_path / "running"
    line = Lifeline([sys.executable, "-c", f"import time; open({str(running)!r}, 'w'); time.sleep(60)"])
    assert _until(running.is_file, WAIT_S)  # the server runs, so the watchdog's TERM handler is in place
    os.killpg(line.process.pid, signal.SIGTERM)
    assert line.process.wait(WAIT_S) == -signal.SIGTERM
    line.cut()
    stubborn = tmp_path / "stubborn.pid"
    line = Lifeline([sys.executable, "-c", "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                          f"open({str(stubborn)!r}, 'w').write(str(os.getpid())); time.sleep(60)"])
    assert _until(lambda: stubborn.is_file() and stubborn.read_text(), WAIT_S)
    line.cut()
    assert line.process.wait(WAIT_S) == -signal.SIGKILL
    assert _until(lambda: not _alive(int(stubborn.read_text())), WAIT_S)


def _child_with_a_lifeline(then: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import sys, time; from mlx_invariants.fuzz.lifeline import "
                                                   "exit_with_parent; exit_with_parent(sys.stdin.fileno()); "
                                                   f"print('ready', flush=True); {then}"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_job_child_ends_when_its_parent_lets_go_of_its_stdin() -> None:
    """A job child stuck in a scenario prints nothing, so no broken pipe would ever tell it that its parent
    died; its stdin does. And a child that finishes while its parent lives exits as usual (0), not aborted
    by a watching thread at interpreter shutdown."""
    stuck, done = _child_with_a_lifeline("time.sleep(60)"), _child_with_a_lifeline("pass")
    try:
        assert stuck.stdout.readline() == "ready\n"
        stuck.stdin.close()
        assert stuck.wait(WAIT_S) == -signal.SIGKILL
        assert done.wait(WAIT_S) == 0, done.stderr.read()
    finally:
        for child in (stuck, done):
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stdin.close()


def test_a_child_lifeline_thread_counts_as_parked() -> None:
    """The driver waits for every other thread to be parked before each scenario: a lifeline thread that did
    not count made every scenario of a `--jobs` child wait the whole cap (about 40 examples a minute, not 600)."""
    script = (
        "import os, sys, threading, time\n"
        "from mlx_invariants.fuzz.lifeline import exit_with_parent\n"
        "from mlx_invariants.fuzz.liveness import parked\n"
        "r, w = os.pipe()\n"
        "exit_with_parent(r)\n"
        "t = next(t for t in threading.enumerate() if t.name == 'lifeline')\n"
        # Poll until the thread has reached its blocking read: a fixed sleep orders nothing on a loaded box.
        f"deadline = time.monotonic() + {WAIT_S}\n"
        "while not parked(sys._current_frames()[t.ident]) and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "print(parked(sys._current_frames()[t.ident]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=2 * WAIT_S)
    assert done.stdout.strip() == "True", done.stdout + done.stderr
