"""The "cancel-in-call" fault: the cancel lands while the worker is really inside a long MLX call (a
prefill), not while it waits paused at a point; a slot or lock let go then is what the ownership oracles
see. Engines that let go of their slot or lock while the worker is still in MLX are found with this kind
alone, and the fixed engines stay clean under it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, seed, settings

from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.profiles import PROFILES
from mlx_invariants.fuzz.runner import run_fuzz
from mlx_invariants.fuzz.scenario import At, FaultSpec, RequestSpec, Scenario
from mlx_invariants.fuzz.session import run_scenario
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.strategies import SHORT_PROMPT, scenarios
from mlx_invariants.fuzz.target import Target
from mlx_invariants.fuzz.trace import Trace
from mlx_invariants.mutants import Edit, Mutant, select
from mlx_invariants.mutants.copies import import_copy
from tests.conftest import BACKSTOP_S
from tests.fuzz import toy_adapter

IN_CALL = ("cancel-in-call",)
LONG = 60  # prompt words: a prefill of about a hundred tokens, long next to the loop taking a cancel


def _in_mlx_at_cancel(trace: Trace) -> bool:
    """Whether the cancel was delivered while an MLX call on another thread was open."""
    cancel = trace.first("fault", "cancel")
    return any(span.seq < cancel.seq and (span.end is None or span.end > cancel.seq) and span.thread != cancel.thread
               for span in trace.of("mlx"))


def _one(kind: str, point: str = "WORKER_STARTED") -> Scenario:
    return Scenario((RequestSpec("r0", prompt_len=LONG, max_tokens=3, stream=False),),
                    (FaultSpec(kind, At("r0", point, 1 if point == "BEFORE_DECODE" else 0)),))


def test_a_cancel_in_call_lands_while_the_worker_is_inside_the_prefill():
    engine = Target.reference("simple").build()
    trace = run_scenario(engine, _one("cancel-in-call"))
    assert trace.first("fault", "in-call") is not None
    assert _in_mlx_at_cancel(trace), "the worker waited for the cancel instead of going on into its prefill"
    assert trace.first("point", "PREFILL_DONE", "r0") is not None  # it did go on: the prefill ran
    assert judge(trace) == []
    paused = run_scenario(engine, _one("cancel"))
    assert not _in_mlx_at_cancel(paused), "a plain cancel is taken while the worker waits at its point"


def _strategy(**shapes: int):
    return scenarios(kinds=IN_CALL, long_prompt=LONG, max_requests=2, **shapes)


def _settings(tmp_path: Path, examples: int) -> FuzzSettings:
    return FuzzSettings(examples=examples, budget_s=BACKSTOP_S, explicit=(), replays=0, shrink=False, debug_run=False,
                        report_dir=tmp_path)


# M01 of the catalogue lets go of the slot at every close, so any scenario finds it (the follow-up does):
# it shows the new kind finds the class, not that the kind is what found it. This one lets go only when the
# client left before the end, so nothing but a delivered cancel finds it.
CLIENT_LEFT = Mutant(
    id="T01-slot-freed-when-the-client-left",
    title="the slot is let go at once when the client left, while its worker is still in the prefill",
    story="A request whose client is gone is told to stop and its slot released; the worker, inside its "
          "prefill, stops only at its next token.",
    invariant="the serialized slot is held until the worker has made its last MLX call",
    killers=("fuzz:slot-freed-early",),
    edits=(Edit("engine/serial.py", """
        try:
            await wait_through_cancellation(job.done)
        finally:
            self._release(stream)
    """, """
        try:
            if stream.result is None:  # the client left before the end: stop the worker, free the slot
                job.stop.set()
            else:
                await wait_through_cancellation(job.done)
        finally:
            self._release(stream)
    """),),
)


@pytest.mark.parametrize("mutant", [CLIENT_LEFT, *select(["M01"])], ids=lambda m: m.id.split("-")[0])
def test_a_slot_freed_while_the_worker_is_in_mlx_is_found_by_cancels_in_call_alone(mutant: Mutant, tmp_path: Path):
    package = import_copy(mutant, tmp_path / "plants")
    result = run_fuzz(Target.reference("simple", package=package), _settings(tmp_path, 30), strategy=_strategy())
    assert result.failure is not None, f"clean after {result.examples} examples"
    assert result.failure.violations[0].kind == "slot-freed-early", result.failure.headline
    assert {f.kind for f in result.failure.scenario.faults} == set(IN_CALL)


def test_the_reference_engine_is_clean_under_cancels_in_call(tmp_path: Path):
    result = run_fuzz(Target.reference("simple"), _settings(tmp_path, 12), strategy=_strategy())
    assert result.ok, result.failure and result.failure.headline
    assert result.examples == 12


def test_the_toy_engines_seed_000_bug_is_found_by_cancels_in_call_alone(tmp_path: Path):
    result = run_fuzz(toy_adapter.target("make_plain", IN_CALL), _settings(tmp_path, 40))
    assert result.failure is not None, f"clean after {result.examples} examples"
    assert result.failure.violations[0].kind == "lock-released-early", result.failure.headline


def test_the_drained_toy_engine_is_clean_under_cancels_in_call(tmp_path: Path):
    result = run_fuzz(toy_adapter.target("make_drain", IN_CALL), _settings(tmp_path, 20))
    assert result.ok, result.failure and result.failure.headline


def _drawn(**shapes: int) -> list[Scenario]:
    seen: list[Scenario] = []

    @seed(16)
    @settings(max_examples=120, derandomize=True, database=None)
    @given(scenarios(**shapes))
    def draw(scenario: Scenario) -> None:
        seen.append(scenario)

    draw()
    return seen


def _aimed_long(drawn: list[Scenario], kind: str) -> float:
    """Of the faults of `kind`, the share that aim at a request with a long prompt."""
    prompts = [{r.rid: r.prompt_len for r in s.requests}[f.at.rid] for s in drawn for f in s.faults if f.kind == kind]
    return sum(p > SHORT_PROMPT for p in prompts) / len(prompts)


def test_a_cancel_in_call_often_faces_a_long_prompt_where_the_profile_allows_them():
    runner = {**PROFILES["runner"].shapes, "max_requests": 3}  # fewer requests: faster drawing
    assert _aimed_long(_drawn(**runner, kinds=IN_CALL), "cancel-in-call") > 0.35
    assert _aimed_long(_drawn(**runner, kinds=("cancel",)), "cancel") < 0.25  # other kinds: only the rare long one
    assert _aimed_long(_drawn(kinds=IN_CALL), "cancel-in-call") == 0  # no long prompts in the profile: none
