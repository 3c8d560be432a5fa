"""The benchmark's pairs: a correct engine and its twin, one real mistake apart. One declaration each;
the README table, the benchmark and the tests read it from here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Pair:
    name: str          # the correct engine's module; the twin's is `<name>_twin`
    kind: str          # "engine": an adapter factory `make`; "server": `python -m MODULE --port {port}`
    style: str
    mistake: str       # the twin's one difference
    expected: str      # the oracle(s) that should catch the twin
    needs: Optional[str] = None  # a module the pair imports that is not a project dependency (its pin)

    @property
    def module(self) -> str:
        return f"false_alarms.{self.name}"

    @property
    def twin_module(self) -> str:
        return f"false_alarms.{self.name}_twin"

    def path(self, twin: bool = False) -> Path:
        return HERE / f"{self.name}{'_twin' if twin else ''}.py"


PAIRS: tuple[Pair, ...] = (
    Pair("asyncio_raw", "server", "asyncio.start_server raw HTTP/1.1, self-cancelling handler, one generation thread",
         "the slot is released on cancel before the worker thread has returned", "lock-released-early"),
    Pair("starlette_sse", "server", "Starlette + uvicorn SSE, queue-fed owner thread",
         "a closed stream never stops its job: generation continues for a disconnected client",
         "compute-after-disconnect"),
    Pair("fastapi_stream", "server", "FastAPI streaming, one-thread executor, a job per token under a lock",
         "each token is decoded on the event loop instead of the MLX thread",
         "mlx-off-loader / mlx-finalized-off-thread", needs="fastapi==0.165.0"),
    Pair("aiohttp_server", "server", "aiohttp, one-thread executor, semaphore slot",
         "the slot is taken before the body is read, so a cut body never releases it", "cut-body-blocks",
         needs="aiohttp==3.14.5"),
    Pair("threading_server", "server", "http.server.ThreadingHTTPServer + one queue-fed generation thread (mlx_lm.server)",
         "a non-streaming request is decoded to the end after its client has gone", "compute-after-disconnect"),
    Pair("to_thread_drain", "engine", "in-process: asyncio.to_thread under a lock drained on cancel",
         "after the drain the CancelledError is swallowed instead of re-raised", "cancel-swallowed"),
    Pair("pool_owner", "engine", "in-process: single-thread ThreadPoolExecutor as the MLX owner",
         "the cleanup helper re-acquires the asyncio.Lock its caller holds", "lock-reentered"),
    Pair("queue_owner", "engine", "in-process: queue-fed owner thread, results via call_soon_threadsafe",
         "shutdown ends the owner without failing queued jobs: their waiters stay blocked", "shutdown-left-waiter"),
    Pair("batched_owner", "engine", "in-process: batched owner thread with an abort set applied each iteration",
         "aborts and new requests are taken in two critical sections: an abort for a waiting request is lost",
         "abort-completed / abort-ignored"),
)

BY_NAME = {pair.name: pair for pair in PAIRS}
