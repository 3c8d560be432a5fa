"""Request validation without a server: every schema property is enforced, and nothing escapes as a 500."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_invariants.engine.http import openapi, schemas
from mlx_invariants.engine.http.errors import ApiError

VALID_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
VALID_COMPLETION = {"model": "m", "prompt": "hi"}
ROUTES = [(schemas.CHAT_SCHEMA, schemas.parse_chat, VALID_CHAT),
          (schemas.COMPLETION_SCHEMA, schemas.parse_completion, VALID_COMPLETION)]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@pytest.mark.parametrize("schema, parse, valid", ROUTES, ids=["chat", "completion"])
def test_every_property_rejects_a_wrong_value_naming_itself(schema, parse, valid):
    for name in schema["properties"]:
        with pytest.raises(ApiError) as refused:
            parse({**valid, name: {"surely": ["not", "valid"]}})
        assert refused.value.status == 400
        assert refused.value.param is not None and refused.value.param.startswith(name), (name, refused.value.param)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(sorted(schemas.CHAT_SCHEMA["properties"]) + ["unknown"]), value=json_values)
def test_a_mutated_chat_request_is_accepted_or_refused_with_400(field, value):
    try:
        request = schemas.parse_chat({**VALID_CHAT, field: value})
    except ApiError as refused:
        assert refused.status == 400 and refused.code and refused.message
    else:
        assert request.messages and (request.max_tokens is None or request.max_tokens >= 1)


@settings(max_examples=300, deadline=None)
@given(body=json_values)
def test_any_json_body_is_accepted_or_refused_with_400(body):
    for _, parse, _ in ROUTES:
        try:
            parse(body)
        except ApiError as refused:
            assert refused.status == 400


@pytest.mark.parametrize("raw, code", [
    (b"", "invalid_json"), (b"{", "invalid_json"), (b"[Infinity]", "invalid_json"),
    (b"\xc3\x28", "invalid_utf8"), (b"[" * 50_000, "invalid_json"),
])
def test_parse_json_refuses_with_400(raw, code):
    with pytest.raises(ApiError) as refused:
        schemas.parse_json(raw)
    assert (refused.value.status, refused.value.code) == (400, code)


@pytest.mark.parametrize("value, ok", [
    (None, True), ("application/json", True), ("application/json; charset=UTF-8", True),
    ("application/vnd.api+json", True), ("text/plain", False), ("application/json; charset=utf-16", False),
])
def test_content_type(value, ok):
    if ok:
        schemas.check_content_type(value)
    else:
        with pytest.raises(ApiError) as refused:
            schemas.check_content_type(value)
        assert refused.value.status == 415


def test_parsed_requests_carry_openai_defaults_and_aliases():
    chat = schemas.parse_chat({**VALID_CHAT, "max_completion_tokens": 7, "stop": "x",
                               "stream": True, "stream_options": {"include_usage": True},
                               "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                         {"type": "text", "text": "b"}]}]})
    assert (chat.max_tokens, chat.stop, chat.stream, chat.include_usage) == (7, ("x",), True, True)
    assert chat.messages == ({"role": "user", "content": "ab"},)
    assert (chat.temperature, chat.top_p, chat.logprobs) == (1.0, 1.0, False)
    assert schemas.parse_completion({**VALID_COMPLETION, "prompt": ["one"]}).prompt == "one"
    assert schemas.parse_completion({**VALID_COMPLETION, "prompt": [5, 6]}).prompt == (5, 6)


def test_openapi_document_serves_the_enforced_schemas():
    document = json.loads(json.dumps(openapi.document()))
    components = document["components"]["schemas"]
    assert components["ChatRequest"] == json.loads(json.dumps(schemas.CHAT_SCHEMA))
    assert components["CompletionRequest"] == json.loads(json.dumps(schemas.COMPLETION_SCHEMA))
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/v1/status"} <= set(document["paths"])
