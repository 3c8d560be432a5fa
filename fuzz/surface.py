"""A request's own fields, judged where its client can see them: stop strings and log-probabilities.

A scenario's requests ask for more than a greedy answer (`RequestSpec`:
sampling, log-probabilities, stop strings). What sampling returns is not
judged (it is random, and seeded only where the engine promises it); what a
client sees honoured is: no returned text holds a stop string it asked for,
and log-probabilities come with the answer if and only if it asked for them,
with as many alternatives as it asked for. The driver records what each
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
    known_problems="Judges what the adapter shows (`Handle.returned`): in-process streamed requests, over HTTP "
                   "every answer; a stop string the model never produces is never tested."))
def stop_strings_withheld(trace: Trace) -> Iterator[Violation]:
    """No returned text contains one of its request's stop strings."""
    asked = _asked(trace)
    for end in trace.of("request", "end"):
        text = end.info.get("text")
        stops = asked.get(end.rid, {}).get("stop") or ()
        hit = next((stop for stop in stops if isinstance(text, str) and stop in text), None)
        if hit is not None:
            at = text.index(hit)
            yield Violation("stop-string-returned", f"{end.rid} asked to stop at {list(stops)} but returned "
                            f"{hit!r} at character {at}: ...{text[max(0, at - 40):at + 40]!r}", rid=end.rid)


@yields(ViolationKind(
    "logprobs-not-as-asked", "A request's tokens came with log-probabilities it did not ask for, without those "
                             "it asked for, or with another number of top alternatives.", exact=True,
    why="Outputs as the client received them: whether log-probabilities come, and how many alternatives, is the "
        "request's own field, the same at any timing.",
    known_problems="Judged on the tokens or chunks that carried text; over HTTP the fuzzer asks for the sampled "
                   "token's log-probability only (the reference server refuses top_logprobs), and a server that "
                   "ignores the field is found."))
def logprobs_as_asked(trace: Trace) -> Iterator[Violation]:
    """Log-probabilities with every token (or chunk) of an answer that asked for them, with none of one that
    did not, and as many top alternatives as asked."""
    asked = _asked(trace)
    for end in trace.of("request", "end"):
        seen = end.info.get("logprobs")
        if not isinstance(seen, list) or end.rid not in asked:
            continue
        wants, alternatives = bool(asked[end.rid].get("logprobs")), int(asked[end.rid].get("top_logprobs") or 0)
        wrong = [i for i, came in enumerate(seen) if came != wants]
        if wrong:
            yield Violation("logprobs-not-as-asked", f"{end.rid} {'asked' if wants else 'did not ask'} for "
                            f"log-probabilities, but {len(wrong)} of its {len(seen)} pieces of text came "
                            f"{'without' if wants else 'with'} them (first: piece {wrong[0]})", rid=end.rid)
            continue
        counts = end.info.get("alternatives") or []
        short = [i for i, count in enumerate(counts) if alternatives and count != alternatives]
        if short:
            yield Violation("logprobs-not-as-asked", f"{end.rid} asked for {alternatives} top alternatives per "
                            f"token, but piece {short[0]} came with {counts[short[0]]}", rid=end.rid)


SURFACE_ORACLES = (stop_strings_withheld, logprobs_as_asked)
