"""gone_client_keeps_decoding.py measures the server's whole process tree, not only the process it started.

mlx-openai-server decodes in a worker process: counting only the launched process's threads saw none of
its decoding. No server here: a parent process that does nothing while its child burns the CPU.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest

from zoo.run import REPRODUCERS

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# The parent sleeps; its child (a separate process, as a model worker is) spins for 1.5 s of CPU.
PARENT = ("import subprocess, sys, time; "
          "child = subprocess.Popen([sys.executable, '-c', "
          "'import time\\nend = time.process_time() + 1.5\\nwhile time.process_time() < end: pass\\n"
          "time.sleep(30)']); time.sleep(30)")


def _reproducer():
    spec = importlib.util.spec_from_file_location("gone_client", REPRODUCERS / "gone_client_keeps_decoding.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("new_session", [True, False], ids=["own-session", "descendants"])
def test_cpu_counts_every_process_of_the_server(new_session):
    gone = _reproducer()
    parent = subprocess.Popen([sys.executable, "-c", PARENT], start_new_session=new_session)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and gone.cpu_seconds(parent.pid) < 1.4:
            time.sleep(0.1)
        assert len(gone.server_pids(parent.pid)) == 2
        assert gone.cpu_seconds(parent.pid) >= 1.4  # the child's CPU, which the parent's own threads lack
        own = [gone._stat(parent.pid)[i] for i in (11, 12)]  # the launched process alone: its utime, stime
        assert sum(map(int, own)) / os.sysconf("SC_CLK_TCK") < 0.5
    finally:
        for pid in gone.server_pids(parent.pid) - {parent.pid}:
            os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait()
