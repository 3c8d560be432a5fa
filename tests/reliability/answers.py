"""What a documented answer looks like, judged against the server's own OpenAPI document."""

from __future__ import annotations

import collections
import json
from typing import Any, Optional

import httpx

BUSY_CODES = {"text_generation_busy", "engine_overloaded", "engine_shutting_down"}


class Tally:
    """Counts answers by (status, code) so each suite can print what it saw."""

    def __init__(self) -> None:
        self.counts: collections.Counter[tuple[int, str]] = collections.Counter()

    def add(self, status: int, code: str) -> None:
        self.counts[(status, code)] += 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def server_errors(self) -> int:
        return sum(n for (status, code), n in self.counts.items() if status >= 500)

    def line(self) -> str:
        parts = [f"{n}x {status} {code}".rstrip() for (status, code), n in sorted(self.counts.items())]
        return f"{self.total} answers: " + ", ".join(parts)

    def figures(self) -> dict[str, Any]:
        return {"answers": self.total, "5xx": self.server_errors(),
                "by_status": dict(sorted(collections.Counter(s for s, _ in self.counts.elements()).items()))}


def operation(document: dict[str, Any], path: str, method: str = "post") -> Optional[dict[str, Any]]:
    return document["paths"].get(path, {}).get(method)


def error_of(response: httpx.Response) -> dict[str, Any]:
    """The OpenAI-style error object, asserting its shape: message, type and code are strings."""
    assert response.headers.get("content-type", "").startswith("application/json"), \
        f"{response.status_code} answered with {response.headers.get('content-type')!r}: {response.text[:200]!r}"
    body = response.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), f"not an error body: {body!r}"
    error = body["error"]
    for key in ("message", "type", "code"):
        assert isinstance(error.get(key), str) and error[key], f"error.{key} missing or empty in {body!r}"
    return error


def check_generation(response: httpx.Response, stream: bool) -> None:
    """A 200 from a generation route: a whole completion, or an SSE stream ending in `[DONE]`."""
    if not stream:
        body = response.json()
        assert body["choices"][0]["finish_reason"] in ("stop", "length"), body
        assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
        return
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", f"stream did not end with [DONE]: {response.text[-200:]!r}"
    reasons = [c["finish_reason"] for e in events[:-1] for c in json.loads(e).get("choices", [])]
    assert reasons and reasons[-1] in ("stop", "length"), f"no finish chunk before [DONE]: {reasons[-3:]}"


def judge(response: httpx.Response, document: dict[str, Any], path: str, method: str = "post",
          stream: bool = False) -> tuple[int, str]:
    """Assert the answer is documented for this route and well-formed; returns (status, error code or "")."""
    status = response.status_code
    op = operation(document, path, method.lower())
    documented = set((op or {}).get("responses", {})) | {"404", "405"}
    assert str(status) in documented, f"{method.upper()} {path} answered undocumented {status}: {response.text[:300]!r}"
    assert status < 500 or status == 503, f"{method.upper()} {path} answered {status}: {response.text[:300]!r}"
    if status >= 400:
        code = error_of(response)["code"]
        if status == 503:
            assert code in BUSY_CODES, f"503 with unexpected code {code!r}"
            assert response.headers.get("retry-after"), "a 503 without Retry-After"
        return status, code
    if path.endswith("completions") and status == 200:
        check_generation(response, stream)
    return status, ""
