"""`ServerProcess`: `invariants serve` as a child process on 127.0.0.1, with the MLX sentinel injected.

Without faults the child is exactly `python -m invariants serve ...`; with
faults it is the bootstrap in `serve.py`, which plants them and then runs the
same CLI. The sentinel comes in through fuzz's `sitecustomize` injection
(`fuzz/inject/`), as it would into any other server. The child announces its
URL on stdout; everything here waits by polling with a deadline, never by
sleeping for a guessed time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Optional

import httpx

from mlx_invariants.fuzz.injection import sentinel_env

from ..conftest import wait_for

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 120.0


class ServerProcess:
    """One child server; `serve_args` are `invariants serve` options, `faults` JSON-able dicts."""

    def __init__(self, serve_args: list[str], faults: list[dict[str, Any]] = (), sentinel: Optional[Path] = None):
        self.sentinel = sentinel
        serve = ["--host", "127.0.0.1", "--port", "0", *serve_args]
        if faults:
            planted = [arg for fault in faults for arg in ("--fault", json.dumps(fault))]
            command = [sys.executable, "-m", "tests.reliability.serve", *planted, "--", *serve]
        else:
            command = [sys.executable, "-m", "mlx_invariants", "serve", *serve]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if sentinel is not None:
            env = sentinel_env(sentinel, "mlx-owner*", env)
        self.command = command
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.url: Optional[str] = None
        self.proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1, env=env)
        self._readers = [threading.Thread(target=self._read, args=(self.proc.stdout, self.stdout), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self.stderr), daemon=True)]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(pipe: Any, lines: list[str]) -> None:
        for line in pipe:
            lines.append(line.rstrip("\n"))

    # -- lifecycle -------------------------------------------------------------
    def wait_listening(self, timeout: float = STARTUP_TIMEOUT_S) -> bool:
        """True once the child announced its URL; False if it exited or the deadline passed first."""
        def announced() -> bool:
            for line in self.stdout:
                if "listening on " in line:
                    self.url = line.rsplit("listening on ", 1)[1].strip()
                    return True
            return self.proc.poll() is not None
        wait_for(announced, timeout)
        return self.url is not None

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait_exit(self, timeout: float) -> Optional[int]:
        """The exit code, or None if the child is still running at the deadline."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        for reader in self._readers:
            reader.join(5)
        return code

    def kill(self) -> None:
        """Last resort for a test that failed with the child still up: never leave it behind."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def output(self) -> str:
        return "\n".join(["--- stdout", *self.stdout, "--- stderr", *self.stderr[-40:]])

    # -- probes ------------------------------------------------------------------
    def get(self, path: str) -> httpx.Response:
        assert self.url, "the server is not listening"
        return httpx.get(self.url + path, timeout=60)

    def status(self) -> dict[str, Any]:
        return self.get("/v1/status").json()

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """True once nothing is admitted, queued, tracked or being relayed (no leaked slot)."""
        def idle() -> bool:
            s = self.status()
            return (s["active"] == 0 and s["queued"] == 0 and not s["requests"]
                    and s["server"]["open_generations"] == 0)
        return wait_for(idle, timeout, interval=0.02)

    def rss_bytes(self) -> int:
        import psutil

        return psutil.Process(self.proc.pid).memory_info().rss

    def sentinel_violations(self) -> list[str]:
        """What the MLX oracles say about every entry the child's sentinel recorded."""
        from mlx_invariants.fuzz.oracles import mlx_never_concurrent, mlx_only_on_owner, no_stream_errors
        from mlx_invariants.fuzz.sentinel import read_records
        from mlx_invariants.fuzz.trace import Trace

        assert self.sentinel is not None, "this server runs without the sentinel"
        events, _ = read_records(str(self.sentinel))
        trace = Trace()
        trace.merge(events)
        found = [v for oracle in (mlx_never_concurrent, mlx_only_on_owner, no_stream_errors) for v in oracle(trace)]
        return self._injection_errors() + [f"{v.kind}: {v.message}" for v in found]

    def _injection_errors(self) -> list[str]:
        """The injection reports its own failure as a record; no records at all means it never ran."""
        if not self.sentinel.exists():
            return [f"the sentinel recorded nothing into {self.sentinel}: was it injected?"]
        with open(self.sentinel, encoding="utf-8") as handle:
            return [f"injection: {line.strip()}" for line in handle if '"injection_error"' in line]

    def mlx_entries(self) -> int:
        from mlx_invariants.fuzz.sentinel import read_records

        return len(read_records(str(self.sentinel))[0]) if self.sentinel else 0
