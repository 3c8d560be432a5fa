"""Standalone reproducer: is a request that arrives while the server still finishes a cancelled
stream answered properly (its text, or a clear refusal with an error status)?

No fuzzer and no mlx-invariants: the standard library and httpx only. It starts the
server command (with `{port}`) on 127.0.0.1, records a greedy answer on the idle server,
then, several times: opens a streaming request, closes it as soon as the response headers
arrive (the client cancelled), and at once sends the recorded request again (streaming, or
with `--followup nonstream` a plain one). A server still busy with the cancelled request
for a moment may refuse the follow-up, but with an error status (a 503 the client can
retry); the bug is an HTTP 200 whose body is an error or an empty answer. After such a
try it resends the follow-up every 10 ms and says how long the refusals lasted (the window
in which the server was still finishing the cancelled request). Exit status: 1 the bug
shows in at least one try, 0 it does not, 2 inconclusive (the server failed).

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


async def plain(client: httpx.AsyncClient, body: dict) -> tuple[int, list[str], list[str]]:
    """HTTP status, the text, and the error (if any) of one non-streaming completion."""
    response = await client.post("/v1/completions", json={**body, "stream": False})
    if response.status_code != 200:
        return response.status_code, [], [response.text[:300]]
    answer = response.json()
    return 200, [c.get("text") or "" for c in answer.get("choices") or []], (
        [json.dumps(answer["error"])[:300]] if "error" in answer else [])


async def cancel_at_headers(client: httpx.AsyncClient, body: dict) -> None:
    async with client.stream("POST", "/v1/completions", json=body):
        pass  # headers arrived; leaving the block closes the connection before any chunk is read


async def probe(args: argparse.Namespace, server: subprocess.Popen, url: str) -> int:
    followup = {"model": args.model, "prompt": "the owner thread", "max_tokens": 6, "temperature": 0.0, "stream": True}
    cancelled = {"model": args.model, "prompt": "the", "max_tokens": 1, "temperature": 0.0, "stream": True}
    send = streamed if args.followup == "stream" else plain
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120.0, connect=10.0)) as client:
        await wait_ready(client, server, args.ready_path, args.startup_s)
        await send(client, followup)  # warm-up
        status, expected, errors = await send(client, followup)
        print(f"on the idle server ({args.followup} follow-up): HTTP {status}, {''.join(expected)!r}")
        if status != 200 or errors:
            print(f"INCONCLUSIVE: the idle server did not answer cleanly ({errors})")
            return 2
        shown, refused = 0, 0
        for attempt in range(args.tries):
            await cancel_at_headers(client, cancelled)
            sent = time.monotonic()
            status, got, errors = await send(client, followup)
            if status == 200 and (got != expected or errors):
                shown += 1
                retries = 0
                while True:  # how long until the same request gets its answer
                    await asyncio.sleep(0.01)
                    retries += 1
                    again, text, again_errors = await send(client, followup)
                    if (again == 200 and text == expected and not again_errors) or retries >= 500:
                        break
                print(f"try {attempt}: HTTP 200 but {''.join(got)!r}; error frames: {errors}; the same request "
                      f"got its answer {time.monotonic() - sent:.3f}s after the first one was sent "
                      f"({retries} resend(s) 10 ms apart)")
            elif status != 200:
                refused += 1
                print(f"try {attempt}: refused with HTTP {status} {errors}")
            await asyncio.sleep(args.pause_s)  # let the server settle before the next try
    print(f"{shown}/{args.tries} tries: HTTP 200 without the answer; {refused}/{args.tries} refused with an "
          "error status")
    if shown:
        print("BUG: a request that arrived while the server still finished a cancelled stream got HTTP 200 "
              "with an error frame or no text instead of its answer or an error status")
        return 1
    print("ok: every follow-up got its normal answer or an error status")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the model field the server accepts")
    parser.add_argument("--tries", type=int, default=5)
    parser.add_argument("--followup", choices=("stream", "nonstream"), default="stream",
                        help="the request sent right after the cancelled stream")
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
