"""OpenAI response bodies and stream chunks for the chat and text completion routes.

One `Shape` per route knows its object names and where text and logprobs go;
the relay that drives a request never needs to know which route it serves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from mlx_invariants.engine.messages import Finished, Token


def usage(result: Finished) -> dict[str, int]:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens}


@dataclass
class Shape:
    """Builds one request's JSON; `include_usage` adds `"usage": null` to every chunk, as OpenAI does."""

    rid: str
    model: str
    logprobs: bool
    include_usage: bool = False
    created: int = field(default_factory=lambda: int(time.time()))

    object_name = ""
    chunk_object_name = ""

    def _envelope(self, object_name: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.rid, "object": object_name, "created": self.created, "model": self.model,
                "choices": choices}

    def chunk(self, choice: dict[str, Any] | None) -> dict[str, Any]:
        body = self._envelope(self.chunk_object_name, [] if choice is None else [{"index": 0, **choice}])
        if self.include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, result: Finished) -> dict[str, Any]:
        return {**self.chunk(None), "usage": usage(result)}

    def first_chunk(self) -> dict[str, Any] | None:
        return None

    def token_chunk(self, token: Token) -> dict[str, Any]:
        raise NotImplementedError

    def finish_chunk(self, reason: str) -> dict[str, Any]:
        raise NotImplementedError

    def body(self, tokens: list[Token], result: Finished) -> dict[str, Any]:
        raise NotImplementedError


class ChatShape(Shape):
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def _logprobs(self, tokens: list[Token]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        return {"content": [{"token": t.text, "logprob": t.logprob, "bytes": list(t.text.encode()),
                             "top_logprobs": []} for t in tokens]}

    def first_chunk(self) -> dict[str, Any]:
        return self.chunk({"delta": {"role": "assistant", "content": ""}, "logprobs": None,
                           "finish_reason": None})

    def token_chunk(self, token: Token) -> dict[str, Any]:
        return self.chunk({"delta": {"content": token.text}, "logprobs": self._logprobs([token]),
                           "finish_reason": None})

    def finish_chunk(self, reason: str) -> dict[str, Any]:
        return self.chunk({"delta": {}, "logprobs": None, "finish_reason": reason})

    def body(self, tokens: list[Token], result: Finished) -> dict[str, Any]:
        message = {"role": "assistant", "content": "".join(t.text for t in tokens)}
        choice = {"index": 0, "message": message, "logprobs": self._logprobs(tokens),
                  "finish_reason": result.reason}
        return {**self._envelope(self.object_name, [choice]), "usage": usage(result)}


class TextShape(Shape):
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def _logprobs(self, tokens: list[Token], offset: int = 0) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        offsets = []
        for t in tokens:
            offsets.append(offset)
            offset += len(t.text)
        return {"tokens": [t.text for t in tokens], "token_logprobs": [t.logprob for t in tokens],
                "top_logprobs": None, "text_offset": offsets}

    _streamed_chars = 0  # where the next streamed token starts in the completion text

    def token_chunk(self, token: Token) -> dict[str, Any]:
        logprobs = self._logprobs([token], self._streamed_chars)
        self._streamed_chars += len(token.text)
        return self.chunk({"text": token.text, "logprobs": logprobs, "finish_reason": None})

    def finish_chunk(self, reason: str) -> dict[str, Any]:
        return self.chunk({"text": "", "logprobs": None, "finish_reason": reason})

    def body(self, tokens: list[Token], result: Finished) -> dict[str, Any]:
        choice = {"index": 0, "text": "".join(t.text for t in tokens), "logprobs": self._logprobs(tokens),
                  "finish_reason": result.reason}
        return {**self._envelope(self.object_name, [choice]), "usage": usage(result)}
