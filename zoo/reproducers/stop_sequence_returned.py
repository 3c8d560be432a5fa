"""Standalone reproducer: does a chat answer hold a stop sequence it asked for?

No fuzzer and no mlx-invariants: the standard library and httpx only. OpenAI's API
reference says of `stop` (chat and completions): up to 4 sequences where the API will stop
generating further tokens; the returned text will not contain the stop sequence. It starts
the server command (with `{port}`) on 127.0.0.1, and then:

1. asks a greedy chat completion (temperature 0, `--tokens` tokens) without `stop`, and
   takes its text;
2. picks two stop sequences that text is sure to hold: a word of it after the first, without
   its leading space, and the middle character of that word (a server that matches stop
   sequences as the token ids of their own encoding never sees either: the model produced
   them inside a longer token such as " word");
3. asks the same again with each as `stop` (or with each `--stop` given, which the first
   answer must hold), streamed and not, and checks the text.

A server that honours `stop` returns the first answer cut before the sequence (greedy, so the
same tokens come); one that does not returns text that holds it. Exit status: 1 the bug shows
(an answer holds its stop sequence), 0 it does not (every answer is the first one cut before
it), 2 inconclusive (the first answer has too few words, an answer differs from the first
one otherwise, the server failed).

Seen here with the embedded tiny model (2026-11-27): mlx-openai-server 1.8.1 returned all four
answers whole, each holding its stop sequence ("six", "i"), and stopped at " six", a whole
token of the answer (`--stop " six"`: exit 0); the reference engine's server (`invariants
serve`, both engines) cut every answer before it (exit 0).

    python stop_sequence_returned.py --model NAME -- mlx-openai-server launch --model-path DIR \\
        --model-type lm --served-model-name NAME --host 127.0.0.1 --port {port}
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
from typing import Optional

import httpx

BUG, NOT_SHOWN, INCONCLUSIVE = 1, 0, 2


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


async def chat(client: httpx.AsyncClient, args: argparse.Namespace, stop: Optional[str],
               stream: bool) -> tuple[str, Optional[str], Optional[int]]:
    """One greedy chat completion: its text, finish_reason and usage.completion_tokens (None if not given)."""
    body = {"model": args.model, "max_tokens": args.tokens, "temperature": 0.0, "stream": stream,
            "messages": [{"role": "user", "content": args.prompt}]}
    if stop is not None:
        body["stop"] = [stop]
    if not stream:
        response = await client.post("/v1/chat/completions", json=body)
        response.raise_for_status()
        answer = response.json()
        choice = answer["choices"][0]
        return (choice["message"].get("content") or "", choice.get("finish_reason"),
                (answer.get("usage") or {}).get("completion_tokens"))
    text, reason, used = "", None, None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            chunk = json.loads(line[5:])
            if "error" in chunk:
                raise RuntimeError(f"the stream carried an error: {chunk['error']}")
            for choice in chunk.get("choices") or []:
                text += (choice.get("delta") or {}).get("content") or ""
                reason = choice.get("finish_reason") or reason
            used = (chunk.get("usage") or {}).get("completion_tokens", used)
    return text, reason, used


def shown(text: str) -> str:
    """`text` as printed: whole if short, else its start and its length."""
    return repr(text) if len(text) <= 60 else f"{text[:60]!r}... ({len(text)} characters)"


def stops_in(text: str) -> list[str]:
    """A word of `text` after its first, without the space before it, and that word's middle character."""
    word = next((w for w in text.split()[1:] if len(w) >= 2), None)
    return [] if word is None else [word, word[len(word) // 2]]


async def probe(args: argparse.Namespace, server: subprocess.Popen, url: str) -> int:
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0, connect=10.0)) as client:
        await wait_ready(client, server, args.ready_path, args.startup_s)
        first, reason, used = await chat(client, args, None, stream=False)
        print(f"without stop: {shown(first)} (finish_reason={reason}, completion_tokens={used}, "
              f"max_tokens={args.tokens})")
        stops = args.stops or stops_in(first)
        if not stops or not all(stop in first for stop in stops):
            print(f"INCONCLUSIVE: the first answer does not hold {args.stops!r}" if args.stops else
                  "INCONCLUSIVE: the first answer has no word of two characters after its first")
            return INCONCLUSIVE
        held = differs = 0
        for stop in stops:
            cut = first[:first.index(stop)]
            for stream in (False, True):
                text, reason, used = await chat(client, args, stop, stream)
                how = "stream" if stream else "non-stream"
                if stop in text:
                    held += 1
                    verdict = f"holds {stop!r} at character {text.index(stop)}  <- the stop sequence returned"
                elif text == cut:
                    verdict = "the first answer cut before it, as it should be"
                else:
                    differs += 1
                    verdict = f"neither holds it nor is the first answer cut before it ({cut!r})"
                print(f"stop={[stop]!r} {how}: {shown(text)} (finish_reason={reason}, completion_tokens={used}): "
                      f"{verdict}")
        if held:
            print(f"BUG: {held} answer(s) held the stop sequence they asked for")
            return BUG
        if differs:
            print("INCONCLUSIVE: an answer differed from the greedy answer without stop")
            return INCONCLUSIVE
        print("ok: every answer stopped before its stop sequence")
        return NOT_SHOWN


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the model field the server accepts")
    parser.add_argument("--tokens", type=int, default=40, help="max_tokens of every request")
    parser.add_argument("--prompt", default="hello world", help="the user message")
    parser.add_argument("--stop", action="append", dest="stops", metavar="TEXT",
                        help="a stop sequence to try instead of those picked from the first answer (repeat it)")
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
    except (RuntimeError, httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        print(f"INCONCLUSIVE: {exc!r}")
        return INCONCLUSIVE
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
