"""Concurrency as a difference: a greedy request answers with others in flight what it answers alone.

Engines that batch or interleave requests have handed one request's sampled
token, or its KV-cache row, to another: every answer at one request is right,
and at two or more most are corrupted (mlx-vlm #1668). Nothing crashes and
nothing leaks, so only the output shows it. After a scenario's clients have
ended (and after the follow-up), `compare_alone` runs each comparable request
again on the same engine with nothing else in flight, and records both
outputs as one `check` per request; `outputs_match_alone` judges them.

Free of false alarms where it judges:

- Greedy only, and only what is comparable: streamed requests (the tokens are
  seen), ended completed (the whole answer) or cancelled, disconnected or
  aborted (a prefix of it); an error, a refusal or a crash is not compared,
  nor anything after the worker died or wedged. A seeded request's tokens are
  its engine's promise too (the reference engine keeps it on both routes, alone
  and in a batch: tests/engine/test_batched.py), but a sampled token has no
  lead by which to tell batch-shape rounding from another answer, so it is not
  compared. The lone run asks for what the request asked (its stop strings).
- A batched engine computes with other batch shapes than a lone request, and
  near-ties in the logits are real, so a different token is a finding only at
  a step where the lone run's likeliest token led the second by at least
  `CLEAR_LEAD` (1 nat), as the engine itself reports (`submit_scored`, top
  log-probabilities). Measured on the reference engine's batched route (CPU
  MLX, the embedded model, 8,884 steps decoded beside 1 to 7 others): the
  log-probabilities of the two likeliest tokens were equal to the lone run's
  to the bit. Batch-shape rounding on a GPU is far below a nat in float32;
  in bfloat16 one rounding of a logit of 16 to 32 is 0.125, and 1 nat is 8 of
  those. An adapter without `submit_scored` is not judged at all.
- The embedded model's final norm scales every logit by 8 (`engine/model.py`,
  `LOGIT_SCALE`, exact in floating point, so greedy outputs are unchanged), so
  most steps are decided: over 300 of the fuzzer's prompts (up to 300 words,
  14,331 greedy steps), 84 % led by 1 nat or more (15 % before the scaling).
- Over HTTP the answer is text in chunks, so a server is judged only when its
  lone run reported top log-probabilities for every chunk and each led by
  `CLEAR_LEAD`: then any other text is a finding; a server that does not
  report them (the reference server refuses `top_logprobs`) is not judged.

Cost: one lone request per distinct (request id, prompt length, route), kept
for the engine's life (`AloneCache`): a request that needs more tokens than
the kept run has runs again, longer. The lone run is the engine's own
computation, so an engine that is wrong alone is not found here (the
follow-up compares with a fresh engine instead).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Iterator, Optional

from mlx_invariants.fuzz.errors import Refused
from mlx_invariants.fuzz.scenario import WORKER_FAULTS, RequestSpec
from mlx_invariants.fuzz.trace import Trace
from mlx_invariants.fuzz.violation import Violation, ViolationKind, yields

if TYPE_CHECKING:
    from mlx_invariants.fuzz.driver import ScenarioRun

CLEAR_LEAD = 1.0     # nats the lone run's likeliest token must lead the second by, for a different token to count
TOP_K = 2            # top log-probabilities asked for: the likeliest and the runner-up
ALONE_STALL_S = 30.0  # a lone run that has not ended by then is given up (not judged); the scenario's stall
                      # and backstop checks judge a stuck engine
PREFIX_OUTCOMES = frozenset({"cancelled", "disconnected", "aborted"})  # a prefix of the lone answer


@dataclass(frozen=True)
class Alone:
    """What a request returned with nothing else in flight: its tokens (ids in-process, text chunks over
    HTTP), each one's lead (the likeliest log-probability minus the second's, None where not reported),
    the budget it ran with, and whether it ended because that ran out (a longer budget may go on)."""

    tokens: tuple[Any, ...]
    leads: tuple[Optional[float], ...]
    budget: int
    budget_ended: bool
    text: Optional[str] = None  # in-process, the text the tokens came with (None: not seen, or cut)

    @property
    def by_text(self) -> bool:
        """Chunks of text (over HTTP), which need not be one token each: not cut to another budget."""
        return any(isinstance(t, str) for t in self.tokens)

    def answer_for(self, max_tokens: int) -> Optional["Alone"]:
        """This answer as a request with `max_tokens` gets it alone, or None if this run cannot tell."""
        if self.by_text:
            return self if max_tokens == self.budget else None
        if len(self.tokens) < max_tokens and self.budget_ended:
            return None
        cut = len(self.tokens) > max_tokens
        return replace(self, tokens=self.tokens[:max_tokens], leads=self.leads[:max_tokens], budget=max_tokens,
                       text=None if cut else self.text)


@dataclass
class AloneCache:
    """Lone runs by (request id, prompt length, route, stop strings), for one engine's life: under greedy decoding a
    longer run's first n tokens are the n-token run."""

    runs: dict[tuple[str, int, str, tuple[str, ...]], Alone] = field(default_factory=dict)

    def get(self, spec: RequestSpec) -> Optional[Alone]:
        alone = self.runs.get(_key(spec))
        return alone.answer_for(spec.max_tokens) if alone is not None else None

    def put(self, spec: RequestSpec, alone: Alone) -> None:
        self.runs[_key(spec)] = alone


def _key(spec: RequestSpec) -> tuple[str, int, str, tuple[str, ...]]:
    """What a greedy answer depends on besides its budget: the prompt, the route, the stop strings."""
    return (spec.rid.split("~", 1)[0], spec.prompt_len, spec.route, spec.stop)


def comparable(trace: Trace, spec: RequestSpec, tokens: list[Any]) -> bool:
    """Greedy (a sampled answer, even a seeded one, has no decided step to judge a difference at), streamed
    (its tokens were seen) and ended in a way whose tokens are the lone answer (completed) or a prefix of it
    (stopped, with something to compare)."""
    ends = trace.of("request", "end", spec.rid)
    outcome = ends[0].info.get("outcome") if len(ends) == 1 else None
    return spec.greedy and spec.stream and (outcome == "completed" or (outcome in PREFIX_OUTCOMES and bool(tokens)))


async def compare_alone(run: "ScenarioRun") -> None:
    """Each comparable request of `run`, again alone on the same engine (or from its cache), recorded as a
    `check` beside what it returned in the scenario. Nothing when the adapter reports no leads
    (`submit_scored`) or the worker was lost (died or wedged)."""
    submit = getattr(run.adapter, "submit_scored", None)
    if submit is None or any(run.trace.of("fault", kind) for kind in WORKER_FAULTS):
        return
    clients = [c for rid, c in run.clients.items()
               if rid != "followup" and comparable(run.trace, c.spec, c.tokens)]
    if not clients:
        return
    run.adapter.set_point_hook(None)  # the lone runs are the fuzzer's, not the scenario's: no faults, no points
    try:
        for client in clients:
            cache: AloneCache = run.engine.alone
            alone = cache.get(client.spec)
            fresh = alone is None
            if fresh:
                alone = await _run_alone(submit, client.spec, run.suffix)
                if alone is None:
                    continue
                cache.put(client.spec, alone)
            end = run.trace.of("request", "end", client.spec.rid)[0]
            run.trace.record("check", "alone", client.spec.rid, info={
                "outcome": end.info.get("outcome"), "got": list(client.tokens), "alone": list(alone.tokens),
                "leads": list(alone.leads), "by": "text" if alone.by_text else "token", "cached": not fresh,
                "got_text": _text(client.handle), "alone_text": alone.text})
    finally:
        run.adapter.set_point_hook(run.injector.hook)


async def _run_alone(submit: Any, spec: RequestSpec, suffix: str) -> Optional[Alone]:
    """`spec` streamed alone through the adapter's `submit_scored`; None if it did not complete in time.
    Its id keeps the scenario's request id before the "~" (the prompt is made from it) with a suffix no
    scenario uses, so no fault or point of the scenario is mistaken for it."""
    lone = replace(spec, rid=f"{spec.rid}~alone{suffix.lstrip('~')}", stream=True)

    async def body() -> Optional[Alone]:
        try:
            handle = await submit(lone)
        except Refused:
            return None
        try:
            tokens = [token async for token in handle]
            outcome = handle.outcome()
        finally:
            await handle.close()
        if outcome.kind != "completed":
            return None
        leads = list(getattr(handle, "leads", ()))[:len(tokens)]
        leads += [None] * (len(tokens) - len(leads))
        return Alone(tuple(tokens), tuple(leads), spec.max_tokens, budget_ended=outcome.reason == "length",
                     text=_text(handle))

    try:
        return await asyncio.wait_for(body(), ALONE_STALL_S)
    except asyncio.TimeoutError:
        return None


@yields(ViolationKind(
    "output-differs-alone", "A greedy request returned other tokens with requests in flight around it than "
                            "alone on the same engine, at a step decided by a clear margin, or the same "
                            "tokens with other text.", exact=False,
    why="Outputs: the lone run is on the same engine after the scenario, and a token counts as different only "
        "where the lone run's likeliest token led the second by 1 nat or more (batch-shape rounding is far "
        "smaller); in-process, the same token ids must come with the same text (a prefix of it, if stopped), "
        "since text is a function of the ids. Which requests shared a step depends on timing, so it counts "
        "once it replays.",
    known_problems="Judges only adapters that report top log-probabilities (`submit_scored`: the reference "
                   "engine in-process; over HTTP a server whose lone run reports them for every chunk); the "
                   "lone run is the engine's own, so an engine wrong even alone is the follow-up's to find."))
def outputs_match_alone(trace: Trace) -> Iterator[Violation]:
    """A greedy request's tokens with others in flight are its tokens alone (a prefix, if it was stopped), and
    in-process the text they came with is its text alone."""
    for check in trace.of("check", "alone"):
        info = check.info
        judge = _by_text if info.get("by") == "text" else _by_token
        whole = info.get("outcome") == "completed"
        said = judge(info["got"], info["alone"], info["leads"], whole) or _by_text_of_tokens(
            info["got"], info["alone"], info.get("got_text"), info.get("alone_text"), whole)
        if said:
            yield Violation("output-differs-alone", f"{check.rid} ({info.get('outcome')}): {said}", rid=check.rid)


def _text(handle: Any) -> Optional[str]:
    """The text an in-process handle's tokens came with (`Returned`), None where it keeps none."""
    returned = getattr(handle, "returned", None)
    return "".join(returned.texts) if returned is not None and returned.unit == "token" else None


def _by_text_of_tokens(got: list[Any], alone: list[Any], got_text: Optional[str], alone_text: Optional[str],
                       whole: bool) -> str:
    """The same token ids with other text: a detokenizer (or text buffer) shared between requests mixes their
    text while every id stays right. Text is a function of the ids, so with equal ids it must be equal (a prefix,
    for a stopped answer) whatever the batch did; "" where they agree or a side was not seen."""
    if got_text is None or alone_text is None or list(got) != list(alone[:len(got)]):
        return ""
    if got_text == alone_text or (not (whole and len(got) == len(alone)) and alone_text.startswith(got_text)):
        return ""
    return f"the same {len(got)} token ids came with the text {got_text[:80]!r} where alone {alone_text[:80]!r}"


def _by_token(got: list[Any], alone: list[Any], leads: list[Optional[float]], whole: bool) -> str:
    """Where `got` leaves the lone answer at a decided step (a different token the lone run chose by a clear
    lead, a token past its end, or a completed answer cut short); "" if nowhere."""
    for step, token in enumerate(got):
        if step >= len(alone):
            return f"{len(got)} tokens where alone it returned {len(alone)}: {got[len(alone):][:8]} past its end"
        if token != alone[step]:
            lead = leads[step]
            if lead is None or lead < CLEAR_LEAD:
                return ""  # a near-tie (or unreported): another batch shape may round it the other way
            return (f"token {step} was {token} where alone it was {alone[step]}, which led the next likeliest by "
                    f"{lead:.2f} nats (first {step} tokens equal: {got[:step][-8:]})")
    if whole and len(got) < len(alone):
        return f"completed after {len(got)} tokens where alone it went on to {len(alone)}"
    return ""


def _by_text(got: list[str], alone: list[str], leads: list[Optional[float]], whole: bool) -> str:
    """Over HTTP, chunks are text: judged only when every chunk of the lone run that carried text was decided
    by a clear lead (a role or finish chunk carries neither)."""
    decided = [lead for chunk, lead in zip(alone, leads) if chunk]
    if not decided or any(lead is None or lead < CLEAR_LEAD for lead in decided):
        return ""
    got_text, alone_text = "".join(got), "".join(alone)
    if got_text == alone_text or (not whole and alone_text.startswith(got_text)):
        return ""
    return f"returned {got_text[:120]!r} where alone (every token led by {CLEAR_LEAD} nat or more) {alone_text[:120]!r}"


DIFFERENTIAL_ORACLES = (outputs_match_alone,)
