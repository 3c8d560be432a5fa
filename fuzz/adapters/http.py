"""Adapter for any OpenAI-compatible server on a loopback address, optionally launched by us.

With `server_cmd` the server is started once per fuzz run on a free
127.0.0.1 port with the MLX sentinel injected (`fuzz/inject/sitecustomize.py`,
see `fuzz/injection.py`); its spans are merged into each scenario's trace, so a race
inside a server nobody here wrote is still seen. A server cannot be restarted
per scenario, so "shutdown" and "raise" faults are not aimed at it: the client
side cancels and disconnects mid-request and mid-stream, at the points a
client sees (ADMITTED: a streaming response began, or a non-streaming request's
body was sent; chunk k received = CHUNK_SENT(k); the launched server's k-th MLX
entry since the body was sent, seen while the response is awaited =
SERVER_STEP(k); half the body sent = BODY_PART). An error frame inside an HTTP
200 stream, or a data line that is not a JSON object, ends the request as an
error with that message, and so does an error status. How each failed request
was answered (its status, where the error was, its code) goes into its outcome
as a `fuzz.transport.Answer`, for the oracle that compares the two transports.

A launched server asked for worker faults ("worker-dies", "worker-wedges") gets the sentinel's worker
switch: at a point of a scenario the fuzzer arms the fault there (`arm_worker_fault`), for the server's
next MLX call (fuzz/worker_switch.py), and a server whose worker was hit is replaced when the next
adapter starts, so the next scenario meets a new one. Its declared health route (`health`) is what `healthy` reads.
"""

from __future__ import annotations

import asyncio
import atexit
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Optional, TypeVar
from urllib.parse import urlparse

from mlx_invariants.fuzz.adapters.base import Outcome, PointHook, Returned, prompt_text
from mlx_invariants.fuzz.defaults import FIRST_START_S
from mlx_invariants.fuzz.errors import Refused, ServerError
from mlx_invariants.fuzz.injection import sentinel_env
from mlx_invariants.fuzz.lifeline import Lifeline
from mlx_invariants.fuzz.rest import RestSeries, held_counts
from mlx_invariants.fuzz.scenario import ROUTES, FaultKind, RequestSpec
from mlx_invariants.fuzz.sentinel import read_records
from mlx_invariants.fuzz.trace import Trace
from mlx_invariants.fuzz.transport import Answer
from mlx_invariants.fuzz.worker_switch import ArmedFault, switch_port
from mlx_invariants.points import Point

# The fault kinds and points a client of a server can use, declared on `FaultKind` and `Point` (`over_http`).
HTTP_KINDS = tuple(kind.value for kind in FaultKind if kind.over_http)
# A log line that names why a server stopped: an exception, a missing module or command, a bind failure.
_ERROR_LINE = re.compile(r"\w(Error|Exception)\b|No module named|not found|[Aa]ddress already in use|^error\b")
# Simplest first (shrinking moves towards the front): SERVER_STEP needs a launched server's records, and
# BODY_PART sends the server a request it cannot parse.
HTTP_POINTS = tuple(point.name for point in Point if point.over_http)
# A health route that has not answered by then is not answering healthy (a wedged server's may never answer).
HEALTH_TIMEOUT_S = 2.0
# How often a client waiting for its response reads the server's sentinel records (SERVER_STEP).
RECORDS_POLL_S = 0.003
# Body fields that change how a token is chosen: with any of them in `--request-body`, the answer may not
# be greedy, so no lone answer is asked to be scored.
SAMPLING_FIELDS = frozenset({"temperature", "top_p", "top_k", "min_p", "seed", "stop", "n", "logit_bias",
                             "presence_penalty", "frequency_penalty", "repetition_penalty"})


def check_loopback(url: str) -> str:
    host = urlparse(url).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ServerError(f"{url} is not a loopback address; the fuzzer only talks to 127.0.0.1, ::1 or localhost")
    return url.rstrip("/")


class ServerProcess:
    """A server command on a free 127.0.0.1 port, with the sentinel injected; stopped at exit, and when this
    process is killed (`fuzz.lifeline`). Its log and sentinel records live in a temporary folder that
    `close()` (and the exit) removes: a run copies the log into its report folder before it closes."""

    def __init__(self, command: str, owner: Optional[str] = None, startup_s: float = FIRST_START_S,
                 switch: bool = False):
        self.command = command
        # No owner unless declared: the first thread into MLX is then remembered as the loader, and what
        # another thread does is judged by the MLX version's thread rules (`ownership.mlx_only_on_loader`).
        self.owner = owner
        self.startup_s = startup_s
        self.folder = Path(tempfile.mkdtemp(prefix="mlx-invariants-server-"))
        self.records = self.folder / "sentinel.jsonl"
        self.log = self.folder / "server.log"
        # With `switch`, the sentinel's worker switch writes its port here (fuzz/worker_switch.py).
        self.control: Optional[Path] = self.folder / "switch.port" if switch else None
        self.process: Optional[subprocess.Popen] = None
        self.lifeline: Optional[Lifeline] = None
        self.url = ""
        self.ready_s = 0.0  # how long the last start took until the port answered
        self.starts = 0     # processes started so far (a server is restarted after a violating scenario)
        self.rest = RestSeries()  # the running process's rest state, scenario after scenario (`fuzz.rest`)
        self.worker_lost = False  # a worker fault armed in its sentinel fired: the next use starts a new one

    def ensure(self) -> str:
        if self.process is not None and self.process.poll() is None and not self.worker_lost:
            return self.url
        self.worker_lost = False
        self.stop()  # a server that died: let its watchdog go
        port = _free_port()
        if self.control is not None:
            self.control.unlink(missing_ok=True)  # the last process's port
        env = sentinel_env(self.records, self.owner, control=self.control)
        argv = shlex.split(self.command.replace("{port}", str(port)))
        started = time.monotonic()
        try:
            with open(self.log, "ab") as log:
                # Under a watchdog in its own process group: atexit stops it on a normal exit, the lifeline
                # when this process is killed outright (`fuzz.lifeline`).
                self.lifeline = Lifeline(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
                self.process = self.lifeline.process
        except OSError as exc:
            raise ServerError(f"the server command {self.command!r} could not be started: {exc}") from None
        atexit.register(self.close)
        self.starts += 1
        self.rest = RestSeries()
        self.url = f"http://127.0.0.1:{port}"
        self._wait_ready(port)
        self.ready_s = time.monotonic() - started
        return self.url

    def _wait_ready(self, port: int) -> None:
        deadline = time.monotonic() + self.startup_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_tail()
                raise ServerError(f"the server command exited with status {self.process.returncode} before it "
                                  f"listened on its port{_cause(tail)}; its last log lines ({self.log}):\n{tail}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.2)  # polling a process we started; no scenario event is ordered by this
        self.stop()
        tail = self.log_tail()
        raise ServerError(f"the server never became ready: nothing answered on 127.0.0.1:{port} within "
                          f"{self.startup_s:g}s{_cause(tail)}; its last log lines ({self.log}):\n{tail}")

    def identity(self) -> dict[str, Any]:
        """Which process this is, and whether it still runs: its pid (the watchdog's, which exits as the server
        does), port, its number among this run's starts, and its exit status once it ended (None while it runs).
        A report shows it, so that a connection refused mid-scenario says which process was gone, and why
        (its log's last lines name a stop it was asked for)."""
        process = self.process
        return {"pid": process.pid if process is not None else None, "url": self.url, "start": self.starts,
                "exit": process.poll() if process is not None else "stopped"}

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def close(self) -> None:
        """Stop the server and remove its folder (log, records); safe to call twice."""
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def stop(self) -> None:
        process, self.process = self.process, None
        lifeline, self.lifeline = self.lifeline, None
        try:
            if process is None or process.poll() is not None:
                return
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        finally:
            if lifeline is not None:
                lifeline.cut()


def _cause(log_tail: str) -> str:
    """": <the last line that names an error>" if the log has one ("No module named 'x'"), else ""."""
    errors = [line.strip() for line in log_tail.splitlines() if _ERROR_LINE.search(line)]
    return f": {errors[-1]}" if errors else ""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class HttpHandle:
    """One HTTP request: streamed chunks as they arrive, or one JSON body."""

    def __init__(self, adapter: "HttpAdapter", rid: str, response: Any = None, body: Optional[asyncio.Task] = None,
                 pending: Optional[Awaitable[None]] = None):
        self.adapter, self.rid = adapter, rid
        self._pending = pending  # what the fuzzer handed back at ADMITTED, awaited before the first read
        self.response = response
        self.body = body
        self.finish_reason: Optional[str] = None
        self.error: Optional[str] = None
        self.answer: Optional[Answer] = None  # how it was answered, once it failed
        self._chunks = 0
        self._lines: Any = None
        self.leads: list[Optional[float]] = []  # per chunk, from the top log-probabilities it carried (`_lead`)
        self.returned = Returned("chunk")  # the text and log-probabilities the answer came with

    def __aiter__(self) -> "HttpHandle":
        return self

    async def __anext__(self) -> str:
        if self.response is None:
            raise StopAsyncIteration
        if self._lines is None:
            pending, self._pending = self._pending, None
            await self.adapter.landed(pending)  # what is due at ADMITTED lands here, before the first read
            self._lines = self.response.aiter_lines()
        async for line in self._lines:
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            frame, self.error = _frame(data)
            if self.error:  # the server said it failed: nothing after that is this request's answer
                self.answer = Answer.read(self.response.status_code, "frame", frame.get("error") or data,
                                          before=self._chunks)
                break
            choice = (frame.get("choices") or [{}])[0]
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
            text = choice.get("text")
            if text is None:
                text = (choice.get("delta") or {}).get("content") or ""
            self.leads.append(_lead(choice.get("logprobs")))
            self.returned.add(text, *_logprobs_seen(choice.get("logprobs")))
            index, self._chunks = self._chunks, self._chunks + 1
            await self.adapter.reached(Point.CHUNK_SENT, self.rid, index=index)  # before the next read
            return text
        raise StopAsyncIteration

    async def wait_ended(self) -> None:
        if self.body is not None:
            status, payload = await self.body
            choice = (payload.get("choices") or [{}])[0]
            self.finish_reason = choice.get("finish_reason")
            text = choice.get("text") if "text" in choice else (choice.get("message") or {}).get("content")
            self.returned.add(text if isinstance(text, str) else "", *_logprobs_seen(choice.get("logprobs")))
            # An error status is an error whatever its body says (`{"detail": ...}` is FastAPI's).
            error = payload.get("error") or (status >= 400 and (payload.get("detail") or payload))
            if error:
                self.error = json.dumps(error)
                self.answer = Answer.read(status, "status" if status >= 400 else "body", error)
        else:
            async for _ in self:
                pass

    def outcome(self) -> Outcome:
        if self.error:
            return Outcome("error", message=self.error, answer=self.answer)
        return Outcome("completed", reason=self.finish_reason or "")

    def abort(self) -> bool:
        return False  # OpenAI has no abort call: a client disconnects instead

    async def close(self) -> None:
        if self.body is not None and not self.body.done():
            self.body.cancel()
            await asyncio.gather(self.body, return_exceptions=True)
        if self.response is not None:
            await self.response.aclose()


class HttpAdapter:
    """One client of the server at `url`, or of `server` (started on first use and shared by every adapter).

    `routes` are the OpenAI routes the server answers; a request for another one (the driver's follow-up,
    a scenario written for another target) takes the first of them, so a chat-only server is never sent
    a completions request that it can only refuse.
    """

    def __init__(self, url: str, server: Optional[ServerProcess], model: str, routes: tuple[str, ...] = ROUTES,
                 extra: Optional[dict[str, Any]] = None, health: str = ""):
        self.url = url
        self.health = health  # the server's health route ("/health"), if the target declares one
        self.extra = extra or {}  # merged into every body, over the fuzzer's own fields
        self.server = server
        self.routes = routes
        self.owner = None  # this process only runs the client; the server's sentinel has its own owner
        self.name = f"http {server.command if server else url}"
        self.busy_bound_s = 5.0
        self.model = model
        self._hook: Optional[PointHook] = None
        self._client: Any = None
        self._offset = 0
        self._speaks_status = True  # until /v1/status is missing or not in the reference engine's schema
        # A launched server notices a gone client when its next write fails: a release may come this late.
        self.release_grace_s = 2.0 if server is not None else 0.0
        self._armed: list[ArmedFault] = []  # worker faults armed in the server through this adapter

    def set_point_hook(self, hook: Optional[PointHook]) -> None:
        self._hook = hook

    def reach(self, point: Point, rid: str, **info: Any) -> Optional[Awaitable[None]]:
        """Tell the fuzzer this client reached `point`; what it hands back must be awaited before going on."""
        return self._hook(point, rid, info) if self._hook is not None else None

    async def reached(self, point: Point, rid: str, **info: Any) -> None:
        """Reach `point` and let what is due there land before this client goes on (`landed`)."""
        await self.landed(self.reach(point, rid, **info))

    @staticmethod
    async def landed(pending: Optional[Awaitable[None]]) -> None:
        """Let what the fuzzer did at a point land: a worker fault being armed in the launched server (`pending`,
        until the server said so), then a fault delivered on the loop (one turn)."""
        if pending is not None:
            await pending
        await asyncio.sleep(0)

    async def start(self) -> None:
        import httpx

        if self.server is not None:
            self.url = await asyncio.get_running_loop().run_in_executor(None, self.server.ensure)
            self._offset = self.server.records.stat().st_size if self.server.records.exists() else 0
        # A connection per request: a kept-alive one may be closed by the server's idle timer just as the next
        # request goes out on it (uvicorn's fires after 5 s), and that request then dies unanswered, a race
        # of the client's making that no engine bug causes (seen on a GPU run: request-crashed, ReadError).
        self._client = httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(120.0, connect=10.0),
                                         limits=httpx.Limits(max_keepalive_connections=0))

    async def submit_scored(self, spec: RequestSpec) -> HttpHandle:
        """`submit`, asking for the two likeliest tokens' log-probabilities (chat's `top_logprobs`, completions'
        `logprobs`), which the handle reads into `leads`; none asked for when `--request-body` changes the
        sampling (the answer may not be greedy, so nothing is judged), and a server that refuses them is not
        judged either (fuzz/differential.py)."""
        if SAMPLING_FIELDS & set(self.extra):
            return await self.submit(spec)
        route = spec.route if spec.route in self.routes else self.routes[0]
        return await self.submit(spec, {"logprobs": True, "top_logprobs": 2} if route == "chat" else {"logprobs": 2})

    async def submit(self, spec: RequestSpec, scored: Optional[dict[str, Any]] = None) -> HttpHandle:
        text = prompt_text(spec)
        common = {"model": self.model, "max_tokens": spec.max_tokens, "temperature": spec.temperature,
                  "stream": spec.stream, **_sampling_fields(spec)}
        route = spec.route if spec.route in self.routes else self.routes[0]
        if route == "chat":
            path, body = "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": text}]}
            if spec.logprobs or spec.top_logprobs:
                body.update({"logprobs": True, **({"top_logprobs": spec.top_logprobs} if spec.top_logprobs else {})})
        else:
            path, body = "/v1/completions", {**common, "prompt": text}
            if spec.logprobs or spec.top_logprobs:
                body["logprobs"] = spec.top_logprobs  # OpenAI's completions: how many alternatives, 0 for none
        content = json.dumps({**body, **(scored or {}), **self.extra}).encode()
        waiting = _Waiting(self, spec)
        # The full Content-Length up front, the body in two parts (BODY_PART in between).
        request = self._client.build_request("POST", path, content=waiting.body(content),
                                             headers={"Content-Type": "application/json",
                                                      "Content-Length": str(len(content)),
                                                      **self.request_headers(spec)})
        request.extensions["trace"] = waiting.trace
        if not spec.stream:
            return HttpHandle(self, spec.rid, body=asyncio.ensure_future(self._json(request, waiting)))
        response = await waiting.until(self._client.send(request, stream=True))
        if response.status_code != 200:
            await response.aread()
            await response.aclose()
            raise Refused(_error_code(response), response.text[:200],
                          answer=Answer.read(response.status_code, "status", _error_of(response)))
        # Reached, not awaited here: a cancel delivered at ADMITTED must land once the handle is the driver's to
        # close, in its first read, or the stream stays open and the server streams on to a client that is gone
        # (two correct servers read as computing after a disconnect so).
        return HttpHandle(self, spec.rid, response=response, pending=self.reach(Point.ADMITTED, spec.rid))

    def request_headers(self, spec: RequestSpec) -> dict[str, str]:
        """Headers sent with `spec`'s request beyond the body's; none here (a served engine names the request)."""
        return {}

    async def _json(self, request: Any, waiting: "_Waiting") -> tuple[int, dict]:
        """The status and the JSON object of a non-streaming answer (a body that is none reads as an error)."""
        response = await waiting.until(self._client.send(request))
        try:
            payload = response.json()
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            payload = {"error": {"message": f"HTTP {response.status_code}: {response.text[:200]}"}}
        return response.status_code, payload

    async def shutdown(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()
        if any(armed.hit for armed in self._armed) and self.server is not None:
            # Its worker died or wedged: whatever it does now, the next scenario must meet a new server (stopped
            # then, not now: a request still waiting on it is judged as it waits, not as a cut connection).
            self.server.worker_lost = True
        self._armed.clear()

    @property
    def arms_worker_faults(self) -> bool:
        """Whether this adapter's server has the sentinel's worker switch (it was asked for worker faults)."""
        return self.server is not None and self.server.control is not None

    async def arm_worker_fault(self, kind: str, at: str) -> ArmedFault:
        """Arm `kind` in the launched server's worker switch, for its next MLX call (fuzz/worker_switch.py);
        `ConnectionError` if the server has no switch listening."""
        port = switch_port(self.server.control) if self.arms_worker_faults else None
        if port is None:
            raise ConnectionError("the launched server has no worker switch listening")
        armed = await ArmedFault.arm(port, kind, at)
        self._armed.append(armed)
        return armed

    @property
    def healthy(self) -> Optional[bool]:
        """Whether the declared health route answers 200 now (one short blocking GET, read after a scenario
        and after a worker fault); an error status, no answer within `HEALTH_TIMEOUT_S` or a refused
        connection is not healthy. None with no health route declared: nothing is judged by it."""
        if not self.health or self._client is None:
            return None
        import httpx

        try:
            return httpx.get(f"{self.url}{self.health}", timeout=HEALTH_TIMEOUT_S).status_code == 200
        except httpx.HTTPError:
            return False

    def status(self) -> dict[str, int]:
        """What a launched server says it holds at `GET /v1/status`, if that speaks the reference engine's
        schema (a `held` object); {} otherwise: another server's status fields mean other things, and a URL
        target may be shared with other clients. One short blocking GET, read once every request ended."""
        if self.server is None or not self._speaks_status:
            return {}
        import httpx

        try:
            response = httpx.get(f"{self.url}/v1/status", timeout=5.0)
            body = response.json() if response.status_code == 200 else None
        except httpx.HTTPError:
            return {}
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("held"), dict):
            self._speaks_status = False
            return {}
        return held_counts(body)

    @property
    def rest_series(self) -> Optional[RestSeries]:
        """The launched server's rest state, scenario after scenario; None for a URL target."""
        return self.server.rest if self.server is not None else None

    def collect(self, trace: Trace) -> None:
        """Merge the server's sentinel records written since this scenario started."""
        if self.server is None:
            return
        trace.meta["server"] = self.server.identity()
        events, self._offset = read_records(str(self.server.records), self._offset)
        trace.merge(events)


T = TypeVar("T")


class _Waiting:
    """One request from its body to its response: BODY_PART with half the body sent, ADMITTED once all of it is
    on the wire (non-streaming), then, while the response is awaited, SERVER_STEP(k) at the k-th MLX entry
    (from 0) the launched server's sentinel recorded since the rest of the body went out. The records are
    the server's, not the request's: with several requests in flight, an entry counts for each of them. A
    URL target has no records: SERVER_STEP never comes."""

    def __init__(self, adapter: "HttpAdapter", spec: RequestSpec):
        self.adapter, self.rid, self.stream = adapter, spec.rid, spec.stream
        self.records = adapter.server.records if adapter.server is not None else None
        self.last = spec.max_tokens  # an aimed index is clamped below the request's budget: none further
        self.offset: Optional[int] = None  # where the records stood when the rest of the body went out
        self.steps = 0

    async def body(self, content: bytes) -> AsyncIterator[bytes]:
        """The request body as its first half, BODY_PART, then the rest: a fault there leaves the server
        holding headers that promise more body than will ever come."""
        half = len(content) // 2
        yield content[:half]  # httpcore has written it to the socket before it asks for the next part
        await self.adapter.reached(Point.BODY_PART, self.rid)  # before the rest is sent
        if self.records is not None:  # counted from here: the server cannot begin before the rest arrives
            self.offset = self.records.stat().st_size if self.records.exists() else 0
        yield content[half:]

    async def trace(self, event: str, info: dict) -> None:
        """httpcore's trace hook: ADMITTED for a non-streaming request once its whole body is on the wire."""
        if event == "http11.send_request_body.complete" and not self.stream:
            # A disconnect now leaves the server a request in hand; what is due lands before the response is awaited.
            await self.adapter.reached(Point.ADMITTED, self.rid)

    async def until(self, sending: Awaitable[T]) -> T:
        """Await the response, reaching SERVER_STEP meanwhile. A fault there cancels the task that awaits
        the response, so it lands in the send, and the watch stops with it."""
        if self.records is None:
            return await sending
        watch = asyncio.ensure_future(self._watch())
        try:
            return await sending
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)

    async def _watch(self) -> None:
        while self.steps < self.last:
            await asyncio.sleep(RECORDS_POLL_S)  # polls a file another process writes; the point is its content
            if self.offset is None:
                continue  # the body is not all sent yet
            events, self.offset = read_records(str(self.records), self.offset)
            for event in events:
                if event.kind == "mlx" and self.steps < self.last:
                    index, self.steps = self.steps, self.steps + 1
                    await self.adapter.reached(Point.SERVER_STEP, self.rid, index=index)  # before the next entry


def _sampling_fields(spec: RequestSpec) -> dict[str, Any]:
    """The body fields for what `spec` asks for beyond greedy decoding, each only where it is not the default,
    so a plain request's body is what it was before these fields were drawn."""
    fields: dict[str, Any] = {}
    if spec.top_p != 1.0:
        fields["top_p"] = spec.top_p
    if spec.seed is not None:
        fields["seed"] = spec.seed
    if spec.stop:
        fields["stop"] = list(spec.stop)
    return fields


def _logprobs_seen(logprobs: Any) -> tuple[bool, int]:
    """Whether a chunk (or a whole answer) carried log-probabilities, and the fewest top alternatives any of its
    tokens came with: chat's `content[i].top_logprobs`, completions' `token_logprobs` and `top_logprobs[i]`."""
    if logprobs is None:
        return False, 0
    if not isinstance(logprobs, dict):
        return True, 0  # something came, in no shape this reads: present
    if isinstance(logprobs.get("content"), list):
        entries = [e for e in logprobs["content"] if isinstance(e, dict)]
        counts = [len(e.get("top_logprobs") or ()) for e in entries]
        return bool(entries), min(counts, default=0)
    tops = logprobs.get("top_logprobs")
    counts = [len(top) for top in tops if isinstance(top, dict)] if isinstance(tops, list) else []
    return bool(logprobs.get("token_logprobs")), min(counts, default=0)


def _lead(logprobs: Any) -> Optional[float]:
    """How far the likeliest token led the second, in log-probability, at the closest call among a chunk's
    tokens: from chat's `content[i].top_logprobs` or completions' `top_logprobs[i]`; None if not reported."""
    if not isinstance(logprobs, dict):
        return None
    if isinstance(logprobs.get("content"), list):
        tops = [[t.get("logprob") for t in entry.get("top_logprobs") or () if isinstance(t, dict)]
                for entry in logprobs["content"] if isinstance(entry, dict)]
    elif isinstance(logprobs.get("top_logprobs"), list):
        tops = [list(top.values()) for top in logprobs["top_logprobs"] if isinstance(top, dict)]
    else:
        return None
    leads = []
    for top in tops:
        values = sorted((v for v in top if isinstance(v, (int, float))), reverse=True)
        if len(values) < 2:
            return None
        leads.append(values[0] - values[1])
    return min(leads) if leads else None


def _frame(data: str) -> tuple[dict, Optional[str]]:
    """One SSE data line as a JSON object, and the error it stands for, if any: an error frame (the server
    failed after it had answered 200), or a line that is not a JSON object at all."""
    try:
        frame = json.loads(data)
    except ValueError:
        return {}, f"the stream sent a data line that is not JSON: {data[:200]!r}"
    if not isinstance(frame, dict):
        return {}, f"the stream sent a data line that is not a JSON object: {data[:200]!r}"
    if frame.get("error"):
        return frame, f"an error frame inside an HTTP 200 stream: {json.dumps(frame['error'])[:300]}"
    return frame, None


def _error_of(response: Any) -> Any:
    """The error an error status came with: its JSON `error` (or FastAPI's `detail`), else the body's text."""
    try:
        payload = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(payload, dict):
        return payload.get("error") or payload.get("detail") or payload
    return response.text[:200]


def _error_code(response: Any) -> str:
    try:
        return response.json()["error"]["code"] or str(response.status_code)
    except (ValueError, KeyError, TypeError):
        return str(response.status_code)

