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

That wall pace is generous (over HTTP it is several times the real step), so
compute after a gone client is counted in the MLX calls instead
(`fuzz.compute`): the same follow-up also says how many MLX entries one decode
step makes (`mlx_per_step`) and how long the MLX part of a step takes
(`mlx_step_s`), from the sentinel's spans. A server's spans are merged after
the fact, on its own clock, so its follow-up's are the last ones within the
follow-up's duration of the last; the prefill and a first request's warm-up
count in, which only makes a step look bigger (fewer steps counted, never more).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from mlx_invariants.fuzz.compute import GONE_TOKENS
from mlx_invariants.fuzz.driver import DriverSettings
from mlx_invariants.fuzz.liveness import TICK_S
from mlx_invariants.fuzz.profiles import PROFILES
from mlx_invariants.fuzz.trace import Event, Trace

STEP_FACTOR = 20          # decode steps of silence before in-process quiescence counts as a stall
MAX_SCENARIO_TOKENS = 40  # three requests of up to 10 tokens (fuzz.strategies) and the follow-up
GONE_DECODE_S = 1.0       # a gone client's long budget decodes about this long: past a server's disconnect poll
# ... but no more tokens than the runner profile's longest budget (which fits the tiny model's context beside its
# longest prompt: tests/fuzz/test_schedules.py)
GONE_MOST_TOKENS = PROFILES["runner"].long_tokens


@dataclass(frozen=True)
class Pace:
    step_s: float = 0.0        # one greedy decode step, measured on the baseline's follow-up
    startup_s: float = 0.0     # the engine's start (a server: until it answered)
    mlx_per_step: float = 0.0  # MLX entries per decode step on that follow-up; 0: none seen
    mlx_step_s: float = 0.0    # MLX time per decode step on it, first entry to last exit
    decode_s: float = 0.0      # steady MLX time per step on it: its median MLX entry times entries per step

    def to_json(self) -> dict:
        return {"step_s": round(self.step_s, 4), "startup_s": round(self.startup_s, 3),
                "mlx_per_step": round(self.mlx_per_step, 3), "mlx_step_s": round(self.mlx_step_s, 5),
                "decode_s": round(self.decode_s, 5)}


def measure(baseline: Trace, startup_s: float = 0.0) -> Pace:
    """The pace seen on the baseline trace: the follow-up's time from submit to end per token, and its MLX
    entries and MLX time per token."""
    submit = baseline.first("request", "submit", "followup")
    ends = baseline.of("request", "end", "followup")
    if submit is None or not ends:
        return Pace(startup_s=startup_s)
    tokens = max(int(ends[-1].info.get("tokens") or 0), 1)
    spans = followup_spans(baseline, submit, ends[-1])
    mlx_s = max(e.t_end or e.t for e in spans) - min(e.t for e in spans) if spans else 0.0
    # The median entry, not first entry to last exit: a fresh server's prefill and first-use compiles are one or
    # two long entries among the decode steps' short ones.
    durations = sorted((e.t_end or e.t) - e.t for e in spans)
    decode_s = durations[len(durations) // 2] * len(spans) / tokens if len(durations) >= 3 else 0.0
    return Pace(step_s=max(ends[-1].t - submit.t, 0.0) / tokens, startup_s=startup_s,
                mlx_per_step=len(spans) / tokens, mlx_step_s=mlx_s / tokens, decode_s=decode_s)


def gone_budget(pace: Pace) -> int:
    """The budget a request whose client goes away draws now and then (`fuzz.strategies._outlast`): past the
    compute oracle's bound (`GONE_TOKENS`), and about `GONE_DECODE_S` of decoding where the pace was measured,
    so a server that notices a gone client only at its next poll (vllm-mlx's every 0.5 s) is still decoding
    when it polls. Counted in steady MLX time per step (`decode_s`) where the follow-up made three MLX entries,
    else in its MLX time per step, else in the wall pace (over HTTP several times the step, and a server may hand
    its tokens on slower than it makes them: mlx-openai-server's stream came at 0.22 s a chunk while its worker
    decoded at 4 ms a token). MLX time from first entry to last exit spreads a fresh server's prefill and
    first-use compiles over the follow-up's few tokens: that server measured 0.08 to 0.12 s a step so, and drew
    10 to 12 tokens where a second of its decoding is 200. At most `GONE_MOST_TOKENS`."""
    step_s = pace.decode_s or pace.mlx_step_s or pace.step_s
    paced = math.ceil(GONE_DECODE_S / step_s) if step_s > 0 else 0
    return max(GONE_TOKENS, min(paced, GONE_MOST_TOKENS))


def followup_spans(trace: Trace, submit: Event, end: Event) -> list[Event]:
    """The MLX spans the follow-up caused: a launched server's (merged, on its clock: the last ones within
    the follow-up's duration of the last exit), else this process's between its submit and its end."""
    merged = trace.meta.get("merged", [])
    spans = trace.of("mlx")
    remote = [e for e in spans if any(lo <= e.seq <= hi for lo, hi in merged)]
    if not remote:
        return [e for e in spans if submit.seq < e.seq < end.seq]
    last = max(e.t_end or e.t for e in remote)
    return [e for e in remote if e.t >= last - (end.t - submit.t)]


def driver_settings(base: DriverSettings, pace: Pace, remote: bool) -> tuple[DriverSettings, str]:
    """`base` with its liveness waits scaled to `pace`, and one phrase saying what they scaled with
    (stalled headlines quote it). `remote`: the engine runs in another process (an HTTP target)."""
    # What compute after a gone client is counted in, and how long the watch for it waits (fuzz.compute).
    base = replace(base, step_s=pace.step_s, mlx_per_step=pace.mlx_per_step, mlx_step_s=pace.mlx_step_s)
    quiet_ticks = max(base.quiet_ticks, math.ceil(STEP_FACTOR * pace.step_s / TICK_S))
    steps = f"{pace.step_s * 1000:.1f} ms per decode step"
    if not remote:
        # The no-progress backstop scales too: one long MLX call (a prefill on a loaded GPU) records nothing
        # until it returns, and must not read as a thread that spins.
        stall_s = max(base.stall_s, STEP_FACTOR * MAX_SCENARIO_TOKENS * pace.step_s)
        quiet_s = quiet_ticks * TICK_S
        return (replace(base, quiet_ticks=quiet_ticks, stall_s=stall_s),
                f"{quiet_s:.1f}s of quiet ({STEP_FACTOR} steps at {steps})")
    stall_s = max(base.stall_s, STEP_FACTOR * MAX_SCENARIO_TOKENS * pace.step_s + pace.startup_s)
    # Parked threads cannot be seen in another process: only "no progress for stall_s" counts there.
    settings = replace(base, quiet_ticks=math.ceil(stall_s / TICK_S) + 1, stall_s=stall_s)
    return settings, (f"{stall_s:.1f}s ({STEP_FACTOR}x{MAX_SCENARIO_TOKENS} steps at {steps}, "
                      f"plus {pace.startup_s:.1f}s startup)")
