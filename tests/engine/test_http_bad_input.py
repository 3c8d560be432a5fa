"""Malformed requests get OpenAI-style 4xx JSON on a real socket, never a 5xx, and the server goes on serving."""

from __future__ import annotations

import json

import httpx
import pytest

MODEL = "{model}"  # replaced by the served model id


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}


def completion(**fields) -> dict:
    return {"model": MODEL, "prompt": "hi", "max_tokens": 4, **fields}


CHAT, TEXT = "/v1/chat/completions", "/v1/completions"
JSON = {"content-type": "application/json"}

# id -> (method, path, headers, body: dict | bytes, status, code)
CASES = {
    "not-json": ("POST", CHAT, JSON, b"{not json", 400, "invalid_json"),
    "empty-body": ("POST", CHAT, JSON, b"", 400, "invalid_json"),
    "json-array": ("POST", CHAT, JSON, b"[1, 2]", 400, "invalid_type"),
    "nan": ("POST", CHAT, JSON, b'{"model": "x", "messages": [], "temperature": NaN}', 400, "invalid_json"),
    "huge-integer": ("POST", CHAT, JSON, b'{"max_tokens": 1' + b"0" * 5000 + b"}", 400, "invalid_json"),
    "deeply-nested": ("POST", CHAT, JSON, b"[" * 100_000 + b"]" * 100_000, 400, "invalid_json"),
    "invalid-utf8": ("POST", CHAT, JSON, b'{"model": "\xff\xfe", "messages": []}', 400, "invalid_utf8"),
    "lone-surrogate": ("POST", CHAT, JSON, json.dumps(chat(messages=[{"role": "user", "content": "\ud800"}])).encode(),
                       400, "invalid_value"),
    "form-content-type": ("POST", CHAT, {"content-type": "application/x-www-form-urlencoded"}, b"a=b", 415,
                          "unsupported_media_type"),
    "latin1-charset": ("POST", CHAT, {"content-type": "application/json; charset=latin-1"}, chat(), 415,
                       "unsupported_media_type"),
    "oversize-body": ("POST", CHAT, JSON, b" " * (4 * 1024 * 1024 + 1), 413, "request_too_large"),
    "missing-model": ("POST", CHAT, JSON, {"messages": [{"role": "user", "content": "hi"}]}, 400,
                      "missing_required_parameter"),
    "unknown-model": ("POST", CHAT, JSON, chat(model="gpt-4"), 404, "model_not_found"),
    "empty-messages": ("POST", CHAT, JSON, chat(messages=[]), 400, "invalid_value"),
    "message-not-object": ("POST", CHAT, JSON, chat(messages=["hi"]), 400, "invalid_type"),
    "bad-role": ("POST", CHAT, JSON, chat(messages=[{"role": "wizard", "content": "hi"}]), 400, "invalid_value"),
    "image-part": ("POST", CHAT, JSON, chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
                   400, "invalid_value"),
    "max-tokens-string": ("POST", CHAT, JSON, chat(max_tokens="4"), 400, "invalid_type"),
    "max-tokens-float": ("POST", CHAT, JSON, chat(max_tokens=4.5), 400, "invalid_type"),
    "max-tokens-bool": ("POST", CHAT, JSON, chat(max_tokens=True), 400, "invalid_type"),
    "max-tokens-negative": ("POST", CHAT, JSON, chat(max_tokens=-1), 400, "invalid_value"),
    "max-tokens-zero": ("POST", CHAT, JSON, chat(max_tokens=0), 400, "invalid_value"),
    "max-tokens-absurd": ("POST", CHAT, JSON, chat(max_tokens=10**12), 400, "invalid_value"),
    "max-tokens-beyond-context": ("POST", CHAT, JSON, chat(max_tokens=5000), 400, "context_length_exceeded"),
    "prompt-beyond-context": ("POST", TEXT, JSON, completion(prompt="hello world " * 2000), 400,
                              "context_length_exceeded"),
    "temperature-huge": ("POST", CHAT, JSON, chat(temperature=1e308), 400, "invalid_value"),
    "top-p-zero": ("POST", CHAT, JSON, chat(top_p=0), 400, "invalid_value"),
    "seed-negative": ("POST", CHAT, JSON, chat(seed=-1), 400, "invalid_value"),
    "n-two": ("POST", CHAT, JSON, chat(n=2), 400, "invalid_value"),
    "stream-string": ("POST", CHAT, JSON, chat(stream="yes"), 400, "invalid_type"),
    "too-many-stops": ("POST", CHAT, JSON, chat(stop=["a", "b", "c", "d", "e"]), 400, "invalid_value"),
    "unknown-field": ("POST", CHAT, JSON, chat(frequency_penalty=0.5), 400, "unknown_parameter"),
    "empty-prompt": ("POST", TEXT, JSON, completion(prompt=""), 400, "invalid_value"),
    "two-prompts": ("POST", TEXT, JSON, completion(prompt=["a", "b"]), 400, "invalid_type"),
    "token-id-beyond-vocab": ("POST", TEXT, JSON, completion(prompt=[1, 10**6]), 400, "invalid_value"),
    "bad-request-id": ("POST", TEXT, {**JSON, "x-request-id": "no spaces please"}, completion(), 400,
                       "invalid_value"),
    "unknown-route": ("GET", "/v1/nothing", {}, b"", 404, "route_not_found"),
    "trailing-slash": ("GET", "/v1/models/", {}, b"", 404, "route_not_found"),
    "wrong-method": ("GET", CHAT, {}, b"", 405, "method_not_allowed"),
    "post-health": ("POST", "/health", JSON, b"{}", 405, "method_not_allowed"),
}


def _send(client: httpx.Client, model: str, method: str, path: str, headers: dict, body) -> httpx.Response:
    if isinstance(body, dict):
        body = json.dumps(body).replace(MODEL, model).encode()
    return client.request(method, path, headers=headers, content=body)


def _server_errors(server) -> int:
    return sum(n for status, n in server.status()["server"]["responses"].items() if status.startswith("5"))


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gets_documented_4xx_json(http_server, case):
    method, path, headers, body, status, code = CASES[case]
    errors_before = _server_errors(http_server)
    with httpx.Client(base_url=http_server.url, timeout=30) as client:
        answer = _send(client, http_server.model_id, method, path, headers, body)
        assert answer.status_code == status, answer.text
        assert answer.headers["content-type"] == "application/json"
        error = answer.json()["error"]
        assert error["code"] == code, error
        assert set(error) == {"message", "type", "code", "param"} and error["message"]
        assert "Traceback" not in answer.text
        good = client.post("/v1/completions", json={"model": http_server.model_id, "prompt": "hi", "max_tokens": 2})
        assert good.status_code == 200, good.text
    assert _server_errors(http_server) == errors_before, "the server answered a 5xx (its counters saw it)"


def test_client_leaving_mid_body_is_no_error_and_submits_nothing(http_server):
    import socket

    from ..conftest import wait_for

    errors_before = _server_errors(http_server)
    host, port = http_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"model\": ")
        assert wait_for(lambda: http_server.status()["server"]["open_requests"] == 2)  # it, and this probe
    assert wait_for(lambda: http_server.status()["server"]["open_requests"] == 1)
    assert _server_errors(http_server) == errors_before
    assert http_server.wait_idle()
