"""A small OpenAI-style server whose every decode step is one MLX call, for the compute-after-disconnect
and routes tests. It serves one request at a time on its generation thread and takes `STEP_S` per token.

    python tests/fuzz/gone_server.py PORT [--keeps-decoding] [--chat-only] [--evals-per-step N]

--keeps-decoding: a non-streaming request is decoded to the end even after its client has gone (the bug
the mlx_lm.server of mlx-lm 0.32.2 has); without it, every step first checks that the client is still
there. --chat-only: /v1/completions answers 404, as mlx-openai-server does. --evals-per-step N: each step
is N MLX calls spread over its `STEP_S` (an engine whose step is many calls; one in flight is finished).
"""

from __future__ import annotations

import json
import queue
import select
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import mlx.core as mx

STEP_S = 0.01
KEEPS_DECODING = "--keeps-decoding" in sys.argv
CHAT_ONLY = "--chat-only" in sys.argv
EVALS = int(sys.argv[sys.argv.index("--evals-per-step") + 1]) if "--evals-per-step" in sys.argv else 1
_jobs: "queue.Queue[tuple[int, BaseHTTPRequestHandler, threading.Event, list[str]]]" = queue.Queue()


def generation_thread() -> None:
    """The one thread that enters MLX: decodes each job, a step at a time."""
    while True:
        count, handler, done, tokens = _jobs.get()
        for i in range(count):
            if not KEEPS_DECODING and _gone(handler):
                break
            for _ in range(EVALS):
                mx.eval(mx.array([i]) + 1)
                time.sleep(STEP_S / EVALS)
            tokens.append(str(i % 7))
        done.set()


def _gone(handler: BaseHTTPRequestHandler) -> bool:
    """The client closed its connection: its socket reads as ready with nothing left to read."""
    readable, _, _ = select.select([handler.connection], [], [], 0)
    return bool(readable) and not handler.connection.recv(1, 0x2)  # MSG_PEEK


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if CHAT_ONLY and self.path != "/v1/chat/completions":
            self._send(404, {"error": {"message": "Not Found", "code": "404"}})
            return
        done, tokens = threading.Event(), []
        _jobs.put((int(body.get("max_tokens", 1)), self, done, tokens))
        done.wait()
        chat = self.path == "/v1/chat/completions"
        text = "".join(tokens)
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for token in tokens:
                choice = {"delta": {"content": token}} if chat else {"text": token}
                self.wfile.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True
            return
        choice = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
        self._send(200, {"choices": [{**choice, "finish_reason": "length"}]})

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass  # the client has gone

    def log_message(self, format: str, *args: object) -> None:
        print(format % args, flush=True)


if __name__ == "__main__":
    threading.Thread(target=generation_thread, name="generation", daemon=True).start()
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
