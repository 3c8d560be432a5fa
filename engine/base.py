"""What every reference engine offers the HTTP layer and the fuzzer, and how it is configured."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from mlx_invariants.engine.errors import Unavailable
from mlx_invariants.engine.messages import Pending
from mlx_invariants.engine.stream import RequestStream

AdmissionMode = Literal["fail-fast", "wait"]


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None            # a local mlx-lm folder; None = the embedded tiny model
    admission: AdmissionMode = "fail-fast"
    max_queue: int = 4                  # wait mode: requests allowed to wait for the serialized slot
    max_wait_ms: int = 250              # wait mode: longest wait before the same 503
    max_batch: int = 8                  # batched: sequences decoded together
    max_batch_queue: int = 16           # batched: admitted requests waiting for a seat
    retry_after_s: float = 1.0          # Retry-After sent with every busy answer
    startup_timeout_s: float = 600.0    # load + construct + warmup on the owner thread
    stall_timeout_s: float = 120.0      # no owner progress this long with work pending: unhealthy, in-flight fail
    warmup: bool = True
    pad_prefill: bool | None = None     # batched: prefill at power-of-two lengths; None = where MLX runs on CUDA


class Engine(Protocol):
    """The surface the HTTP layer, the tests and the fuzz adapters use.

    All methods run on the event loop thread. `submit` raises `Busy`,
    `ShuttingDown` or `InvalidRequest` before any byte is sent; every returned
    stream must be closed with `await stream.aclose()` in a `finally`.
    """

    name: str
    config: EngineConfig

    async def start(self) -> None: ...              # raises StartupError; ready only if load, build and warmup worked
    async def submit(self, pending: Pending) -> RequestStream: ...
    async def shutdown(self, grace_s: float = 5.0) -> None: ...
    @property
    def healthy(self) -> bool: ...                  # owner thread alive, ready, making progress, not shutting down
    @property
    def unavailable(self) -> Unavailable | None: ...  # why the owner can no longer generate (dead, stalled)
    @property
    def tokenizer(self) -> Any: ...                 # mlx-lm TokenizerWrapper; pure Python, safe on the loop
    @property
    def model_id(self) -> str: ...
    @property
    def context_length(self) -> int: ...
    def status(self) -> dict[str, Any]: ...         # admission telemetry for /v1/status
