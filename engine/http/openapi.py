"""The OpenAPI 3.1 document of the routes, built from the very schemas the server validates with."""

from __future__ import annotations

from typing import Any

from mlx_invariants.engine.http import schemas

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"}, "code": {"type": "string"},
                       "param": {"type": ["string", "null"]}},
    }},
}
_ERRORS = {
    "400": "invalid request: bad JSON or UTF-8, wrong type or value, prompt beyond the context window",
    "404": "unknown model or route",
    "405": "wrong method",
    "408": "the body did not arrive in time",
    "409": "a request with this X-Request-Id is still running",
    "413": "body larger than the limit",
    "415": "body is not JSON",
    "500": "the engine failed the request (non-stream; a stream ends with an error event and [DONE])",
    "503": "busy (code text_generation_busy or the engine's; Retry-After set) or shutting down",
}


def _error_responses(codes: list[str]) -> dict[str, Any]:
    return {code: {"description": _ERRORS[code],
                   "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
            for code in codes}


def _generation(summary: str, schema: str) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True,
                        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}},
        "responses": {
            "200": {"description": "the completion (JSON), or with stream=true SSE chunks ending in `data: [DONE]`",
                    "content": {"application/json": {"schema": {"type": "object"}},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            **_error_responses(["400", "404", "405", "408", "409", "413", "415", "500", "503"]),
        },
    }}


def _get(summary: str, codes: list[str]) -> dict[str, Any]:
    return {"get": {"summary": summary,
                    "responses": {"200": {"description": "ok",
                                          "content": {"application/json": {"schema": {"type": "object"}}}},
                                  **_error_responses(codes)}}}


def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "mlx-invariants reference engine", "version": "1"},
        "paths": {
            "/v1/chat/completions": _generation("chat completion", "ChatRequest"),
            "/v1/completions": _generation("text completion", "CompletionRequest"),
            "/v1/models": _get("the one model served", []),
            "/health": _get("200 only while the engine's owner thread is alive and ready", ["503"]),
            "/v1/status": _get("admission telemetry, server counters and event-loop lag", []),
        },
        "components": {"schemas": {"ChatRequest": schemas.CHAT_SCHEMA,
                                   "CompletionRequest": schemas.COMPLETION_SCHEMA,
                                   "Error": _ERROR}},
    }
