"""The only objects that cross between the event loop and the owner thread.

Plain frozen values: no MLX arrays, no futures, no locks. The loop sends
`Pending` to the owner; the owner sends `Token`, `Finished` and `Failed` back
through `loop.call_soon_threadsafe`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Union

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    """What the client asked for, already validated by the HTTP layer."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0  # the k most likely tokens at each step, with their log-probabilities


@dataclass(frozen=True)
class Pending:
    """A request handed to the owner thread: token ids, never text or arrays."""

    rid: str
    prompt: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)


@dataclass(frozen=True)
class Token:
    rid: str
    token: int
    text: str
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()  # (token, log-probability), most likely first


@dataclass(frozen=True)
class Finished:
    rid: str
    reason: FinishReason
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Failed:
    """The request ended with an error inside the engine; `message` is safe to show a client."""

    rid: str
    message: str
    kind: str = "engine_error"


Event = Union[Token, Finished, Failed]
Terminal = (Finished, Failed)
