"""What every engine here shares and none of them gets wrong: the tiny model, prompts, OpenAI bodies.

Loading touches MLX, so `load_model` is called on the thread that will own MLX; tokenizing does not, but
the fast tokenizer is not safe to share across threads, so engines tokenize on their MLX thread too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Optional

PointHook = Callable[[str, str, dict], None]


class EngineClosed(Exception):
    """The engine was shut down (or is shutting down); it takes no more work."""


class RequestAborted(Exception):
    """The request was aborted through the engine's abort call before it finished."""


class BadRequest(ValueError):
    """The request body is not an OpenAI completion or chat request we can serve."""


def load_model() -> tuple[Any, Any]:
    """The tiny model and its tokenizer, weights realized; call on the thread that owns MLX."""
    import mlx.core as mx
    from mlx_lm import load

    from mlx_invariants.engine.model import tiny_model_path

    model, tokenizer = load(str(tiny_model_path()))
    mx.eval(model.parameters())
    return model, tokenizer


def encode(tokenizer: Any, text: str, chat: bool) -> list[int]:
    """The prompt's token ids: the chat template for a chat request, the bare text otherwise."""
    if chat:
        return list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True))
    return list(tokenizer.encode(text))


def mark(hook: Optional[PointHook], point: str, rid: str, **info: Any) -> None:
    """Tell the fuzzer, when it listens, that the named thing happens here (it may pause or raise)."""
    if hook is not None:
        hook(point, rid, info)


@dataclass(frozen=True)
class Ask:
    """One OpenAI request, as the servers here read it."""

    text: str
    chat: bool
    max_tokens: int
    stream: bool


def parse_ask(path: str, raw: bytes) -> Ask:
    """The request at `path` with body `raw`; BadRequest says what is wrong with it."""
    if path not in ("/v1/completions", "/v1/chat/completions"):
        raise BadRequest(f"no route {path}")
    try:
        body = json.loads(raw or b"{}")
    except ValueError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("the body is not a JSON object")
    chat = path == "/v1/chat/completions"
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        text = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    else:
        text = body.get("prompt")
        if not isinstance(text, str):
            raise BadRequest("prompt must be a string")
    max_tokens = body.get("max_tokens", 16)
    if not isinstance(max_tokens, int) or not 1 <= max_tokens <= 4096:
        raise BadRequest("max_tokens must be a whole number from 1 to 4096")
    return Ask(text, chat, max_tokens, bool(body.get("stream")))


def chunk_frame(ask: Ask, text: str, finish: Optional[str] = None) -> bytes:
    """One SSE event carrying `text` (and the finish reason on the last one)."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if ask.chat:
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    kind = "chat.completion.chunk" if ask.chat else "text_completion"
    return f"data: {json.dumps({'object': kind, 'choices': [choice]})}\n\n".encode()


DONE_FRAME = b"data: [DONE]\n\n"


def answer_body(ask: Ask, text: str, finish: str) -> dict:
    """The whole non-streaming answer."""
    if ask.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
        return {"object": "chat.completion", "choices": [choice]}
    return {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}


def error_body(message: str, code: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code}}
