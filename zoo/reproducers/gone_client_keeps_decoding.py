"""Standalone reproducer: does the server keep decoding for a client that has gone?

No fuzzer and no mlx-invariants: the standard library and httpx only. It starts the
server command (with `{port}`) on 127.0.0.1, and then:

1. measures one full request of `--tokens` tokens whose client waits for the answer: its
   wall time, and the CPU time the server spent on it;
2. sends the same request again and lets its client go (closes the connection) after
   a tenth of that wall time (or `--leave-s`);
3. adds up the server's CPU time from then until it is idle.

The server's CPU time is that of its whole process tree, every thread of every process
(from /proc): the command it was started as, each process descended from it, and each
process of its session (it is started in a session of its own), so a server that decodes
in a worker process (mlx-openai-server's model process) is measured where it decodes.

A server that stops a request whose client has gone is idle within a decode step or two
after the client left, a few thousandths of the full request's CPU time; one that does
not spends most of it again. CPU time, not wall time, is compared, so a busy machine does
not change the verdict. Exit status: 1 the bug shows (more than 40% of the full request's
CPU time spent after the client left), 0 it does not, 2 inconclusive (the model stopped
early, the server failed). Linux only (/proc).

    python gone_client_keeps_decoding.py --model NAME --tokens 3000 --mode nonstream \\
        -- mlx_lm.server --model DIR --host 127.0.0.1 --port {port}
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

IDLE_CPU_PER_S = 0.05   # below this share of one core, the server counts as idle
IDLE_FOR_S = 1.0        # ...for this long


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name: state, ppid, pgrp, session, ..."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def server_pids(root: int) -> set[int]:
    """`root` and every live process descended from it or in its session (the server's whole tree)."""
    parents, sessions = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = _stat(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                continue  # the process ended while we looked
            parents[int(entry)], sessions[int(entry)] = int(fields[1]), int(fields[3])
    tree, grown = {root} | {pid for pid, sid in sessions.items() if sid == root}, True
    while grown:
        more = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= more
        grown = bool(more)
    return tree


def cpu_seconds(root: int) -> float:
    """User + system CPU time of every thread of every process of the server's tree, in seconds."""
    total = 0
    for pid in server_pids(root):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue  # the thread ended while we looked
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def request(args: argparse.Namespace, tokens: int, stream: bool) -> tuple[str, dict]:
    body = {"model": args.model, "max_tokens": tokens, "temperature": 0.0, "stream": stream}
    if args.route == "chat":
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": "tell me a story"}]}
    return "/v1/completions", {**body, "prompt": "tell me a story"}


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


async def full_request(client: httpx.AsyncClient, args: argparse.Namespace, pid: int) -> tuple[float, float, int]:
    """Wall seconds and server CPU seconds for a full answer of --tokens tokens, and how many tokens it had."""
    path, body = request(args, args.tokens, stream=False)
    started, cpu = time.monotonic(), cpu_seconds(pid)
    response = await client.post(path, json=body)
    response.raise_for_status()
    produced = int(response.json().get("usage", {}).get("completion_tokens", 0))
    return time.monotonic() - started, cpu_seconds(pid) - cpu, produced


async def leave_early(client: httpx.AsyncClient, args: argparse.Namespace, after_s: float) -> None:
    """Send the same request and drop its connection after `after_s` seconds."""
    path, body = request(args, args.tokens, stream=args.mode == "stream")
    if args.mode == "stream":
        async def read_some() -> None:
            async with client.stream("POST", path, json=body) as response:
                async for _ in response.aiter_lines():
                    pass
        task = asyncio.ensure_future(read_some())
    else:
        task = asyncio.ensure_future(client.post(path, json=body))
    await asyncio.sleep(after_s)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def cpu_until_idle(pid: int, limit_s: float) -> tuple[float, float]:
    """Server CPU seconds spent, and wall seconds passed, until it was idle for IDLE_FOR_S (capped at limit_s)."""
    started, first = time.monotonic(), cpu_seconds(pid)
    last, idle_since, busy_cpu = first, started, first
    while time.monotonic() - started < limit_s:
        await asyncio.sleep(0.25)
        now = cpu_seconds(pid)
        if now - last > IDLE_CPU_PER_S * 0.25:
            idle_since, busy_cpu = time.monotonic(), now
        elif time.monotonic() - idle_since >= IDLE_FOR_S:
            break
        last = now
    return busy_cpu - first, idle_since - started


async def probe(args: argparse.Namespace, server: subprocess.Popen, url: str) -> int:
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0, connect=10.0)) as client:
        await wait_ready(client, server, args.ready_path, args.startup_s)
        print(f"measuring the CPU of the server's {len(server_pids(server.pid))} process(es)")
        path, body = request(args, 8, stream=False)
        (await client.post(path, json=body)).raise_for_status()  # warm-up
        full_s, full_cpu, produced = await full_request(client, args, server.pid)
        print(f"full request: {produced} tokens in {full_s:.2f}s, {full_cpu:.2f}s of server CPU, "
              "with the client waiting")
        if produced < args.tokens * 0.9:
            print(f"INCONCLUSIVE: the model stopped after {produced} of {args.tokens} tokens")
            return 2
        leave_s = max(0.3, full_s / 10) if args.leave_s is None else args.leave_s
        await leave_early(client, args, leave_s)
        after_cpu, busy_s = await cpu_until_idle(server.pid, limit_s=3 * full_s + 10)
        print(f"client ({args.mode}) left after {leave_s:.2f}s; the server then spent {after_cpu:.2f}s of CPU "
              f"over {busy_s:.2f}s ({after_cpu / full_cpu:.0%} of the full request's CPU)")
        if after_cpu > 0.4 * full_cpu:
            print("BUG: the server kept decoding for a client that had gone")
            return 1
        print("ok: the server stopped soon after the client left")
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the model field the server accepts")
    parser.add_argument("--route", choices=("chat", "completions"), default="chat")
    parser.add_argument("--mode", choices=("stream", "nonstream"), default="nonstream")
    parser.add_argument("--tokens", type=int, default=3000)
    parser.add_argument("--leave-s", type=float, default=None,
                        help="when the client goes (default: a tenth of the full request's time, at least 0.3s)")
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
