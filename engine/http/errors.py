"""HTTP errors as OpenAI-style JSON: `{"error": {"message", "type", "code", "param"}}`.

    ApiError                 one refusal: status, stable snake_case code, optional Retry-After
    from_engine_error()      Busy -> 503 server_busy, ShuttingDown and Unavailable -> 503, InvalidRequest -> 400

Every refusal is decided before the first response byte, so a client always
sees a status line that matches the body.
"""

from __future__ import annotations

import math
from typing import Any

from mlx_invariants.engine.errors import Busy, EngineError, InvalidRequest, ShuttingDown, Unavailable

# status -> OpenAI error "type"; a Busy answer overrides it with "server_busy".
TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    500: "server_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    """A request we refuse, with everything its JSON body and headers need."""

    def __init__(self, status: int, message: str, code: str, *, param: str | None = None,
                 type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type or TYPES.get(status, "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.code, self.param)


def error_body(message: str, type: str, code: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "code": code, "param": param}}


def from_engine_error(exc: EngineError) -> ApiError:
    """Map an exception `engine.submit` raised (before anything was sent) to its HTTP answer."""
    if isinstance(exc, Busy):
        retry = str(max(1, math.ceil(exc.retry_after)))  # Retry-After takes whole seconds
        return ApiError(503, str(exc), exc.code, type="server_busy", headers={"Retry-After": retry})
    if isinstance(exc, Unavailable):  # engine_dead / engine_stalled: this server will not serve it soon
        return ApiError(503, f"{exc}; retry on another server", exc.code)
    if isinstance(exc, ShuttingDown):
        return ApiError(503, f"{exc}; retry on another server", exc.code, headers={"Retry-After": "1"})
    if isinstance(exc, InvalidRequest):
        return ApiError(400, str(exc), exc.code, param=exc.param)
    return ApiError(500, f"the engine refused the request: {exc}", exc.code)
