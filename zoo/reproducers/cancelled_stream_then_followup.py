"""Standalone reproducer: after a client cancels a streaming request, does the next request get
its normal answer?

No fuzzer and no mlx-invariants: the standard library and httpx only. It starts the
server command (with `{port}`) on 127.0.0.1, records a greedy streamed answer on the idle
server, then, several times: opens a streaming request, closes it as soon as the response
headers arrive (the client cancelled), and at once sends the recorded request again. A
server that cleans up a cancelled stream gives the same greedy answer (or, at worst, a
clear refusal with an error status); one that still counts the cancelled request as
running answers HTTP 200 with an error or an empty stream instead. Exit status: 1 the
bug shows in at least one try, 0 it does not, 2 inconclusive (the server failed).

    python cancelled_stream_then_followup.py --model NAME -- vllm-mlx serve DIR --port {port}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

import httpx


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


async def streamed(client: httpx.AsyncClient, body: dict) -> tuple[int, list[str], list[str]]:
    """HTTP status, the text pieces, and any error frames of one streamed completion."""
    pieces, errors = [], []
    async with client.stream("POST", "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            frame = json.loads(line[5:])
            if "error" in frame:
                errors.append(json.dumps(frame["error"])[:300])
            for choice in frame.get("choices") or []:
                pieces.append(choice.get("text") or "")
        return response.status_code, pieces, errors


async def cancel_at_headers(client: httpx.AsyncClient, body: dict) -> None:
    async with client.stream("POST", "/v1/completions", json=body):
        pass  # headers arrived; leaving the block closes the connection before any chunk is read


async def probe(args: argparse.Namespace, server: subprocess.Popen, url: str) -> int:
    followup = {"model": args.model, "prompt": "the owner thread", "max_tokens": 6, "temperature": 0.0, "stream": True}
    cancelled = {"model": args.model, "prompt": "the", "max_tokens": 1, "temperature": 0.0, "stream": True}
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120.0, connect=10.0)) as client:
        await wait_ready(client, server, args.ready_path, args.startup_s)
        await streamed(client, followup)  # warm-up
        status, expected, errors = await streamed(client, followup)
        print(f"on the idle server: HTTP {status}, {''.join(expected)!r}")
        if status != 200 or errors:
            print(f"INCONCLUSIVE: the idle server did not answer cleanly ({errors})")
            return 2
        shown = 0
        for attempt in range(args.tries):
            await cancel_at_headers(client, cancelled)
            status, got, errors = await streamed(client, followup)
            if status == 200 and (got != expected or errors):
                shown += 1
                print(f"try {attempt}: HTTP 200 but {''.join(got)!r}; error frames: {errors}")
            await asyncio.sleep(args.pause_s)  # let the server settle before the next try
    print(f"{shown}/{args.tries} tries: the request after a cancelled stream lost its answer")
    if shown:
        print("BUG: a cancelled streaming request still blocks the next one, which gets HTTP 200 without its answer")
        return 1
    print("ok: the request after a cancelled stream got its normal answer every time")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the model field the server accepts")
    parser.add_argument("--tries", type=int, default=5)
    parser.add_argument("--pause-s", type=float, default=1.0)
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
