"""An OpenAI-style server with one slot, for the error-frame tests: it streams one token per `STEP_S` and
runs no MLX. A request that finds the slot taken waits for it.

    python tests/fuzz/error_frame_server.py PORT [--leaks-cancelled [--refuses]] [--mlx]

--leaks-cancelled: a stream whose client went before its end never gives its slot back, and a request
that finds the slot taken is answered HTTP 200 with an error frame instead of its tokens (what vllm-mlx
0.6.0 does after a cancelled stream: zoo/reproducers/cancelled_stream_then_followup.py).
--refuses: such a request is refused with HTTP 429 before any stream begins instead (a clear refusal).
--mlx: each token step also makes one small MLX call, so a launched server's sentinel sees it generate.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STEP_S = 0.01
LEAKS = "--leaks-cancelled" in sys.argv
REFUSES = "--refuses" in sys.argv
MLX = "--mlx" in sys.argv
_slot = threading.Semaphore(1)


def _step() -> None:
    """One token's time, and with --mlx one MLX call."""
    time.sleep(STEP_S)
    if MLX:
        import mlx.core as mx

        mx.eval(mx.array([1]) + 1)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if not _slot.acquire(blocking=not LEAKS):
            self._busy(bool(body.get("stream")))
            return
        gone = False
        try:
            gone = self._answer(int(body.get("max_tokens", 1)), bool(body.get("stream")))
        finally:
            if not (gone and LEAKS):
                _slot.release()

    def _answer(self, count: int, stream: bool) -> bool:
        """Serve the tokens; True if the client went before the end."""
        tokens = [str(i % 7) for i in range(count)]
        if not stream:
            for _ in tokens:
                _step()
            return self._send(200, {"choices": [{"text": "".join(tokens), "finish_reason": "length"}]})
        try:
            self._stream_head()
            for token in tokens:
                _step()
                self._frame({"choices": [{"text": token, "finish_reason": None}]})
            self.wfile.write(b"data: [DONE]\n\n")
        except OSError:
            return True  # the client closed its connection mid-stream
        return False

    def _busy(self, stream: bool) -> None:
        error = {"message": "Internal server error", "type": "internal_error"}
        if REFUSES:
            self._send(429, {"error": {"message": "server busy", "code": "busy"}})
            return
        if not stream:
            self._send(200, {"error": error})
            return
        self._stream_head()
        self._frame({"error": error})
        self.wfile.write(b"data: [DONE]\n\n")

    def _stream_head(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _frame(self, payload: dict) -> None:
        self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
        self.wfile.flush()

    def _send(self, status: int, payload: dict) -> bool:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            return True
        return False

    def log_message(self, format: str, *args: object) -> None:
        print(format % args, flush=True)


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
