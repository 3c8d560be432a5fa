"""An OpenAI-style server with one MLX generation thread whose death nobody notices: every request is queued
to that thread, which makes its tokens and hands them back one by one, and `/health` answers 200 whatever
happens. Once an exception escapes the generation thread (the "worker-dies" fault armed in the sentinel, or
mlx-lm's server before it caught its generation thread's errors), every request in flight and every new one
waits forever for tokens that never come, while `/health` still says 200.

    python tests/fuzz/dead_worker_server.py PORT
"""

from __future__ import annotations

import json
import queue
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import mlx.core as mx

WORK: "queue.Queue[tuple[int, queue.Queue]]" = queue.Queue()
DONE = None  # the end of one request's tokens


def generate() -> None:
    """The one MLX thread. Nothing catches what escapes it: the bug."""
    while True:
        count, out = WORK.get()
        for step in range(count):
            value = mx.sum(mx.arange(64) * (step + 1))
            mx.eval(value)
            out.put(str(int(value.item()) % 7))
        out.put(DONE)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/health":
            self._json(200, {"status": "ok"})  # alive as far as it knows: it never looks at its thread
        else:
            self._json(404, {"error": {"message": "not found", "type": "invalid_request_error", "code": None}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        tokens: queue.Queue = queue.Queue()
        WORK.put((int(body.get("max_tokens", 1)), tokens))
        if not body.get("stream"):
            text = "".join(iter(tokens.get, DONE))  # waits with no bound for the generation thread
            self._json(200, {"choices": [{"text": text, "finish_reason": "length"}]})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for piece in iter(tokens.get, DONE):
            chunk = {"choices": [{"text": piece, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def _json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    threading.Thread(target=generate, name="generation", daemon=True).start()
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
