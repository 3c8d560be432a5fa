"""Standalone reproducer: does one request's generation stop the server answering anything else?

No fuzzer and no mlx-invariants: the standard library and httpx only. It starts the
server command (with `{port}`) on 127.0.0.1, and then:

1. times one non-streaming request of `--tokens` tokens alone (after a short warm-up);
2. sends the same request again and, a quarter of that time later, a cheap GET
   (`--probe-path`, by default the ready path) on a connection of its own;
3. compares when each answer came.

A server whose event loop stays free answers the GET in a few milliseconds, long before
the generation ends. One that runs the generation on its event loop (a synchronous MLX
call inside an `async def` route) answers it only when the generation is over: the GET
waits for most of the request and comes back with it. The verdict compares the two
answers' order and the GET's wait with the request's own length, never an absolute time,
so a busy machine does not change it. Run it against one server process (uvicorn's
`--workers 1`): with more, the GET may land on a worker the request does not hold.

Exit status: 1 the bug shows (in every repeat the GET waited at least half the request's
length and came back no earlier than a tenth of it before the generation's answer), 0 it
does not (in every repeat the GET waited under a tenth of it), 2 inconclusive (mixed
repeats, a request alone not 20 times a GET alone, the server failed).

    python loop_blocked_by_request.py --model NAME --tokens 400 \\
        -- fastmlx --host 127.0.0.1 --port {port} --workers 1

A server of another API takes `--path` and `--body` (the JSON sent as it is, long enough to
take many times a GET) and, where it has no `/v1/models`, `--ready-path`.
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

BLOCKED_WAIT = 0.5    # the GET waited at least this share of the request's length...
WITH_ANSWER = 0.1     # ...and came back within this share of it before the generation's answer
FREE_WAIT = 0.1       # a free loop answers the GET in under this share
LONGER_THAN_GET = 20  # the request alone must take this many times a GET alone, or nothing can be told


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def chat(args: argparse.Namespace, tokens: int) -> dict:
    """The request's body: an OpenAI chat completion, or --body as given (a server of another API)."""
    if args.body is not None:
        return args.body
    return {"model": args.model, "max_tokens": tokens, "temperature": 0.0, "stream": False,
            "messages": [{"role": "user", "content": "tell me a story"}]}


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


async def generation(client: httpx.AsyncClient, args: argparse.Namespace) -> tuple[float, int]:
    """Seconds until the answer of a --tokens request came, and how many tokens it had."""
    started = time.monotonic()
    response = await client.post(args.path, json=chat(args, args.tokens))
    response.raise_for_status()
    return time.monotonic() - started, int(response.json().get("usage", {}).get("completion_tokens", 0))


async def get_during(url: str, args: argparse.Namespace, full_s: float) -> tuple[float, float, float]:
    """The request again with a GET sent a quarter of `full_s` in: (request answered at, GET sent at, GET
    answered at), seconds from the request's start. Each on a client of its own: no shared connection pool."""
    timeout = httpx.Timeout(600.0, connect=10.0)
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as long, \
            httpx.AsyncClient(base_url=url, timeout=timeout) as short:
        started = time.monotonic()
        pending = asyncio.ensure_future(generation(long, args))
        await asyncio.sleep(full_s / 4)
        sent = time.monotonic() - started
        (await short.get(args.probe_path)).raise_for_status()
        answered = time.monotonic() - started
        await pending
        return time.monotonic() - started, sent, answered


def verdict(request_s: float, sent_s: float, answered_s: float) -> int:
    """1 blocked, 0 free, 2 neither, for one repeat (seconds from the request's start)."""
    wait = answered_s - sent_s
    if wait >= BLOCKED_WAIT * request_s and answered_s >= request_s - WITH_ANSWER * request_s:
        return 1
    return 0 if wait < FREE_WAIT * request_s else 2


async def probe(args: argparse.Namespace, server: subprocess.Popen, url: str) -> int:
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0, connect=10.0)) as client:
        await wait_ready(client, server, args.ready_path, args.startup_s)
        (await client.post(args.path, json=chat(args, 8))).raise_for_status()  # warm-up
        full_s, produced = await generation(client, args)
        started = time.monotonic()
        (await client.get(args.probe_path)).raise_for_status()
        get_s = time.monotonic() - started
    tokens = f"{produced} tokens" if produced else "its answer gives no usage"
    print(f"alone: the request {full_s:.2f}s ({tokens}), GET {args.probe_path} {get_s:.3f}s")
    if full_s < LONGER_THAN_GET * get_s:
        print(f"INCONCLUSIVE: the request is not {LONGER_THAN_GET}x a GET's time; ask for more --tokens")
        return 2
    codes = []
    for repeat in range(args.repeats):
        request_s, sent_s, answered_s = await get_during(url, args, full_s)
        codes.append(verdict(request_s, sent_s, answered_s))
        print(f"repeat {repeat + 1}: GET {args.probe_path} sent at {sent_s:.2f}s, answered at {answered_s:.2f}s "
              f"(waited {answered_s - sent_s:.2f}s); the generation answered at {request_s:.2f}s")
    if set(codes) == {1}:
        print(f"BUG: while one request generated, the server answered nothing else (GET {args.probe_path} "
              "waited for the generation to end)")
        return 1
    if set(codes) == {0}:
        print(f"ok: the server answered GET {args.probe_path} while the request generated")
        return 0
    print(f"INCONCLUSIVE: repeats disagree ({codes})")
    return 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="", help="the model field the server accepts")
    parser.add_argument("--path", default="/v1/chat/completions", help="where the request is POSTed")
    parser.add_argument("--body", type=json.loads, default=None,
                        help="the request's JSON body, for a server of another API (default: an OpenAI chat "
                             "completion of --tokens tokens for --model)")
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--ready-path", default="/v1/models")
    parser.add_argument("--probe-path", default=None, help="the GET sent during the generation (default: --ready-path)")
    parser.add_argument("--startup-s", type=float, default=180.0)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the server command, with {port}")
    args = parser.parse_args()
    args.probe_path = args.probe_path or args.ready_path
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
