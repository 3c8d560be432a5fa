"""How fast the target is, measured once per run, and the waits that scale with it.

"Stuck" is a judgement about time, and a fixed sub-second wait calls a slow
target stuck: a server in wait-admission mode answered at 0.48 s a request
the fuzzer had called stalled at 0.4 s. So the run measures the target on its
request-free baseline (the greedy follow-up's time per token: one decode step,
prefill included) and how long the engine took to start (a server: until it
answered), and derives the driver's liveness waits from them:

- in-process, "stalled" still needs every thread parked and the loop idle,
  now for at least `STEP_FACTOR` decode steps rather than three 0.1 s ticks;
- a server runs in another process, where parked threads cannot be seen, so
  only "no progress at all" counts, for `stall_s`: room for every token a
  scenario may ask for, `STEP_FACTOR` times over, plus the startup time (a
  server may load lazily), never less than the driver's default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from mlx_invariants.fuzz.driver import TICK_S, DriverSettings
from mlx_invariants.fuzz.trace import Trace

STEP_FACTOR = 20          # decode steps of silence before in-process quiescence counts as a stall
MAX_SCENARIO_TOKENS = 40  # three requests of up to 10 tokens (fuzz.strategies) and the follow-up


@dataclass(frozen=True)
class Pace:
    step_s: float = 0.0      # one greedy decode step, measured on the baseline's follow-up
    startup_s: float = 0.0   # the engine's start (a server: until it answered)

    def to_json(self) -> dict:
        return {"step_s": round(self.step_s, 4), "startup_s": round(self.startup_s, 3)}


def measure(baseline: Trace, startup_s: float = 0.0) -> Pace:
    """The pace seen on the baseline trace: the follow-up's time from submit to end per token."""
    submit = baseline.first("request", "submit", "followup")
    ends = baseline.of("request", "end", "followup")
    if submit is None or not ends:
        return Pace(startup_s=startup_s)
    tokens = max(int(ends[-1].info.get("tokens") or 0), 1)
    return Pace(step_s=max(ends[-1].t - submit.t, 0.0) / tokens, startup_s=startup_s)


def driver_settings(base: DriverSettings, pace: Pace, remote: bool) -> tuple[DriverSettings, str]:
    """`base` with its liveness waits scaled to `pace`, and one phrase saying what they scaled with
    (stalled headlines quote it). `remote`: the engine runs in another process (an HTTP target)."""
    base = replace(base, step_s=pace.step_s)  # what compute after a gone client is measured in
    quiet_ticks = max(base.quiet_ticks, math.ceil(STEP_FACTOR * pace.step_s / TICK_S))
    steps = f"{pace.step_s * 1000:.1f} ms per decode step"
    if not remote:
        quiet_s = quiet_ticks * TICK_S
        return replace(base, quiet_ticks=quiet_ticks), f"{quiet_s:.1f}s of quiet ({STEP_FACTOR} steps at {steps})"
    stall_s = max(base.stall_s, STEP_FACTOR * MAX_SCENARIO_TOKENS * pace.step_s + pace.startup_s)
    # Parked threads cannot be seen in another process: only "no progress for stall_s" counts there.
    settings = replace(base, quiet_ticks=math.ceil(stall_s / TICK_S) + 1, stall_s=stall_s)
    return settings, (f"{stall_s:.1f}s ({STEP_FACTOR}x{MAX_SCENARIO_TOKENS} steps at {steps}, "
                      f"plus {pace.startup_s:.1f}s startup)")
