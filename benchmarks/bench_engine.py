"""Benchmark (not a test): the reference engine's routes against `mlx_lm.server`, side by side in one run.

Each server runs as a subprocess on a free 127.0.0.1 port; all are up at once
and measured one at a time (never two measuring at once), their repeats
interleaved so that machine drift lands on all of them alike. Each gets the same
prompts, the same `max_tokens` and streaming `/v1/completions` requests.
Measured per server:

- aggregate completion tok/s at each concurrency (completion tokens counted from
  the stream's `usage`, never assumed, divided by the wall clock of the round);
- TTFT p50/p90 at each concurrency;
- late arrival: a long request streams ~20 tokens, then a short one is sent and
  its time to first token is taken; the long stream's median inter-token time
  over those first tokens is the server's decode step, so the TTFT is also
  given in decode steps;
- event-loop lag proxy: `GET /health` polled every 10 ms during the highest
  concurrency round, p99 of its latency.

The peer is launched by a wrapper that raises its `ThreadingHTTPServer` listen
backlog from 5 to 128 (unmodified, it dropped connections at c=32 on an H100:
client `ReadError`); the unmodified server is then probed once at the top
concurrency and what happened is recorded (`peer_unmodified` in the JSON).

Each round's tok/s is also given as a share of the memory-bandwidth limit: a
decode step reads every parameter once, so a batch of b sequences cannot make
more than b * bandwidth / parameter bytes tokens a second (parameter bytes from
the model's safetensors headers; bandwidth from the device's name, or
`--bandwidth-gbs`). The serialized route decodes a batch of one at any c.

Ratios measured in the same run are what the targets judge; absolute numbers
depend on the machine and on whatever else it runs.

    python benchmarks/bench_engine.py                        # tiny model, CPU
    python benchmarks/bench_engine.py --preset 0.5b --json bench-gpu.json   # GPU: c=1..32 by default
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

REQUEST_TIMEOUT_S = 300.0   # one streamed request, start to [DONE]
STARTUP_TIMEOUT_S = 600.0   # load + warmup of one server
STOP_TIMEOUT_S = 20.0       # SIGTERM to exit, then SIGKILL
LAG_PERIOD_S = 0.010
LATE_AFTER_TOKENS = 20      # the short request is sent once the long one streamed this many tokens
LATE_LONG_TOKENS = 400      # the long request's max_tokens: still decoding when the short one lands
LATE_SHORT_TOKENS = 8
MAX_POLLS = 100_000         # bound on the /health poller, whatever the round's length
PEER_BACKLOG = 128          # the listen backlog the peer's wrapper sets (ThreadingHTTPServer's default: 5)
PROBE_TIMEOUT_S = 180.0     # the unmodified peer's one round at the top concurrency
CPU_CONCURRENCY = [1, 2, 4, 8]
GPU_CONCURRENCY = [1, 2, 4, 8, 16, 32]
PEAK_GBS = {"H100": 3350.0, "H200": 4800.0}  # peak memory bandwidth by device name (HBM3 SXM, HBM3e), GB/s

# `invariants serve` dispatches to engine.command; calling it directly keeps the benchmark
# independent of the CLI's other subcommands.
SERVE = ("import argparse, sys; from mlx_invariants.commands import serve as command; p = argparse.ArgumentParser(); "
         "command.add_arguments(p); sys.exit(command.run(p.parse_args()))")

# mlx_lm.server serves on http.server's ThreadingHTTPServer, whose listen backlog (request_queue_size)
# is 5: a burst of 32 connects overflows it. The wrapper raises it on the class, then runs the server.
PEER = ("import runpy, http.server; http.server.ThreadingHTTPServer.request_queue_size = "
        f"{PEER_BACKLOG}; runpy.run_module('mlx_lm.server', run_name='__main__', alter_sys=True)")

_WORDS = ("the model streams tokens while the owner thread decodes every request in the batch and the "
          "loop relays each chunk to its client without waiting for the rest of the batch").split()


# -- servers ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Route:
    """One server to measure: how to start it and whether requests must name the model."""

    name: str
    argv: tuple[str, ...]
    names_model: bool


def routes(names: list[str], model: str, max_batch: int, max_concurrency: int) -> list[Route]:
    queue = str(max(16, 2 * max_concurrency))
    peer_args = ("--model", model, "--host", "127.0.0.1", "--log-level", "WARNING")
    ours = (sys.executable, "-c", SERVE, "--model", model, "--host", "127.0.0.1", "--log-level", "warning")
    table = {
        # wait mode with a long bound: the serialized route queues concurrent clients instead of 503ing them
        "simple": Route("simple", ours + ("--engine", "simple", "--admission", "wait", "--max-queue", queue,
                                          "--max-wait-ms", str(int(REQUEST_TIMEOUT_S * 1000))), True),
        "batched": Route("batched", ours + ("--engine", "batched", "--max-batch", str(max_batch)), True),
        "mlx_lm.server": Route("mlx_lm.server", (sys.executable, "-c", PEER) + peer_args, False),
        "mlx_lm.server unmodified": Route("mlx_lm.server unmodified", (sys.executable, "-m", "mlx_lm.server")
                                          + peer_args, False),
    }
    return [table[n] for n in names]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A server subprocess on its own port; `stop()` always ends it (SIGTERM, then SIGKILL)."""

    def __init__(self, route: Route, log_path: str):
        self.route = route
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(list(self.route.argv) + ["--port", str(self.port)], stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    async def wait_ready(self, client: Any) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.route.name} exited with {self.proc.returncode} before it was ready; "
                                   f"see {self.log_path}")
            try:
                if (await client.get(f"{self.url}/health", timeout=2.0)).status_code == 200:
                    return
            except Exception:  # not listening yet
                pass
            await asyncio.sleep(0.2)
        raise RuntimeError(f"{self.route.name} not ready within {STARTUP_TIMEOUT_S:g}s; see {self.log_path}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT_S)


# -- one streamed request ----------------------------------------------------------------------

@dataclass
class Sample:
    """One streamed completion as the client saw it (times in seconds from `sent`)."""

    sent: float
    ttft: Optional[float] = None
    token_times: list[float] = field(default_factory=list)  # arrival of each content chunk
    completion_tokens: int = 0
    done: float = 0.0


def prompt(i: int, words: int) -> str:
    return f"request {i}: " + " ".join(_WORDS[(i + k) % len(_WORDS)] for k in range(words))


class Client:
    """Streams `/v1/completions` from one server and records the timings of each chunk."""

    def __init__(self, http: Any, url: str, model: Optional[str]):
        self.http = http
        self.url = url
        self.model = model

    def body(self, text: str, max_tokens: int) -> dict[str, Any]:
        body = {"prompt": text, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
                "stream_options": {"include_usage": True}}
        if self.model is not None:
            body["model"] = self.model
        return body

    async def complete(self, text: str, max_tokens: int, progress: Optional[asyncio.Event] = None,
                       notify_at: int = 0, sample: Optional[Sample] = None) -> Sample:
        """Stream one completion; sets `progress` once `notify_at` content chunks arrived."""
        sample = sample or Sample(time.perf_counter())
        async with self.http.stream("POST", f"{self.url}/v1/completions", json=self.body(text, max_tokens),
                                    timeout=REQUEST_TIMEOUT_S) as response:
            if response.status_code != 200:
                raise RuntimeError(f"{self.url} answered {response.status_code}: {(await response.aread())[:300]!r}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                self._take(json.loads(line[6:]), sample)
                if progress is not None and len(sample.token_times) >= notify_at:
                    progress.set()
        sample.done = time.perf_counter() - sample.sent
        if not sample.completion_tokens:  # no usage chunk: fall back to counting content chunks
            sample.completion_tokens = len(sample.token_times)
        return sample

    @staticmethod
    def _take(chunk: dict[str, Any], sample: Sample) -> None:
        usage = chunk.get("usage")
        if usage:
            sample.completion_tokens = int(usage["completion_tokens"])
        for choice in chunk.get("choices") or []:
            if choice.get("finish_reason") is None and choice.get("text") is not None:
                now = time.perf_counter() - sample.sent
                if sample.ttft is None:
                    sample.ttft = now
                sample.token_times.append(now)


# -- measurements --------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))]


@dataclass
class Repeat:
    """One repeat of a round, as measured."""

    tokens: int
    wall: float
    ttfts_ms: list[float]
    health_ms: list[float]


@dataclass
class Round:
    concurrency: int
    tok_s: float
    ttft_p50_ms: float
    ttft_p90_ms: float
    completion_tokens: int
    wall_s: float
    health_p99_ms: Optional[float] = None
    health_polls: int = 0


async def poll_health(http: Any, url: str, stop: asyncio.Event) -> list[float]:
    """Latency of `GET /health` every 10 ms until `stop`: what a request pays before its handler runs."""
    latencies: list[float] = []
    for _ in range(MAX_POLLS):
        if stop.is_set():
            break
        started = time.perf_counter()
        await http.get(f"{url}/health", timeout=30.0)
        latencies.append(time.perf_counter() - started)
        await asyncio.sleep(max(0.0, LAG_PERIOD_S - (time.perf_counter() - started)))
    return latencies


async def measure_round(client: Client, concurrency: int, per_worker: int, max_tokens: int,
                        prompt_words: int, lag: bool, first: int) -> Repeat:
    """`concurrency` workers each send `per_worker` requests back to back; tok/s over the whole round.

    Prompts are numbered from `first`, and callers never reuse a number: a server with a prompt
    cache (mlx_lm.server has one) would otherwise skip the prefill of a repeated prompt, and the
    round would measure that cache instead of the engine.
    """
    async def worker(w: int) -> list[Sample]:
        return [await client.complete(prompt(first + w * per_worker + k, prompt_words), max_tokens)
                for k in range(per_worker)]

    stop = asyncio.Event()
    poller = asyncio.ensure_future(poll_health(client.http, client.url, stop)) if lag else None
    started = time.perf_counter()
    try:
        results = await asyncio.gather(*(worker(w) for w in range(concurrency)))
    finally:
        wall = time.perf_counter() - started
        stop.set()
        latencies = await poller if poller is not None else []
    samples = [s for per in results for s in per]
    return Repeat(sum(s.completion_tokens for s in samples), wall,
                  [s.ttft * 1000 for s in samples if s.ttft is not None], [x * 1000 for x in latencies])


class EndedEarly(Exception):
    """The long request emitted EOS before the short one was due; the caller tries another prompt."""


@dataclass
class Late:
    """One late-arrival trial; `steps` is the TTFT over the long stream's steady inter-token time."""

    ttft_ms: float
    step_ms: float
    steps: float
    long_tokens_waited: int  # tokens the long stream got between the short's send and its first token
    idle_ttft_ms: float      # a short request of the same length on the idle server: its own prefill and relay cost

    @property
    def excess_steps(self) -> float:
        """What waiting behind the long request added to the TTFT, in decode steps."""
        return (self.ttft_ms - self.idle_ttft_ms) / self.step_ms


async def measure_late(client: Client, i: int, prompt_words: int) -> Late:
    """TTFT of a short request sent while a long one decodes, in ms and in the long one's decode steps."""
    progress = asyncio.Event()
    long_sample = Sample(time.perf_counter())
    long = asyncio.ensure_future(client.complete(prompt(10_000 + i, prompt_words), LATE_LONG_TOKENS, progress,
                                                 LATE_AFTER_TOKENS, long_sample))
    try:
        waiter = asyncio.ensure_future(progress.wait())
        await asyncio.wait({waiter, long}, timeout=REQUEST_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if not progress.is_set():
            long.result()  # raises if the long request failed
            raise EndedEarly(f"the long request ended after {len(long_sample.token_times)} tokens")
        times = list(long_sample.token_times[:LATE_AFTER_TOKENS])
        sent_at = time.perf_counter() - long_sample.sent
        short = await client.complete(prompt(20_000 + i, prompt_words), LATE_SHORT_TOKENS)
    finally:
        long.cancel()  # closing the stream disconnects the client: the server aborts the long request
        await asyncio.gather(long, return_exceptions=True)
    waited = sum(1 for t in long_sample.token_times if sent_at < t <= sent_at + short.ttft)
    await asyncio.sleep(0.2)  # let the server apply the abort before the idle control request
    idle = await client.complete(prompt(30_000 + i, prompt_words), LATE_SHORT_TOKENS)  # same length, not cached
    step = statistics.median(b - a for a, b in zip(times[4:], times[5:]))
    return Late(short.ttft * 1000, step * 1000, short.ttft / step, waited, idle.ttft * 1000)


async def measure_lates(client: Client, wanted: int, prompt_words: int) -> list[Late]:
    """`wanted` late-arrival trials; prompts whose greedy decode hits EOS early are skipped (bounded)."""
    lates: list[Late] = []
    for i in range(4 * wanted):
        if len(lates) == wanted:
            return lates
        try:
            lates.append(await measure_late(client, i, prompt_words))
        except EndedEarly:
            continue
    if not lates:
        raise RuntimeError(f"every long request ended before {LATE_AFTER_TOKENS} tokens; late arrival not measured")
    return lates


@dataclass
class RouteResult:
    name: str
    rounds: list[Round]
    late: Late
    late_all_ms: list[float]

    def at(self, concurrency: int) -> Optional[Round]:
        return next((r for r in self.rounds if r.concurrency == concurrency), None)


def pooled(concurrency: int, repeats: list[Repeat]) -> Round:
    """Every repeat of a round together: tokens over summed wall time, percentiles over every request.

    Repeat k sends the same numbered prompts to every server, so pooled rounds compare the same
    work. With random weights some prompts decode to EOS after a token or two; a median repeat
    picked by tok/s compared different work (one server's repeat of 65 tokens against another's 128).
    """
    tokens, wall = sum(r.tokens for r in repeats), sum(r.wall for r in repeats)
    ttfts = [t for r in repeats for t in r.ttfts_ms]
    health = [h for r in repeats for h in r.health_ms]
    return Round(concurrency, tokens / wall, percentile(ttfts, 0.5), percentile(ttfts, 0.9), tokens, wall,
                 percentile(health, 0.99) if health else None, len(health))


async def measure_all(chosen: list[Route], args: argparse.Namespace) -> dict[str, RouteResult]:
    """Every server up at once, measured one at a time, interleaved: repeat k of a round runs on each
    server in turn (the order rotating with k) before repeat k + 1 starts.

    A GPU's clocks and its neighbours drift over minutes; measured server after server, one
    server's rounds met a different machine than the next's (the peer's c=4 tok/s moved by half
    between two runs of the same code). Interleaved, the drift lands on every server alike.
    """
    import httpx

    servers = [ServerProcess(r, os.path.join(args.log_dir, f"bench-{r.name}.log")) for r in chosen]
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(limits=limits, timeout=REQUEST_TIMEOUT_S) as http:
        try:
            for server in servers:
                server.start()
            clients = {}
            for server in servers:
                await server.wait_ready(http)
                route = server.route
                model = (await http.get(f"{server.url}/v1/models")).json()["data"][0]["id"] if route.names_model else None
                clients[route.name] = Client(http, server.url, model)
            names = list(clients)
            top = max(args.concurrency)
            issued = 0

            async def each(c: int, per_worker: int, max_tokens: int, turn: int, lag: bool) -> dict[str, Repeat]:
                """One repeat on every server measured at `c`, the same numbered prompts on each."""
                nonlocal issued
                first, issued = issued, issued + c * per_worker
                here = [n for n in names if measured_at(n, c, args.serial_max)]
                order = here[turn % len(here):] + here[:turn % len(here)]
                return {name: await measure_round(clients[name], c, per_worker, max_tokens, args.prompt_words,
                                                  lag, first) for name in order}

            for c in args.concurrency:  # warm up: first-call and batch-shape compilation are not measured
                await each(c, 1, min(8, args.max_tokens), 0, lag=False)
            rounds: dict[str, list[Round]] = {name: [] for name in names}
            for c in args.concurrency:
                repeats = [await each(c, args.per_worker, args.max_tokens, k, lag=c == top) for k in range(args.repeats)]
                for name in repeats[0]:
                    rounds[name].append(pooled(c, [r[name] for r in repeats]))
                print("  c=" + str(c) + ": " + ", ".join(f"{name} {rounds[name][-1].tok_s:.1f} tok/s"
                                                         for name in repeats[0]), file=sys.stderr, flush=True)
            results = {}
            for name in names:
                lates = await measure_lates(clients[name], max(3, args.repeats), args.prompt_words)
                late = sorted(lates, key=lambda x: x.steps)[(len(lates) - 1) // 2]
                results[name] = RouteResult(name, rounds[name], late, [x.ttft_ms for x in lates])
            return results
        finally:
            for server in servers:
                server.stop()


def measured_at(name: str, concurrency: int, serial_max: int) -> bool:
    """The serialized route is skipped above `--serial-max` (0: never): one request at a time, its tok/s
    is flat in c, and at c=32 one round of it outlasts every other server's together."""
    return name != "simple" or not serial_max or concurrency <= serial_max


async def probe_unmodified(args: argparse.Namespace) -> dict[str, Any]:
    """The peer as shipped (listen backlog 5), once at the top concurrency: whether the round completed."""
    import httpx

    route = routes(["mlx_lm.server unmodified"], args.model, 0, 0)[0]
    server = ServerProcess(route, os.path.join(args.log_dir, "bench-mlx_lm.server-unmodified.log"))
    top = max(args.concurrency)
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(limits=limits, timeout=REQUEST_TIMEOUT_S) as http:
        try:
            server.start()
            await server.wait_ready(http)
            repeat = await asyncio.wait_for(measure_round(Client(http, server.url, None), top, 1, 16,
                                                          args.prompt_words, False, 90_000), PROBE_TIMEOUT_S)
            return {"concurrency": top, "completed": True, "tokens": repeat.tokens, "wall_s": repeat.wall}
        except Exception as exc:  # the failure is the finding
            return {"concurrency": top, "completed": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
        finally:
            server.stop()


# -- the memory-bandwidth limit ----------------------------------------------------------------------

def parameter_bytes(model_dir: str) -> int:
    """Bytes of every tensor in the model folder's safetensors files, read from their headers."""
    total = 0
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with open(path, "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        total += sum(t["data_offsets"][1] - t["data_offsets"][0] for k, t in header.items() if k != "__metadata__")
    return total


def device_name() -> str:
    try:
        import mlx.core as mx
        return str(mx.device_info().get("device_name", ""))
    except Exception:  # a label only
        return ""


def bandwidth_gbs(given: Optional[float]) -> Optional[float]:
    name = device_name()
    return given or next((gbs for key, gbs in PEAK_GBS.items() if key in name), None)


def bandwidth_share(name: str, rnd: Round, floor_s: Optional[float], max_batch: int) -> Optional[float]:
    """tok/s over what a batch of this round's size could reach if every step only read the weights."""
    if not floor_s:
        return None
    batch = 1 if name == "simple" else min(rnd.concurrency, max_batch)
    return rnd.tok_s * floor_s / batch


def on_gpu() -> bool:
    try:
        import mlx.core as mx
        return mx.default_device() == mx.gpu
    except Exception:  # no MLX here: the CPU defaults
        return False


# -- targets and the table -------------------------------------------------------------------------

@dataclass
class Target:
    name: str
    measured: str
    passed: Optional[bool]  # None: not measured in this run

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "FAIL", None: "n/a"}[self.passed]


STEP_TARGET_MS = {"0.5b": 2.8}  # batched decode step at c=1, by preset: 10 % of the 0.5b's bandwidth floor on an H100


def targets(results: dict[str, RouteResult], concurrency: list[int], meta: dict[str, Any]) -> list[Target]:
    out = []
    simple, batched, peer = results.get("simple"), results.get("batched"), results.get("mlx_lm.server")
    if simple and batched:
        low = [c for c in (1, 2) if simple.at(c) and batched.at(c)]
        if low:
            ratios = {c: batched.at(c).tok_s / simple.at(c).tok_s for c in low}
            out.append(Target("no batching penalty: batched >= 0.95x serialized tok/s at c=1 and c=2",
                              ", ".join(f"c={c}: {r:.2f}x" for c, r in ratios.items()),
                              all(r >= 0.95 for r in ratios.values())))
        if simple.at(8) and batched.at(8):
            ratio = batched.at(8).tok_s / simple.at(8).tok_s
            out.append(Target("batched >= 2.4x serialized tok/s at c=8", f"{ratio:.2f}x", ratio >= 2.4))
    if batched and peer:
        ratios = {c: batched.at(c).tok_s / peer.at(c).tok_s for c in concurrency}
        shown = ", ".join(f"c={c}: {r:.2f}x" for c, r in ratios.items())
        out.append(Target("batched >= 1.3x mlx_lm.server tok/s at every concurrency", shown,
                          all(r >= 1.3 for r in ratios.values())))
    if batched:
        late = batched.late
        limit = STEP_TARGET_MS.get(meta.get("preset") or "")
        if limit and meta.get("on_gpu"):
            floor = meta.get("bandwidth_floor_ms")
            share = f", {floor / late.step_ms:.1%} of the bandwidth limit" if floor else ""
            out.append(Target(f"batched decode step at c=1 <= {limit} ms", f"{late.step_ms:.2f} ms{share}",
                              late.step_ms <= limit))
        out.append(Target("batched late-arrival TTFT <= 2 decode steps",
                          f"{late.steps:.1f} steps ({late.ttft_ms:.1f} ms, step {late.step_ms:.1f} ms)",
                          late.steps <= 2.0))
        out.append(Target("(diagnostic) batched late-arrival TTFT minus the same request's idle TTFT <= 2 steps",
                          f"{late.excess_steps:.1f} steps", late.excess_steps <= 2.0))
    return out


def render(results: dict[str, RouteResult], checks: list[Target], meta: dict[str, Any]) -> str:
    floor_ms = meta.get("bandwidth_floor_ms")
    floor = (f"{meta['parameter_bytes'] / 1e6:.1f} MB of parameters at {meta['bandwidth_gbs']:g} GB/s: "
             f"a step cannot take less than {floor_ms:.3f} ms") if floor_ms else (
             f"{meta['parameter_bytes'] / 1e6:.1f} MB of parameters; peak bandwidth unknown (--bandwidth-gbs)")
    lines = [f"model: {meta['model']} ({meta['preset'] or 'custom'}), max_tokens {meta['max_tokens']}, "
             f"{meta['per_worker']} request(s) per client per round, {meta['repeats']} repeat(s) pooled",
             f"machine: {meta['machine']}", f"bandwidth limit: {floor}",
             f"peer: {meta['peer_launch']}", "",
             "| server | c | tok/s | share of bandwidth limit | TTFT p50 ms | TTFT p90 ms | tokens | wall s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for res in results.values():
        for r in res.rounds:
            share = bandwidth_share(res.name, r, floor_ms / 1000 if floor_ms else None, meta["max_batch"])
            lines.append(f"| {res.name} | {r.concurrency} | {r.tok_s:.1f} | "
                         f"{'-' if share is None else f'{share:.1%}'} | {r.ttft_p50_ms:.1f} | "
                         f"{r.ttft_p90_ms:.1f} | {r.completion_tokens} | {r.wall_s:.2f} |")
    top = max(meta["concurrency"])
    lines += ["", f"| server | decode step ms | late-arrival TTFT ms | in decode steps | long-stream tokens "
                  f"while waiting | same request idle TTFT ms | excess over idle, steps | "
                  f"/health p99 ms during c={top} (loop-lag proxy) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for res in results.values():
        r, late = res.at(max(x.concurrency for x in res.rounds)), res.late
        lines.append(f"| {res.name} | {late.step_ms:.1f} | {late.ttft_ms:.1f} | {late.steps:.1f} | "
                     f"{late.long_tokens_waited} | {late.idle_ttft_ms:.1f} | {late.excess_steps:.1f} | "
                     f"{_health(r)} |")
    probe = meta.get("peer_unmodified")
    if probe:
        lines += ["", f"unmodified mlx_lm.server (listen backlog 5) at c={probe['concurrency']}: "
                      + ("completed" if probe["completed"] else f"FAILED: {probe['error']}")]
    lines += ["", "| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {t.name} | {t.measured} | {t.verdict} |" for t in checks]
    return "\n".join(lines)


def _health(r: Optional[Round]) -> str:
    if r is None or r.health_p99_ms is None:
        return "-"
    return f"{r.health_p99_ms:.1f} ({r.health_polls} polls)"


def machine() -> str:
    try:
        import mlx.core as mx
        device = str(mx.default_device())
        if "gpu" in device and hasattr(mx, "cuda") and mx.cuda.is_available():
            device += " (CUDA)"
        version = mx.__version__
    except Exception as exc:  # report, never fail the run over a label
        device, version = f"unknown ({exc})", "?"
    return (f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU(s), "
            f"Python {platform.python_version()}, MLX {version} default device {device}")


# -- command line -----------------------------------------------------------------------------------

def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny", help="embedded model preset: tiny (CPU) or 0.5b (GPU)")
    p.add_argument("--model", metavar="PATH", help="a local mlx-lm folder (overrides --preset)")
    p.add_argument("--max-tokens", type=int, default=64, help="completion tokens asked per request (default 64)")
    p.add_argument("--concurrency", default="auto",
                   help="comma-separated client counts (default: 1,2,4,8,16,32 where MLX runs on a GPU, else 1,2,4,8)")
    p.add_argument("--serial-max", type=int, default=0, metavar="C",
                   help="measure the serialized route only up to this concurrency (default 0: at every one)")
    p.add_argument("--bandwidth-gbs", type=float,
                   help="the device's peak memory bandwidth, GB/s (default: known for H100 and H200)")
    p.add_argument("--no-peer-probe", action="store_true",
                   help="skip probing the unmodified mlx_lm.server (listen backlog 5) at the top concurrency")
    p.add_argument("--repeats", type=int, default=1, help="rounds per concurrency, pooled: tokens over summed wall time (default 1)")
    p.add_argument("--per-worker", type=int, default=2, help="requests each client sends per round (default 2)")
    p.add_argument("--prompt-words", type=int, default=24, help="words per prompt (default 24)")
    p.add_argument("--routes", default="simple,batched", help="reference routes to measure (default simple,batched)")
    p.add_argument("--no-peer", action="store_true", help="skip python -m mlx_lm.server")
    p.add_argument("--max-batch", type=int, default=0, help="batched --max-batch (default: max(8, top concurrency))")
    p.add_argument("--json", metavar="OUT", help="also write machine-readable results here")
    p.add_argument("--log-dir", default=tempfile.gettempdir(), help="where each server's output goes (default: the temp dir)")
    args = p.parse_args(argv)
    try:
        args.concurrency = (None if args.concurrency == "auto"
                            else sorted({int(c) for c in args.concurrency.split(",")}))
    except ValueError:
        p.error("--concurrency takes integers separated by commas, e.g. 1,2,4,8")
    args.routes = [r.strip() for r in args.routes.split(",") if r.strip()]
    if not set(args.routes) <= {"simple", "batched"}:
        p.error("--routes takes simple and/or batched")
    if (args.concurrency is not None and min(args.concurrency) < 1) or args.serial_max < 0 \
            or (args.bandwidth_gbs is not None and args.bandwidth_gbs <= 0) or args.max_tokens < 1 or args.repeats < 1 or args.per_worker < 1:
        p.error("--concurrency, --max-tokens, --repeats, --per-worker and --bandwidth-gbs must be positive, "
                "--serial-max at least 0")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if args.model is None:
        from mlx_invariants.engine.model import tiny_model_path
        args.model = str(tiny_model_path(args.preset))
    else:
        args.preset = None
    gpu = on_gpu()
    if args.concurrency is None:
        args.concurrency = GPU_CONCURRENCY if gpu else CPU_CONCURRENCY
    names = args.routes + ([] if args.no_peer else ["mlx_lm.server"])
    max_batch = args.max_batch or max(8, max(args.concurrency))
    gbs = bandwidth_gbs(args.bandwidth_gbs)
    nbytes = parameter_bytes(args.model)
    meta = {"model": args.model, "preset": args.preset, "max_tokens": args.max_tokens, "repeats": args.repeats,
            "repeats_are": "pooled", "servers_are": "interleaved",
            "per_worker": args.per_worker, "concurrency": args.concurrency, "max_batch": max_batch,
            "serial_max": args.serial_max, "machine": machine(), "on_gpu": gpu, "device_name": device_name(),
            "parameter_bytes": nbytes, "bandwidth_gbs": gbs,
            "bandwidth_floor_ms": nbytes / (gbs * 1e9) * 1000 if gbs else None,
            "peer_launch": f"python -c <wrapper>: ThreadingHTTPServer.request_queue_size = {PEER_BACKLOG}, "
                           "then runpy of mlx_lm.server (its default listen backlog is 5)"}
    results = asyncio.run(measure_all(routes(names, args.model, max_batch, max(args.concurrency)), args))
    if not args.no_peer and not args.no_peer_probe:
        meta["peer_unmodified"] = asyncio.run(probe_unmodified(args))
    checks = targets(results, args.concurrency, meta)
    print(render(results, checks, meta))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"meta": meta, "results": {k: asdict(v) | {"late_excess_steps": v.late.excess_steps}
                                                 for k, v in results.items()},
                       "targets": [asdict(t) | {"verdict": t.verdict} for t in checks]}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
