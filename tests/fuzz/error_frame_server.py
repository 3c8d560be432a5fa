"""An OpenAI-style server with one slot, for the error-frame and transport tests: it streams one token per
`STEP_S` and runs no MLX. A request that finds the slot taken waits for it, unless a flag answers it at once.

    python tests/fuzz/error_frame_server.py PORT [--leaks-cancelled] [--refuses | --busy-frames [--named]]
                                                 [--mlx]

--leaks-cancelled: a stream whose client went before its end never gives its slot back, and a request
that finds the slot taken is answered HTTP 200 with an error (an SSE frame, or a plain JSON body) instead
of its tokens (what vllm-mlx 0.6.0 does after a cancelled stream:
zoo/reproducers/cancelled_stream_then_followup.py).
--refuses: a request that finds the slot taken is refused with HTTP 429 on both transports, before any
stream begins (a clear refusal, the same on both).
--busy-frames: a plain request that finds the slot taken is refused 503 `text_generation_busy`, a streaming
one answered HTTP 200 whose only frame is a generic "Internal server error" (code 500): what vllm-mlx
0.6.0's SimpleEngine does while busy (docs/zoo.md). --named: that frame is the busy error itself.
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
BUSY_FRAMES = "--busy-frames" in sys.argv
NAMED = "--named" in sys.argv
BUSY = {"message": "the server is busy with another request", "type": "server_busy", "code": "text_generation_busy"}
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
        if not _slot.acquire(blocking=not (LEAKS or REFUSES or BUSY_FRAMES)):
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
        """Answer a request that found the slot taken, as the flags say."""
        if REFUSES:
            self._send(429, {"error": {"message": "server busy", "code": "busy"}})
            return
        if BUSY_FRAMES and not stream:
            self._send(503, {"error": BUSY})
            return
        error = {"message": "Internal server error", "type": "internal_error"}
        if BUSY_FRAMES:
            error = BUSY if NAMED else {"message": "Internal server error", "type": "InternalServerError", "code": 500}
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
