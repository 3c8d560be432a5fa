"""An OpenAI-style server that is correct but slow to answer, for the liveness tests: it serves one
request at a time (wait admission) and takes `STEP_S` per token after `FIRST_S` of prefill, with one
small MLX evaluation per token (the fuzzer refuses, as a setup error, a server it never sees enter MLX). A fixed sub-second "stalled" wait would call it stuck; a wait scaled to its measured pace
must not.

    python tests/fuzz/slow_server.py PORT [--rejects-greedy]

--rejects-greedy: `temperature` 0 is answered 422, as some public servers answer it, so the fuzzer's
requests are served only once `--request-body` sets another.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import mlx.core as mx

FIRST_S = 0.5
STEP_S = 0.02
_ONE_AT_A_TIME = threading.Lock()
REJECTS_GREEDY = "--rejects-greedy" in sys.argv


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        count = int(body.get("max_tokens", 1))
        if REJECTS_GREEDY and not body.get("temperature"):
            payload = json.dumps({"error": {"message": "temperature must be greater than 0",
                                            "type": "invalid_request_error", "code": "invalid_temperature"}})
            self.send_response(422)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload.encode())
            return
        with _ONE_AT_A_TIME:
            time.sleep(FIRST_S)
            if body.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for i in range(count):
                    time.sleep(STEP_S)
                    mx.eval(mx.ones(4) * i)
                    chunk = {"choices": [{"text": str(i % 7), "finish_reason": None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.close_connection = True
                return
            for i in range(count):
                time.sleep(STEP_S)
                mx.eval(mx.ones(4) * i)
        text = "".join(str(i % 7) for i in range(count))
        payload = json.dumps({"choices": [{"text": text, "finish_reason": "length"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        print(format % args, flush=True)  # the server's log: the run folder keeps it


if __name__ == "__main__":
    print("slow server starting", flush=True)
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
