"""One refusal, two transports: answered with an error status to a plain request and with HTTP 200 to a
streaming one (or the other way round), within one scenario over HTTP.

A server decides a refusal (busy, at capacity, a bad request) before it answers, so it can say so in the
status line whether the request streams or not. One that refuses a plain request with 503 but answers a
streaming request in the same situation HTTP 200 whose only content is an error frame tells every client
that checks the status (an SDK's retry, a load balancer, a dashboard) that the stream succeeded: vllm-mlx
0.6.0's SimpleEngine does so while busy (docs/zoo.md). The HTTP adapter records how each failed request
was answered (`Answer`, in its `request end` event); `refusals_agree_across_transports` compares every
answer that hid its failure behind a 200 with the answers on the other transport that gave an error status.

What counts as the same situation is decided from the trace alone (`_named_alike`, `_busy_alike`):

- named: both errors carry the same `code`, a word (`text_generation_busy`, `invalid_prompt`; a number is
  only a status again), and the error status is one a refusal decided before any work gets: a 4xx, or any
  error status whose code says busy. The server calls them one situation itself: exact.
- busy: the error status says busy (its code does, or it is a bare 429 or 503), the hidden error names
  nothing (no code, or a number: vllm-mlx's "Internal server error", code 500), and both requests were sent
  while another request of the scenario held the server: still in flight, or gone (its client cancelled
  or disconnected) with no request completed since, as a server may still be finishing it. Whether both
  came while it was held depends on timing: it counts once it replays.

Left alone, as no inconsistency: error statuses on both transports (even different ones: both tell a
client it failed); 200s on both (a server that puts every error in the body, consistently); a stream that
sent any frame before its error (it had begun, and its status went out with its first byte); an error
status of 5xx (or a 503 whose code names something else than busy, `engine_dead`, `engine_shutting_down`)
against a 200 stream: a stream admitted before its engine failed can only say so in a frame.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterator, Optional

from mlx_invariants.fuzz.followup import is_busy
from mlx_invariants.fuzz.trace import Trace
from mlx_invariants.fuzz.violation import Violation, ViolationKind, yields

BUSY_STATUSES = frozenset({429, 503})            # an error status that says "busy" when no code says anything
GONE_OUTCOMES = frozenset({"cancelled", "disconnected"})


@dataclass(frozen=True)
class Answer:
    """How a failed HTTP request was answered, as its client read it off the wire.

    `carrier` says where the error was: "status" (an error status, its body the error), "body" (HTTP 200, a
    JSON body holding only an error), "frame" (an SSE error frame in an HTTP 200 stream, after `before`
    data frames). `code` is the error's own `code` when it is a word (what the server calls the situation),
    "" when it has none or a number."""

    status: int
    carrier: str
    code: str = ""
    type: str = ""
    message: str = ""
    before: int = 0

    @classmethod
    def read(cls, status: int, carrier: str, error: Any, before: int = 0) -> "Answer":
        """From the error the server sent: an OpenAI-style object, or a bare string."""
        fields = error if isinstance(error, dict) else {"message": error}
        code = str(fields.get("code") or "")
        return cls(status, carrier, "" if code.lstrip("-").isdigit() else code, str(fields.get("type") or ""),
                   str(fields.get("message") or fields.get("detail") or "")[:200], before)

    @property
    def refusal(self) -> bool:
        """It failed before it said anything else: a plain answer, or a stream whose first frame was the error."""
        return self.carrier != "frame" or self.before == 0

    @property
    def hidden(self) -> bool:
        """A refusal behind a success status."""
        return self.refusal and self.status < 400

    @property
    def says_busy(self) -> bool:
        """An error status that says busy: by its code, or with none, a bare 429 or 503."""
        return self.status >= 400 and (is_busy(self.code) if self.code else self.status in BUSY_STATUSES)

    @property
    def refused_before_work(self) -> bool:
        """An error status a refusal decided at admission gets: a 4xx, or busy."""
        return 400 <= self.status < 500 or self.says_busy

    def describe(self) -> str:
        said = self.code or self.type
        if self.carrier == "status":
            return f"{self.status} {said}".strip()
        what = f"{said}: {self.message}" if said and self.message else said or self.message or "no message"
        where = "an error frame" if self.carrier == "frame" else "an error in its JSON body"
        return f"{self.status} with only {where} ({what[:120]})"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Answer":
        return cls(**data)


@dataclass(frozen=True)
class _Answered:
    rid: str
    stream: bool
    answer: Answer
    seq: int  # the request's submit


def _refusals(trace: Trace) -> list[_Answered]:
    """Every request of the scenario that an HTTP server refused, with how it answered."""
    sent = {e.rid: e for e in trace.of("request", "submit")}
    out = []
    for end in trace.of("request", "end"):
        data, submit = end.info.get("answer"), sent.get(end.rid)
        if data and submit is not None:
            answer = Answer.from_json(data)
            if answer.refusal:
                out.append(_Answered(end.rid, bool(submit.info.get("stream")), answer, submit.seq))
    return out


def _held(trace: Trace, request: _Answered) -> bool:
    """Whether another request held the server when `request` was sent: still in flight, or gone (its client
    went) with no request completed between its end and this send."""
    ends = trace.of("request", "end")
    for other in trace.of("request", "submit"):
        if other.rid == request.rid or other.seq > request.seq:
            continue
        end = next((e for e in ends if e.rid == other.rid), None)
        if end is None or end.seq > request.seq:
            return True
        if end.info.get("outcome") in GONE_OUTCOMES and not any(
                e.info.get("outcome") == "completed" and end.seq < e.seq < request.seq for e in ends):
            return True
    return False


def _named_alike(hidden: Answer, proper: Answer) -> bool:
    """The server named both the same (a word code), and `proper` is a refusal decided before any work."""
    return bool(hidden.code) and hidden.code == proper.code and proper.refused_before_work


def _busy_alike(trace: Trace, hidden: _Answered, proper: _Answered) -> bool:
    """`proper` says busy, `hidden` names nothing, and both were sent while another request held the server."""
    return not hidden.answer.code and proper.answer.says_busy and _held(trace, hidden) and _held(trace, proper)


@yields(
    ViolationKind(
        "refusal-differs-by-transport", "A refusal the server named the same (its error code) got an error "
                                        "status on one transport and HTTP 200 with only the error on the other.",
        exact=True,
        why="Both answers are recorded with their status and code: the server itself named them one situation "
            "(a word code such as `text_generation_busy`, on a 4xx or a busy status, both decided before any "
            "work) and told one client it failed and the other it succeeded, whatever the timing.",
        known_problems="Over HTTP only; both transports must be refused in one scenario. Two different error "
                       "statuses for one code are not reported: both tell a client it failed."),
    ViolationKind(
        "busy-differs-by-transport", "While the server was busy, one transport was refused with a busy status "
                                     "and the other answered HTTP 200 with only an unnamed error.",
        exact=False,
        why="The hidden error names nothing (no code, or a number), so the situation is taken from concurrency: "
            "both requests were sent while another request of the scenario held the server (in flight, or gone "
            "with nothing completed since). Whether both landed there depends on timing, so it counts once it "
            "replays.",
        known_problems="Over HTTP only. A hidden error with a code of its own (a word) is judged only by its "
                       "code, so an unnamed busy refusal against a named one is not reported."),
)
def refusals_agree_across_transports(trace: Trace) -> Iterator[Violation]:
    """A refusal a streaming request got behind HTTP 200 (only an error frame) where a plain request in the
    same situation got an error status, or the other way round: a client checking the status is misled on
    one transport only. Reported once per misled request."""
    refusals = _refusals(trace)
    for hidden in (r for r in refusals if r.answer.hidden):
        others = [r for r in refusals if r.stream != hidden.stream and r.answer.status >= 400]
        named = next((r for r in others if _named_alike(hidden.answer, r.answer)), None)
        busy = None if named else next((r for r in others if _busy_alike(trace, hidden, r)), None)
        proper = named or busy
        if proper is None:
            continue
        plain, stream = (proper, hidden) if hidden.stream else (hidden, proper)
        situation = "busy" if busy or is_busy(proper.answer.code) else f"refused as {proper.answer.code}"
        headline = (f"{situation}: non-streaming {plain.rid} answered {plain.answer.describe()}, "
                    f"streaming {stream.rid} answered {stream.answer.describe()}")
        detail = f"{hidden.rid}: {hidden.answer.message}\n{proper.rid}: {proper.answer.message}"
        if named:
            yield Violation("refusal-differs-by-transport", headline, rid=hidden.rid, detail=detail)
        else:
            yield Violation("busy-differs-by-transport", headline, rid=hidden.rid, detail=detail)


TRANSPORT_ORACLES = (refusals_agree_across_transports,)
