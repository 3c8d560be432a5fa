"""Standalone reproducer: does a prompt that the prompt cache holds whole kill the server's generation?

No fuzzer and no mlx-invariants: the standard library and httpx only. It starts the
server command (with `{port}`) on 127.0.0.1 and sends greedy completions whose prompt is,
token for token, one the server's prompt cache has just stored. mlx_lm.server 0.32.2 stores
the tokens of a finished request (its prompt and completion) and, once a request's prompt
is read, that prompt without its last token. A new request with exactly those tokens
leaves nothing to compute: the generation thread dies ("Sequence N has an empty prompt")
and every later request fails (HTTP 404 "generation thread died"). A server that always
keeps at least one prompt token to compute answers normally. Three ways there, and a control:

  continuation  a request, then its prompt followed by the text it got back (no cancel)
  concurrent    a long streaming request, and while it runs, its prompt less the last word
  cancel        a long streaming request cancelled at its first chunk, then its prompt less
                the last word (the shape the fuzzer found)
  repeat        the control: a request, then the same prompt again; the cache holds its
                completion too, so this is no exact match and even 0.32.2 answers it

A text that does not re-tokenize to those tokens proves nothing, so the script tries a
few prompts until one lines up. Exit status: 1 the bug shows, 0 it does not, 2
inconclusive (the server failed first, or no prompt lined up).

    python cached_prompt_kills_generation.py --model NAME -- mlx_lm.server --model DIR --port {port}
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

PROMPTS = ("hello world", "the quick owner thread", "every metal command buffer", "tokens to each client")
SERVER_LOG_MARKERS = ("ValueError", "generation thread died")
BUSY = (429, 503)   # a refusal: the server is full, not broken


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


async def complete(client: httpx.AsyncClient, body: dict) -> tuple[int, str, dict, str]:
    """HTTP status, text, usage and error text of one completion, streamed or not; status 0: no answer."""
    try:
        if not body.get("stream"):
            response = await client.post("/v1/completions", json=body)
            if response.status_code != 200:
                return response.status_code, "", {}, response.text[:300]
            answer = response.json()
            return 200, (answer.get("choices") or [{}])[0].get("text") or "", answer.get("usage") or {}, ""
        pieces, usage, errors = [], {}, []
        request = {**body, "stream_options": {"include_usage": True}}
        async with client.stream("POST", "/v1/completions", json=request) as response:
            if response.status_code != 200:
                return response.status_code, "", {}, (await response.aread()).decode(errors="replace")[:300]
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                frame = json.loads(line[5:])
                if "error" in frame:
                    errors.append(json.dumps(frame["error"])[:300])
                usage = frame.get("usage") or usage
                for choice in frame.get("choices") or []:
                    pieces.append(choice.get("text") or "")
        return 200, "".join(pieces), usage, "; ".join(errors)
    except httpx.TransportError as exc:
        return 0, "", {}, f"{type(exc).__name__}: {exc}"


async def long_stream(client: httpx.AsyncClient, body: dict, chunks: int, meanwhile=None):
    """Stream `body` until `chunks` chunks arrived, await `meanwhile` (if any) while it still runs, then
    close the stream (the client cancels). Returns what `meanwhile` returned."""
    async with client.stream("POST", "/v1/completions", json=body) as response:
        seen = 0
        async for line in response.aiter_lines():
            seen += line.startswith("data:")
            if seen >= chunks:
                break
        return await meanwhile if meanwhile is not None else None


async def still_answers(client: httpx.AsyncClient, base: dict) -> tuple[int, str]:
    """HTTP status and error of an unrelated request, sent again while the server refuses it as busy
    (a server that serves one request at a time may still be ending a cancelled one)."""
    for _ in range(10):
        status, _, _, error = await complete(client, {**base, "prompt": "hi", "max_tokens": 1})
        if status not in BUSY:
            return status, error
        await asyncio.sleep(0.5)
    return status, error


def server_says(log_path: str) -> list[str]:
    with open(log_path, errors="replace") as log:
        return [line.rstrip() for line in log if any(marker in line for marker in SERVER_LOG_MARKERS)]


async def one_try(client: httpx.AsyncClient, args: argparse.Namespace, base: dict, prompt: str):
    """Send the cached prompt `args.via` makes from `prompt`: (its answer as `complete` gives it, and
    whether its tokens were exactly the cached ones; None: the server failed before)."""
    if args.via in ("continuation", "repeat"):
        status, text, usage, error = await complete(client, {**base, "prompt": prompt, "max_tokens": args.tokens})
        print(f"{prompt!r} (max_tokens={args.tokens}): HTTP {status} {text!r} usage {usage} {error}".rstrip())
        if status != 200 or error:
            return None
        cached = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
        again = prompt if args.via == "repeat" else prompt + text
        answer = await complete(client, {**base, "prompt": again, "max_tokens": 1})
        print(f"  then {again!r}: HTTP {answer[0]} {answer[1]!r} usage {answer[2]} {answer[3]}".rstrip())
        return answer, args.via == "repeat" or answer[2].get("prompt_tokens") == cached
    shorter = prompt.rsplit(" ", 1)[0]
    first = {**base, "prompt": prompt, "max_tokens": args.long_tokens, "stream": True}
    second = {**base, "prompt": shorter, "max_tokens": 1}
    if args.via == "concurrent":
        print(f"{prompt!r} streaming (max_tokens={args.long_tokens}); after its 2nd chunk, meanwhile:")
        answer = await long_stream(client, first, 2, complete(client, second))
    else:
        await long_stream(client, first, 1)
        print(f"{prompt!r} streamed (max_tokens={args.long_tokens}), cancelled at its first chunk; then:")
        await asyncio.sleep(args.pause_s)
        answer = await complete(client, second)
    print(f"  {shorter!r}: HTTP {answer[0]} {answer[1]!r} usage {answer[2]} {answer[3]}".rstrip())
    if answer[0] != 200 or answer[3]:
        return answer, True
    # The longer prompt's token count, read only now so that it cached nothing before the probe.
    status, _, usage, _ = await complete(client, {**base, "prompt": prompt, "max_tokens": 1, "stream": False})
    return answer, status == 200 and usage.get("prompt_tokens") == answer[2].get("prompt_tokens", -2) + 1


async def probe(args: argparse.Namespace, server: subprocess.Popen, url: str, log_path: str) -> int:
    base = {"model": args.model, "temperature": 0.0, "stream": args.stream}
    timeout = httpx.Timeout(args.request_s, connect=10.0)
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
        await wait_ready(client, server, args.ready_path, args.startup_s)
        for prompt in PROMPTS:
            tried = await one_try(client, args, base, prompt)
            if tried is None:
                print("INCONCLUSIVE: the server failed an ordinary request first")
                return 2
            (status, _, _, error), lined_up = tried
            if status in BUSY:
                print(f"  (refused as busy: HTTP {status}; no exact match tried)")
                lined_up = False
            answered = (status == 200 and not error) or status in BUSY
            alive, alive_error = await still_answers(client, base)
            if answered and alive == 200 and not alive_error:
                if lined_up:
                    print("ok: " + ("the same prompt again" if args.via == "repeat" else
                                    "a prompt of exactly the tokens a prompt cache would hold") + " got its answer")
                    return 0
                continue  # the text did not re-tokenize to the cached tokens: no exact match, try another
            print(f"  then an unrelated request: HTTP {alive} {alive_error}".rstrip())
            for line in server_says(log_path)[:3]:
                print(f"  server log: {line}")
            if alive != 200 or alive_error:
                print("BUG: a prompt that the prompt cache holds whole killed the generation thread; "
                      "every request after it fails")
            else:
                print("BUG: a prompt that the prompt cache holds whole failed, though the server still answers")
            return 1
    print(f"INCONCLUSIVE: no prompt of {PROMPTS} re-tokenized to the tokens the prompt cache held")
    return 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the model field the server accepts")
    parser.add_argument("--via", choices=("continuation", "concurrent", "cancel", "repeat"),
                        default="continuation", help="how the cached prompt comes about (see the module docstring)")
    parser.add_argument("--tokens", type=int, default=1, help="continuation, repeat: max_tokens of the first request")
    parser.add_argument("--long-tokens", type=int, default=2000,
                        help="concurrent, cancel: max_tokens of the long streaming request")
    parser.add_argument("--stream", action="store_true", help="stream the probe requests too")
    parser.add_argument("--pause-s", type=float, default=0.5, help="cancel: wait after the cancel")
    parser.add_argument("--request-s", type=float, default=60.0, help="how long one request may take")
    parser.add_argument("--ready-path", default="/v1/models")
    parser.add_argument("--startup-s", type=float, default=180.0)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the server command, with {port}")
    args = parser.parse_args()
    command = [part for part in args.command if part != "--"]
    if not any("{port}" in part for part in command):
        parser.error("give the server command after --, with a {port} placeholder")
    if args.tokens < 1 or args.long_tokens < 1:
        parser.error("--tokens and --long-tokens must be at least 1")
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="server-", suffix=".log", delete=False)
    argv = [part.replace("{port}", str(port)) for part in command]
    print("server:", shlex.join(argv), "log:", log.name)
    try:
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        print(f"INCONCLUSIVE: the server command did not start: {exc}")
        return 2
    try:
        return asyncio.run(probe(args, server, f"http://127.0.0.1:{port}", log.name))
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
