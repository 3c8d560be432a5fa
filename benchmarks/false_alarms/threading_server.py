"""An OpenAI server on `http.server.ThreadingHTTPServer` in front of ONE generation thread fed by a queue,
the way mlx_lm.server is built.

    python -m false_alarms.threading_server --port PORT

Threads: a thread per connection parses and answers; the generation thread loads the model and runs
every request, one at a time. Handoffs: `Job` into the generation queue; (text, finish) pieces back
through the job's own `queue.Queue`; a `threading.Event` per job, set by its connection thread once the
client has gone (a failed write while streaming; the socket reading as closed while a non-streaming
answer is collected). Costs: a gone client stops decode within a token or two.
"""

from __future__ import annotations

import argparse
import json
import queue
import select
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

from false_alarms._common import (DONE_FRAME, Ask, BadRequest, answer_body, chunk_frame, encode, error_body,
                                  load_model, parse_ask)


@dataclass
class Job:
    ask: Ask
    out: "queue.Queue[tuple[str, Optional[str]] | None]" = field(default_factory=queue.Queue)
    stop: threading.Event = field(default_factory=threading.Event)


JOBS: "queue.Queue[Job]" = queue.Queue()


def generation_thread(ready: threading.Event) -> None:
    """The one thread that enters MLX."""
    from mlx_lm import stream_generate

    model, tokenizer = load_model()
    ready.set()
    while True:
        job = JOBS.get()
        try:
            if job.stop.is_set():
                continue
            generator = stream_generate(model, tokenizer, encode(tokenizer, job.ask.text, job.ask.chat),
                                        max_tokens=job.ask.max_tokens)
            try:
                for response in generator:
                    job.out.put((response.text, response.finish_reason))
                    if job.stop.is_set():
                        break
            finally:
                generator.close()
        except Exception as exc:  # this request fails; the thread goes on
            job.out.put((f"generation failed: {exc}", "error"))
        finally:
            job.out.put(None)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        raw = self.rfile.read(length)
        if len(raw) < length:
            return  # the client went before its body was whole
        try:
            ask = parse_ask(self.path, raw)
        except BadRequest as exc:
            self._send_json(404 if "no route" in str(exc) else 400, error_body(str(exc), "bad_request"))
            return
        job = Job(ask)
        JOBS.put(job)
        if ask.stream:
            self._stream(job)
        else:
            self._collect(job)

    def _stream(self, job: Job) -> None:
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            while (item := job.out.get()) is not None:
                self.wfile.write(chunk_frame(job.ask, *item))
                self.wfile.flush()
            self.wfile.write(DONE_FRAME)
        except OSError:
            job.stop.set()  # the client went
        self.close_connection = True

    def _collect(self, job: Job) -> None:
        """The whole answer; the job is stopped as soon as the client has gone."""
        text, finish = [], "length"
        while True:
            try:
                item = job.out.get(timeout=0.05)
            except queue.Empty:
                item = ()
            if self._client_gone():
                job.stop.set()
                return
            if item is None:
                break
            if item:
                text.append(item[0])
                finish = item[1] or finish
        self._send_json(200, answer_body(job.ask, "".join(text), finish))

    def _client_gone(self) -> bool:
        readable, _, _ = select.select([self.connection], [], [], 0)
        try:
            return bool(readable) and not self.connection.recv(1, socket.MSG_PEEK)
        except OSError:
            return True

    def _send_json(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass  # the client has gone

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main(port: int) -> None:
    ready = threading.Event()
    threading.Thread(target=generation_thread, args=(ready,), name="generation", daemon=True).start()
    ready.wait()
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    main(parser.parse_args().port)
