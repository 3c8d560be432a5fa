"""An OpenAI-style server with one slot, taken when a request's headers arrive (before its body), for the
half-sent-body tests. It streams one token per `STEP_S` and runs no MLX.

    python tests/fuzz/cut_body_server.py PORT [--waits-for-cut-body]

A client that goes after half its body leaves the server headers that promise more. Without the flag the
server sees the connection end, drops it and frees the slot at once. --waits-for-cut-body: it keeps
reading, slot held, until its body timeout `BODY_TIMEOUT_S` (an empty read taken for "not yet"), so the
next request waits that long to begin.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STEP_S = 0.01
BODY_TIMEOUT_S = 5.0  # past the tests' 1 s bound even when a loaded box sends the follow-up seconds late
WAITS = "--waits-for-cut-body" in sys.argv
_slot = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        with _slot:
            length = int(self.headers.get("Content-Length", 0))
            data = self._body(length)
            if len(data) < length:
                print(f"cut body: {len(data)} of {length} bytes", flush=True)
                self.close_connection = True
                return
            self._answer(json.loads(data))

    def _body(self, length: int) -> bytes:
        data, deadline = b"", time.monotonic() + BODY_TIMEOUT_S
        while len(data) < length:
            part = self.rfile.read1(length - len(data))
            if not part:
                if not WAITS or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            data += part
        return data

    def _answer(self, body: dict) -> None:
        tokens = [str(i % 7) for i in range(int(body.get("max_tokens", 1)))]
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            for token in tokens:
                time.sleep(STEP_S)
                self.wfile.write(f"data: {json.dumps({'choices': [{'text': token}]})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            return
        time.sleep(STEP_S * len(tokens))
        data = json.dumps({"choices": [{"text": "".join(tokens), "finish_reason": "length"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        print(format % args, flush=True)


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
