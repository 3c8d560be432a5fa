"""`invariants serve` as a real process: startup failure, and SIGTERM/SIGINT with a stream in flight."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from ..conftest import WAIT_S, wait_for

SERVE = [sys.executable, "-m", "mlx_invariants", "serve", "--port", "0"]


class ServeProcess:
    """`invariants serve --port 0`; the URL comes from the line it prints once listening."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([*SERVE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: "queue.Queue[str | None]" = queue.Queue()
        self.stdout: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_line(self, needle: str, timeout: float = 120.0) -> str | None:
        """The first stdout line containing `needle`, or None if the process ended or the time ran out."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                return None
            self.stdout.append(line)
            if needle in line:
                return line
        return None

    def url(self) -> str:
        line = self.wait_line("listening on ")
        assert line is not None, f"serve never listened; stderr: {self.proc.stderr.read() if self.proc.poll() else ''}"
        return line.rsplit(" ", 1)[-1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


@pytest.fixture
def serve():
    started: list[ServeProcess] = []

    def start(*args: str) -> ServeProcess:
        started.append(ServeProcess(*args))
        return started[-1]

    yield start
    for process in started:
        process.stop()


def test_startup_failure_exits_nonzero_without_listening(serve, tmp_path):
    process = serve("--model", str(tmp_path / "no-such-model"))
    assert process.proc.wait(120) == 1
    stdout, stderr = process.proc.stdout.read(), process.proc.stderr.read()
    assert "listening" not in stdout
    failure = [line for line in stderr.splitlines() if line.startswith("invariants serve:")]
    assert len(failure) == 1 and "failed to start" in failure[0] and "no-such-model" in failure[0], stderr


def _sse_events(response: httpx.Response):
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield line[len("data: "):]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_mid_stream_aborts_it_with_done_and_exits_0(serve, sig):
    process = serve("--shutdown-grace", "0")
    url = process.url()
    body = {"model": "mlx-invariants-tiny", "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 1000, "temperature": 0, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as response:
        events = _sse_events(response)
        assert json.loads(next(events))["choices"][0]["delta"]["role"] == "assistant"
        process.proc.send_signal(sig)
        rest = list(events)
    assert rest[-1] == "[DONE]"
    finish = json.loads(rest[-2])["choices"][0]
    assert finish["finish_reason"] == "abort"
    assert len(rest) < 1000, "the stream ran to its end instead of being aborted"
    assert process.proc.wait(WAIT_S) == 0
    assert process.wait_line("stopped", WAIT_S) is not None


def test_sigterm_ends_a_running_non_stream_request_with_abort(serve):
    process = serve("--shutdown-grace", "0")
    url = process.url()
    body = {"model": "mlx-invariants-tiny", "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 1000, "temperature": 0}
    answers: list[httpx.Response] = []
    client = threading.Thread(target=lambda: answers.append(
        httpx.post(url + "/v1/chat/completions", json=body, timeout=60)))
    client.start()
    assert wait_for(lambda: "decoding" in httpx.get(url + "/v1/status", timeout=WAIT_S).json()["requests"].values())
    process.proc.send_signal(signal.SIGTERM)
    client.join(WAIT_S)
    assert answers[0].status_code == 200, answers[0].text
    answer = answers[0].json()
    assert answer["choices"][0]["finish_reason"] == "abort"
    assert answer["usage"]["completion_tokens"] < 1000
    assert process.proc.wait(WAIT_S) == 0


def test_sigterm_drains_running_stream_and_refuses_new_requests(serve):
    process = serve("--shutdown-grace", "600")  # the stream finishes however slow the box: a drain, not a race
    url = process.url()
    body = {"model": "mlx-invariants-tiny", "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 1000, "temperature": 0, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as response:
        events = _sse_events(response)
        next(events)
        process.proc.send_signal(signal.SIGTERM)
        assert process.wait_line("stopping (SIGTERM)", WAIT_S) is not None  # the log says who asked
        refused = httpx.post(url + "/v1/chat/completions", json={**body, "stream": False}, timeout=WAIT_S)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_shutting_down"
        assert httpx.get(url + "/health", timeout=WAIT_S).status_code == 503
        rest = list(events)
    assert rest[-1] == "[DONE]"
    assert json.loads(rest[-2])["choices"][0]["finish_reason"] == "length"
    assert process.proc.wait(WAIT_S) == 0


@pytest.mark.parametrize("flag, shown", [((), "exact"), (("--pad-prefill", "on"), "padded")])
def test_pad_prefill_flag_reaches_the_batched_owner(serve, flag, shown):
    """`auto` pads only where MLX runs on CUDA (never on this CPU), `on` anywhere; /v1/status says
    which the owner chose, and the padded route still serves."""
    url = serve("--engine", "batched", *flag).url()
    assert httpx.get(url + "/v1/status", timeout=WAIT_S).json()["prefill"] == shown
    model = httpx.get(url + "/v1/models", timeout=WAIT_S).json()["data"][0]["id"]
    body = {"model": model, "prompt": "the quick brown fox " * 12, "max_tokens": 8, "temperature": 0}
    answer = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] >= 1
