"""Engine exceptions.

    EngineError
    ├── Busy            admission refused: HTTP 503 + Retry-After, code text_generation_busy / engine_overloaded
    ├── ShuttingDown    no new work while draining: HTTP 503, code engine_shutting_down
    ├── Unavailable     the owner thread died, or is stuck with work pending: HTTP 503, code engine_dead / engine_stalled
    ├── StartupError    load, generator construction or warmup failed on the owner thread
    └── InvalidRequest  the request cannot run on this model (e.g. prompt longer than the context): HTTP 400
"""

from __future__ import annotations


class EngineError(Exception):
    code = "engine_error"


class Busy(EngineError):
    """Raised before any byte is sent; the client should retry after `retry_after` seconds."""

    def __init__(self, message: str, code: str = "text_generation_busy", retry_after: float = 1.0):
        super().__init__(message)
        self.code = code
        self.retry_after = retry_after


class ShuttingDown(EngineError):
    code = "engine_shutting_down"


class Unavailable(EngineError):
    """The engine can no longer generate: its owner thread died (`engine_dead`) or has made no progress
    for `stall_timeout_s` while requests wait (`engine_stalled`). Refused at once, never queued."""

    DEAD = "engine_dead"
    STALLED = "engine_stalled"

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


class StartupError(EngineError):
    code = "engine_startup_failed"


class InvalidRequest(EngineError):
    def __init__(self, message: str, code: str = "invalid_request", param: str | None = None):
        super().__init__(message)
        self.code = code
        self.param = param
