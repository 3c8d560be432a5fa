"""An OpenAI-style server that keeps each connection alive after its first answer and then, when the next
request comes on it, closes it unanswered: what any keep-alive server does when its idle timer fires just as
the request arrives (uvicorn's is 5 s). The request never reached the application, so a client that reused
the connection sees it closed, not an engine error. Runs no MLX.

    python tests/fuzz/idle_close_server.py PORT
"""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    answered = False  # per connection: one handler object serves every request of its connection

    def do_GET(self) -> None:
        self._reply(404, {"error": {"message": "not found", "type": "invalid_request_error", "code": None}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        tokens = int(body.get("max_tokens", 1))
        if body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            for i in range(tokens):
                self.wfile.write(f"data: {json.dumps({'choices': [{'text': str(i % 7)}]})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            return
        self._reply(200, {"choices": [{"text": "".join(str(i % 7) for i in range(tokens)),
                                       "finish_reason": "length"}],
                          "usage": {"completion_tokens": tokens}})

    def handle_one_request(self) -> None:
        if self.answered:  # the idle timer fires as the next request comes: close it, unanswered
            self.rfile.peek(1)
            self.close_connection = True
            return
        super().handle_one_request()
        self.answered = True

    def _reply(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    print("serving", flush=True)
    server.serve_forever()
