"""A request's own fields, judged where its client can see them: stop strings and log-probabilities.

A scenario's requests ask for more than a greedy answer (`RequestSpec`:
sampling, log-probabilities, stop strings). What sampling returns is not
judged (it is random, and seeded only where the engine promises it); what a
client sees honoured is: no returned text holds a stop string it asked for,
and log-probabilities come with the answer if and only if it asked for them,
with as many alternatives as it asked for. Over HTTP a server may ignore stop
strings, and end at its end-of-sequence token with one in its text: there only
an answer that stopped and ends with a stop string (returned where it should
have been cut) is found. It may also offer no
log-probabilities at all, or not on every route and transport (mlx_lm.server
streams none), which is no bug: there an answer that asked and got none is
judged only against one of its scenario asked alike that got them. The driver records what each
request asked for at its `request/submit` and what its client saw, text and
log-probabilities per token or chunk, at its `request/end` (an adapter's
`Handle.returned`; one without it is not judged).
"""

from __future__ import annotations

from typing import Any, Iterator

from mlx_invariants.fuzz.trace import Trace
from mlx_invariants.fuzz.violation import Violation, ViolationKind, yields


def _asked(trace: Trace) -> dict[str, dict[str, Any]]:
    return {event.rid: event.info for event in trace.of("request", "submit")}


@yields(ViolationKind(
    "stop-string-returned", "A request's returned text holds a stop string it asked for.", exact=True,
    why="Outputs as the client received them: a stop string ends the answer before it, so no correct engine "
        "returns one, whatever the timing (a cancelled answer is a prefix of the whole one and holds none either).",
    known_problems="Judges what the adapter shows (`Handle.returned`): in-process streamed requests, and over "
                   "HTTP only an answer that says it stopped (finish reason stop) and ends with a stop string, "
                   "since a server may ignore the field (the false-alarm benchmark's servers do) and end at its "
                   "end-of-sequence token; a stop string the model never produces is never tested."))
def stop_strings_withheld(trace: Trace) -> Iterator[Violation]:
    """No returned text contains one of its request's stop strings (over HTTP: ends with one, having stopped)."""
    asked = _asked(trace)
    for end in trace.of("request", "end"):
        text = end.info.get("text")
        stops = asked.get(end.rid, {}).get("stop") or ()
        if not isinstance(text, str):
            continue
        if end.info.get("unit") == "chunk":  # a server that ignores stop strings is no finding: one that cut there
            stops = [stop for stop in stops if end.info.get("reason") == "stop" and text.endswith(stop)]
        hit = next((stop for stop in stops if stop in text), None)
        if hit is not None:
            at = text.index(hit)
            yield Violation("stop-string-returned", f"{end.rid} asked to stop at {list(stops)} but returned "
                            f"{hit!r} at character {at}: ...{text[max(0, at - 40):at + 40]!r}", rid=end.rid)


@yields(ViolationKind(
    "logprobs-not-as-asked", "A request's tokens came with log-probabilities it did not ask for, without those "
                             "it asked for, or with another number of top alternatives.", exact=True,
    why="Outputs as the client received them: whether log-probabilities come, and how many alternatives, is the "
        "request's own field, the same at any timing.",
    known_problems="Judged on the tokens or chunks that carried text. Over HTTP a server may not offer them at all "
                   "(mlx_lm.server streams none, and reads completions' `logprobs: 0` as no), so a request there "
                   "is judged only against another of its scenario with the same route and transport that asked "
                   "and got them, and the fuzzer asks for the sampled token's only (the reference server "
                   "refuses top_logprobs)."))
def logprobs_as_asked(trace: Trace) -> Iterator[Violation]:
    """In-process, log-probabilities with every token of an answer that asked for them, with none of one that
    did not, and as many top alternatives as asked; over HTTP, every chunk of an answer that asked for them
    came with them where another answer asked alike got them."""
    asked = _asked(trace)
    served: set[tuple[Any, Any]] = set()  # over HTTP: (route, stream) of answers that asked and got them all
    missing: list[tuple[Any, Any, Any, list[int], int]] = []
    for end in trace.of("request", "end"):
        seen = end.info.get("logprobs")
        if not isinstance(seen, list) or end.rid not in asked:
            continue
        ask = asked[end.rid]
        wants, alternatives = bool(ask.get("logprobs")), int(ask.get("top_logprobs") or 0)
        wrong = [i for i, came in enumerate(seen) if came != wants]
        if end.info.get("unit") == "chunk":
            if wants and seen:
                key = (ask.get("route"), ask.get("stream"))
                if wrong:
                    missing.append((key, end.rid, ask, wrong, len(seen)))
                else:
                    served.add(key)
            continue
        if wrong:
            yield Violation("logprobs-not-as-asked", f"{end.rid} {'asked' if wants else 'did not ask'} for "
                            f"log-probabilities, but {len(wrong)} of its {len(seen)} tokens with text came "
                            f"{'without' if wants else 'with'} them (first: token {wrong[0]})", rid=end.rid)
            continue
        counts = end.info.get("alternatives") or []
        short = [i for i, count in enumerate(counts) if alternatives and count != alternatives]
        if short:
            yield Violation("logprobs-not-as-asked", f"{end.rid} asked for {alternatives} top alternatives per "
                            f"token, but token {short[0]} came with {counts[short[0]]}", rid=end.rid)
    for key, rid, ask, wrong, pieces in missing:
        if key in served:
            yield Violation("logprobs-not-as-asked", f"{rid} ({key[0]}, {'streamed' if key[1] else 'plain'}) "
                            f"asked for log-probabilities and {len(wrong)} of its {pieces} chunks with text came "
                            f"without them, where another request asked alike got them", rid=rid)


SURFACE_ORACLES = (stop_strings_withheld, logprobs_as_asked)
