"""A deliberately racy OpenAI-style server for the HTTP adapter tests: it warms MLX up on a thread named
"generation", which it says owns MLX, but every request runs its MLX work on its own handler thread
(ThreadingHTTPServer), so requests enter MLX off that owner, and two of them at once. The tests declare
the owner (`--owner generation`), as a maintainer of such a server would.

    python tests/fuzz/racy_server.py PORT
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import mlx.core as mx


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        count = int(body.get("max_tokens", 1))
        text = []
        for i in range(count):
            text.append(str(int(mx.sum(mx.arange(256) * i).item()) % 7))  # MLX on the handler thread
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for piece in text:
                chunk = {"choices": [{"text": piece, "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            return
        payload = json.dumps({"choices": [{"text": "".join(text), "finish_reason": "length"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


if __name__ == "__main__":
    warmup = threading.Thread(target=lambda: mx.eval(mx.arange(256) * 2), name="generation")
    warmup.start()
    warmup.join()
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
