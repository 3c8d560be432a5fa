"""Standalone reproducer: does a non-streaming answer report more completion tokens than max_tokens?

No fuzzer and no mlx-invariants: the standard library and httpx only. It starts the
server command (with `{port}`) on 127.0.0.1 and sends greedy non-streaming requests with
a few max_tokens values. An OpenAI-compatible server never generates more than max_tokens
tokens, so `usage.completion_tokens` must not exceed it; a server that counts by
re-encoding the decoded text reports a different number, and can then also report
finish_reason "stop" for an answer cut at max_tokens. Exit status: 1 the bug shows,
0 it does not, 2 inconclusive (the server failed).

    python usage_over_max_tokens.py --model NAME -- vllm-mlx serve DIR --port {port}
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx

MAX_TOKENS = (8, 64, 256)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def wait_ready(client: httpx.AsyncClient, server: subprocess.Popen, path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"server exited with status {server.returncode}")
        try:
            if (await client.get(path)).status_code < 500:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.5)
    raise RuntimeError(f"server not ready within {timeout_s:g}s")


async def probe(args: argparse.Namespace, server: subprocess.Popen, url: str) -> int:
    over = 0
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0, connect=10.0)) as client:
        await wait_ready(client, server, args.ready_path, args.startup_s)
        for route in args.routes.split(","):
            for max_tokens in MAX_TOKENS:
                body = {"model": args.model, "max_tokens": max_tokens, "temperature": 0.0}
                if route == "chat":
                    path, body = "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": "hi"}]}
                else:
                    path, body = "/v1/completions", {**body, "prompt": "hi"}
                response = await client.post(path, json=body)
                response.raise_for_status()
                answer = response.json()
                used = answer.get("usage", {}).get("completion_tokens")
                reason = (answer.get("choices") or [{}])[0].get("finish_reason")
                flag = "  <- more than max_tokens" if used is not None and used > max_tokens else ""
                over += bool(flag)
                print(f"{path} max_tokens={max_tokens}: usage.completion_tokens={used}, finish_reason={reason}{flag}")
    if over:
        print(f"BUG: {over} answer(s) reported more completion tokens than max_tokens")
        return 1
    print("ok: no answer reported more completion tokens than max_tokens")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the model field the server accepts")
    parser.add_argument("--routes", default="completions,chat", help="comma-separated: completions, chat")
    parser.add_argument("--ready-path", default="/v1/models")
    parser.add_argument("--startup-s", type=float, default=180.0)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the server command, with {port}")
    args = parser.parse_args()
    command = [part for part in args.command if part != "--"]
    if not any("{port}" in part for part in command):
        parser.error("give the server command after --, with a {port} placeholder")
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="server-", suffix=".log", delete=False)
    argv = [part.replace("{port}", str(port)) for part in command]
    print("server:", shlex.join(argv), "log:", log.name)
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return asyncio.run(probe(args, server, f"http://127.0.0.1:{port}"))
    except (RuntimeError, httpx.HTTPError) as exc:
        print(f"INCONCLUSIVE: {exc}")
        return 2
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
