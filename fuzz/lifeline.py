"""Processes that die with the fuzz process, even when it is SIGKILLed.

An `atexit` handler stops a started server when the fuzz process exits, but
a CI timeout, the OOM killer or a runner's killer sends SIGKILL, which runs
no handler: the server would keep listening, and the next run's port, memory
and GPU are no longer its own. So the fuzz process holds the write end of a
pipe whose read end is held by a small watchdog (this file, run as a script),
and the kernel closes that write end whatever kills the holder. The watchdog
starts the server in its own process group and, when the pipe reaches EOF,
terminates the whole group (the server and anything it started), then kills
what is left. A pipe works the same on Linux and macOS, and unlike
PR_SET_PDEATHSIG it is tied to the process, not to the thread that started
the server (servers are started from an executor thread).

While the fuzz process lives, the watchdog is transparent: it shares the
server's output and process group, ignores the group's SIGTERM (the server
takes it), and exits as the server did, so the caller's `poll()`,
`returncode` and `killpg(pid, ...)` behave as if it were the server.

`exit_with_parent` is the same idea for a fuzz child (`fuzz.jobs`): it ends
when its parent's end of its stdin closes, so its own server's lifeline then
fires too.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any

GRACE_S = 5.0  # how long the server has to stop after SIGTERM before its group is killed


class Lifeline:
    """`argv` started under a watchdog in a new process group; `process` is the watchdog (see above)."""

    def __init__(self, argv: list[str], **popen: Any):
        read_end, self._write_end = os.pipe()
        try:
            # -I -S: no site, no PYTHON* variables, no script folder on sys.path, so the sentinel injected
            # through the environment (meant for the server) never loads here.
            self.process = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), str(read_end),
                                             *argv], pass_fds=(read_end,), start_new_session=True, **popen)
        except OSError:
            os.close(self._write_end)
            raise
        finally:
            os.close(read_end)

    def cut(self) -> None:
        """Close our end: the watchdog stops the group if it still runs. Idempotent."""
        end, self._write_end = self._write_end, -1
        if end >= 0:
            os.close(end)


def exit_with_parent(fd: int) -> None:
    """End this process (SIGKILL, so nothing can hold it) when `fd`, a pipe from the parent, reaches EOF:
    the parent died, or closed it to say so. It reads the bare descriptor: a daemon thread blocked inside
    a buffered stream (`sys.stdin.buffer`) holds its lock, and the interpreter aborts at exit when it
    finds that lock taken."""
    def watch() -> None:
        while os.read(fd, 1 << 12):
            pass
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=watch, name="lifeline", daemon=True).start()


def _watch(fd: int, argv: list[str]) -> int:
    """The watchdog: run `argv`, exit as it exits; on EOF at `fd`, stop its process group."""
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # a handler, not SIG_IGN: the server must not inherit it
    try:
        server = subprocess.Popen(argv)
    except OSError as exc:
        print(f"lifeline: cannot start the server: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 127
    while True:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready and not os.read(fd, 1 << 12):
            break
        code = server.poll()
        if code is not None:
            return _exit_as(code)
    group = os.getpgrp()
    os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # polling a process we started, after our owner died; nothing else is ordered by this
    os.killpg(group, signal.SIGKILL)  # what ignored SIGTERM, and this watchdog
    return 0


def _exit_as(code: int) -> int:
    """Our exit status as `code`, a Popen returncode: die of the same signal when it is negative."""
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(_watch(int(sys.argv[1]), sys.argv[2:]))
