"""What the sentinel injected into a launched server costs its decode pace: one server command started bare, with
the sentinel (MLX entries recorded), and with the sentinel and the drop-in observation (every lock, queue and
thread handoff recorded too), rounds interleaved; each start is a fresh process, and each figure is the median of
three greedy non-streaming chats of `--tokens` tokens after one warm-up chat, in milliseconds per token.

A fuzzer that slows the server it watches hides the races that need its tokens to come fast (a poll that a
token beats, a cancel noticed only between chunks), so this is the figure to read before blaming a server's pace.

    .venv/bin/python benchmarks/bench_server_sentinel.py --model tiny -- SERVER COMMAND WITH {port}

Not a test: it prints a markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_engine import free_port  # noqa: E402
from mlx_invariants.fuzz.injection import sentinel_env  # noqa: E402

MODES = ("bare", "sentinel", "sentinel + observation")


def _environment(mode: str, folder: Path) -> dict[str, str]:
    if mode == "bare":
        return dict(os.environ)
    return sentinel_env(folder / "sentinel.jsonl", None, observe=mode != "sentinel")


def _wait_ready(url: str, ready_path: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with status {process.returncode} before it was ready")
        try:
            if httpx.get(url + ready_path, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)  # polling a process we started
    raise SystemExit(f"the server was not ready within {timeout_s:g}s")


def pace(command: str, model: str, tokens: int, mode: str, ready_path: str) -> float:
    """Milliseconds per token of one fresh server in `mode`: the median of three timed chats."""
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="bench-sentinel-"))
    with open(folder / "server.log", "wb") as log:
        process = subprocess.Popen(shlex.split(command.replace("{port}", str(port))), env=_environment(mode, folder),
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_ready(url, ready_path, process, 180.0)
        body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": tokens,
                "temperature": 0}
        httpx.post(url + "/v1/chat/completions", json=body, timeout=300)  # compiles, fills caches
        per_token = []
        for _ in range(3):
            started = time.monotonic()
            answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=300).json()
            produced = max(1, int(answer.get("usage", {}).get("completion_tokens", 0)))
            per_token.append((time.monotonic() - started) / produced * 1000)
        return statistics.median(per_token)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the model name the server answers to")
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ready-path", default="/health")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the server command, with {port}")
    args = parser.parse_args()
    command = " ".join(args.command[1:] if args.command[:1] == ["--"] else args.command)
    if "{port}" not in command:
        parser.error("the server command must hold {port}")
    figures: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            figures[mode].append(pace(command, args.model, args.tokens, mode, args.ready_path))
    bare = statistics.median(figures["bare"])
    print(f"{args.tokens}-token greedy chats, {args.rounds} round(s) interleaved, load {os.getloadavg()[0]:.1f}\n")
    print("| mode | ms per token (each round) | against bare |")
    print("|---|---|---|")
    for mode in MODES:
        median = statistics.median(figures[mode])
        rounds = ", ".join(f"{value:.1f}" for value in figures[mode])
        print(f"| {mode} | {median:.1f} ({rounds}) | {median / bare - 1:+.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
