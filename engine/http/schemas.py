"""Request validation: the JSON Schemas below are both the documentation and the check.

`CHAT_SCHEMA` and `COMPLETION_SCHEMA` are served in the OpenAPI document, so a
property-based client can generate requests from exactly what the server
enforces. `check` implements the small JSON Schema subset they use; every
failure is an `ApiError` 400 naming the parameter, never an exception that
escapes as a 500.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Union

from mlx_invariants.engine.http.errors import ApiError

MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_TOKENS_LIMIT = 1_000_000     # beyond the context window anyway; keeps ints small
DEFAULT_MAX_TOKENS = 512         # when the client gives none, capped by the context left
MAX_STOP_SEQUENCES = 4

_STOP = {"anyOf": [
    {"type": "string", "minLength": 1},
    {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": MAX_STOP_SEQUENCES},
    {"type": "null"},
]}
_COMMON: dict[str, Any] = {
    "model": {"type": "string", "minLength": 1},
    "max_tokens": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_TOKENS_LIMIT},
    "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
    "top_p": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
    "seed": {"type": ["integer", "null"], "minimum": 0, "maximum": 2**63 - 1},
    "stop": _STOP,
    "n": {"type": ["integer", "null"], "enum": [1, None]},
    "stream": {"type": ["boolean", "null"]},
    "stream_options": {"type": ["object", "null"], "additionalProperties": False,
                       "properties": {"include_usage": {"type": "boolean"}}},
    "user": {"type": "string"},
}
_TEXT_PART = {"type": "object", "required": ["type", "text"], "additionalProperties": False,
              "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}}
_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "additionalProperties": False,
    "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART, "minItems": 1}]},
        "name": {"type": "string"},
    },
}
CHAT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["model", "messages"],
    "additionalProperties": False,
    "properties": {
        **_COMMON,
        "messages": {"type": "array", "items": _MESSAGE, "minItems": 1},
        "max_completion_tokens": _COMMON["max_tokens"],
        "logprobs": {"type": ["boolean", "null"]},
        "top_logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 0},
    },
}
COMPLETION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["model", "prompt"],
    "additionalProperties": False,
    "properties": {
        **_COMMON,
        "prompt": {"anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 1},
            {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
        ]},
        "logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": 0},
        "echo": {"type": ["boolean", "null"], "enum": [False, None]},
    },
}


# -- parsing ------------------------------------------------------------------------

def check_content_type(value: str | None) -> None:
    """JSON only; a missing header is taken as JSON so `curl --data` works."""
    if not value:
        return
    media, _, params = value.partition(";")
    media = media.strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise ApiError(415, f"the body must be JSON (Content-Type: application/json), not {media!r}",
                       "unsupported_media_type")
    charset = params.strip().lower().removeprefix("charset=").strip('"') if "charset" in params.lower() else "utf-8"
    if charset not in ("utf-8", "utf8"):
        raise ApiError(415, f"the body must be UTF-8 JSON, not charset {charset!r}", "unsupported_media_type")


def parse_json(raw: bytes) -> Any:
    """Strict UTF-8 JSON: no NaN/Infinity, bounded nesting (the C parser raises RecursionError)."""
    if not raw.strip():
        raise ApiError(400, "the request body is empty; send a JSON object", "invalid_json")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the body is not valid UTF-8 (byte {exc.start})", "invalid_utf8") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ApiError(400, "the JSON body is nested too deeply", "invalid_json") from None
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, integers beyond Python's digit limit
        raise ApiError(400, f"the body is not valid JSON: {exc}", "invalid_json") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# -- the schema subset -------------------------------------------------------------

_JSON_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "null": lambda v: v is None,
}
_ARTICLE = {"object": "an object", "array": "an array", "integer": "an integer"}


def _describe(schema: dict[str, Any]) -> str:
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
    words = [_ARTICLE.get(k, f"a {k}") if k != "null" else "null" for k in kinds]
    if schema.get("type") == "array" and "type" in schema.get("items", {}):
        words = [f"an array of {schema['items']['type']}s"]
    return " or ".join(words)


def _invalid(path: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, f"'{path}' {message}", code, param=path)


def _has_type(value: Any, schema: dict[str, Any]) -> bool:
    kinds = schema.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds
    return kinds is None or any(_JSON_TYPES[k](value) for k in kinds)


def check(value: Any, schema: dict[str, Any], path: str = "body") -> None:
    """Raise ApiError 400 if `value` breaks `schema`; the message names the parameter and the fix."""
    if "anyOf" in schema:
        typed = [b for b in schema["anyOf"] if _has_type(value, b)]
        if len(typed) == 1:  # only one branch could apply: its own error is the precise one
            check(value, typed[0], path)
            return
        for branch in typed:
            try:
                check(value, branch, path)
                return
            except ApiError:
                continue
        raise _invalid(path, "must be " + " or ".join(_describe(b) for b in schema["anyOf"]), "invalid_type")
    if not _has_type(value, schema):
        raise _invalid(path, f"must be {_describe(schema)}", "invalid_type")
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(json.dumps(v) for v in schema["enum"])
        raise _invalid(path, f"must be one of {allowed}")
    if isinstance(value, str):
        _check_string(value, schema, path)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        _check_number(value, schema, path)
    elif isinstance(value, list):
        _check_array(value, schema, path)
    elif isinstance(value, dict):
        _check_object(value, schema, path)


def _check_string(value: str, schema: dict[str, Any], path: str) -> None:
    if len(value) < schema.get("minLength", 0):
        raise _invalid(path, "must not be empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _invalid(path, "contains an unpaired UTF-16 surrogate escape") from None


def _check_number(value: float, schema: dict[str, Any], path: str) -> None:
    if "minimum" in schema and value < schema["minimum"]:
        raise _invalid(path, f"must be at least {schema['minimum']}, got {value}")
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        raise _invalid(path, f"must be greater than {schema['exclusiveMinimum']}, got {value}")
    if "maximum" in schema and value > schema["maximum"]:
        raise _invalid(path, f"must be at most {schema['maximum']}, got {value}")


def _check_array(value: list, schema: dict[str, Any], path: str) -> None:
    if len(value) < schema.get("minItems", 0):
        raise _invalid(path, f"must have at least {schema['minItems']} item(s)")
    if len(value) > schema.get("maxItems", math.inf):
        raise _invalid(path, f"must have at most {schema['maxItems']} item(s)")
    if "items" in schema:
        for i, item in enumerate(value):
            check(item, schema["items"], f"{path}[{i}]")


def _check_object(value: dict, schema: dict[str, Any], path: str) -> None:
    properties = schema.get("properties", {})
    prefix = "" if path == "body" else f"{path}."
    for name, item in value.items():  # what is there first: a wrong "type" explains a missing "text"
        if name in properties:
            check(item, properties[name], prefix + name)
        elif schema.get("additionalProperties", True) is False:
            raise ApiError(400, f"'{prefix}{name}' is not a supported parameter; remove it",
                           "unknown_parameter", param=prefix + name)
    for name in schema.get("required", ()):
        if name not in value:
            raise ApiError(400, f"'{prefix}{name}' is required", "missing_required_parameter",
                           param=prefix + name)


# -- validated requests ----------------------------------------------------------------

@dataclass(frozen=True)
class GenerationRequest:
    """The fields both routes share, validated; `max_tokens` None means "what the context allows"."""

    model: str
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    logprobs: bool


@dataclass(frozen=True)
class ChatRequest(GenerationRequest):
    messages: tuple[dict[str, str], ...] = ()


@dataclass(frozen=True)
class CompletionRequest(GenerationRequest):
    prompt: Union[str, tuple[int, ...]] = ""


def _common(body: dict[str, Any], max_tokens: int | None, logprobs: bool) -> dict[str, Any]:
    stop = body.get("stop")
    options = body.get("stream_options") or {}
    return dict(
        model=body["model"],
        max_tokens=max_tokens,
        temperature=float(1.0 if body.get("temperature") is None else body["temperature"]),
        top_p=float(1.0 if body.get("top_p") is None else body["top_p"]),
        seed=body.get("seed"),
        stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
        stream=bool(body.get("stream")),
        include_usage=bool(options.get("include_usage")),
        logprobs=logprobs,
    )


def parse_chat(body: Any) -> ChatRequest:
    check(body, CHAT_SCHEMA)
    messages = tuple({"role": m["role"], "content": _text_of(m["content"])} for m in body["messages"])
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    return ChatRequest(**_common(body, max_tokens, bool(body.get("logprobs"))), messages=messages)


def parse_completion(body: Any) -> CompletionRequest:
    check(body, COMPLETION_SCHEMA)
    prompt = body["prompt"]
    if isinstance(prompt, list):  # one string in a list, or token ids
        prompt = prompt[0] if isinstance(prompt[0], str) else tuple(prompt)
    logprobs = body.get("logprobs") is not None
    return CompletionRequest(**_common(body, body.get("max_tokens"), logprobs), prompt=prompt)


def _text_of(content: str | list[dict[str, str]]) -> str:
    """OpenAI content parts are concatenated; only text parts pass the schema."""
    return content if isinstance(content, str) else "".join(part["text"] for part in content)
