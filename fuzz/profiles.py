"""The `ci` and `runner` profiles: how many examples, how long, which Hypothesis database.

`ci` is what the default pytest run and a Linux CPU job use: derandomized, no
example database, a few hundred examples, plus one asyncio debug-mode run.
`runner` is for Apple Silicon and GPU runners: random seeds, a shared example
database (so failures found once are tried first next time), and a long
budget. Both draw scenarios past the engine's capacity (`requests_for`):
up to `PAST_CAPACITY` more requests than it holds at once, slots and queue,
as the adapter's `capacity()` or `invariants fuzz --capacity` says (at most
`MOST_REQUESTS`; a target holding more than the profile's `max_requests` has one
scenario in four filled past its capacity, `Requests.crowd`); where neither says,
up to the profile's `max_requests`,
chosen past the simple engine's one slot and queue of four. `runner` also
draws, now and then, prompts and budgets of hundreds of tokens (the tiny
model's context is 1024 tokens; a prompt word is about two), which `ci`
leaves out to stay fast. Both reuse one engine across scenarios that leave
it clean (`reuse_engine`); `invariants fuzz --fresh-engine` turns that off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class Profile:
    name: str
    derandomize: bool
    examples: int           # default example count per run
    budget_s: float         # default wall-clock budget
    round_examples: int     # examples per Hypothesis round (each round a new seed unless derandomized)
    debug_run: bool         # one extra scenario on an asyncio debug-mode loop
    database: bool
    reuse_engine: bool = True  # keep one engine across scenarios that leave it clean (False: fresh each)
    max_requests: int = 6      # requests per scenario, at most, when the target's capacity is unknown
    long_prompt: int = 0       # a rare long prompt has up to this many words (0: none longer than short)
    long_tokens: int = 0       # a rare long budget has up to this many tokens (0: none longer than short)
    purpose: str = ""          # who it is for, in a few words

    @property
    def shapes(self) -> dict[str, int]:
        """The `fuzz.strategies.scenarios()` arguments this profile sets."""
        return {"max_requests": self.max_requests, "long_prompt": self.long_prompt, "long_tokens": self.long_tokens}

    def describe(self) -> str:
        """What the profile does, in one line (`invariants fuzz --help` lists these)."""
        seeds = ("derandomized, later rounds on fixed seeds" if self.derandomize
                 else "random seeds (recorded)")
        from mlx_invariants.fuzz.database import shown  # a Redis URL's password is never printed

        database = (f"example database {shown(self.database_path() or '')} (MLX_INVARIANTS_FUZZ_DB or --database), "
                    "earlier failures first" if self.database else "no example database")
        long = (f"; now and then prompts of up to {self.long_prompt} words and {self.long_tokens} tokens"
                if self.long_prompt or self.long_tokens else "")
        cap = f"{self.examples} examples or " if self.examples < UNBOUNDED else ""
        return (f"{self.purpose}: {seeds}; {cap}{self.budget_s:g}s unless --budget/--examples say; {database}; "
                f"up to {self.max_requests} requests when the capacity is unknown{long}"
                + ("; one asyncio debug-mode run" if self.debug_run else ""))

    def database_path(self) -> Optional[str]:
        if not self.database:
            return None
        return os.environ.get("MLX_INVARIANTS_FUZZ_DB", os.path.join(".hypothesis", "mlx-invariants"))


UNBOUNDED = 1_000_000   # an example count that means "no cap" (the budget ends the run)
PAST_CAPACITY = 2    # requests drawn beyond what the target holds at once
MOST_REQUESTS = 64   # ... but never more than this many in one scenario, to stay fast


@dataclass(frozen=True)
class Requests:
    """How many requests a scenario draws at most, and why: `capacity` is what the target holds at once,
    `source` where that came from ("given": --capacity; "engine": the adapter's `capacity()`; "unknown":
    neither, so the profile's number)."""

    most: int
    capacity: Optional[int]
    source: str

    def describe(self) -> str:
        if self.capacity is None:
            return f"up to {self.most} requests per scenario (capacity unknown: the profile's number)"
        origin = "given with --capacity" if self.source == "given" else "read from the engine"
        return f"up to {self.most} requests per scenario (capacity {self.capacity}, {origin})"

    def crowd(self, usual: int) -> int:
        """How many requests a scenario is now and then filled up to (`fuzz.strategies._crowd`): one past
        the capacity, where the target holds `usual` (the profile's number) or more, which drawn lists of a
        handful of requests seldom reach; else 0, none."""
        return self.capacity + 1 if self.capacity is not None and self.capacity >= usual else 0

    def to_json(self) -> dict[str, Any]:
        return {"most": self.most, "capacity": self.capacity, "source": self.source}


def requests_for(profile: Profile, given: Optional[int], engine: Optional[int]) -> Requests:
    """Past the capacity `given` (it wins) or read from the `engine`, else the profile's `max_requests`."""
    capacity, source = (given, "given") if given is not None else (engine, "engine")
    if capacity is None:
        return Requests(profile.max_requests, None, "unknown")
    return Requests(min(capacity + PAST_CAPACITY, MOST_REQUESTS), capacity, source)


PROFILES: dict[str, Profile] = {
    "ci": Profile("ci", derandomize=True, examples=300, budget_s=120.0, round_examples=300, debug_run=True,
                  database=False, purpose="pytest and CPU CI jobs, fast and repeatable"),
    "runner": Profile("runner", derandomize=False, examples=UNBOUNDED, budget_s=3600.0, round_examples=50,
                      debug_run=True, database=True, max_requests=10, long_prompt=300, long_tokens=200,
                      purpose="Apple Silicon and GPU runners, long and varied"),
}


PROFILE_DATABASE: Any = object()   # `hypothesis_settings(database=...)`: the profile's own (a directory or none)
SEARCH = ("explicit", "reuse", "generate")   # the Hypothesis phases of a round, before shrinking
STEER = "target"   # and after them, when asked (`--steer`): climbs towards `fuzz.steering`'s distances


def search_phases(derandomize: bool, replayed: bool, steer: bool = False) -> tuple[str, ...]:
    """A search round's Hypothesis phases before shrinking: `SEARCH`, less "reuse" where a replay round ran
    the database's failures already, then `STEER` if asked and the round is not derandomized (steering
    follows the timings each example measured, and a derandomized round must draw the same every run)."""
    phases = tuple(phase for phase in SEARCH if not (replayed and phase == "reuse"))
    return phases + (STEER,) if steer and not derandomize else phases


def hypothesis_settings(profile: Profile, max_examples: int, derandomize: Optional[bool] = None,
                        shrink: bool = True, *, database: Any = PROFILE_DATABASE,
                        phases: tuple[str, ...] = SEARCH) -> Any:
    """Hypothesis settings for one round of `profile`: `database` an example database (None: none; by
    default the profile's, opened lazily), `phases` the names of the Hypothesis phases before shrinking.
    A derandomized round has no database (Hypothesis's rule), whatever is given."""
    from hypothesis import HealthCheck, Phase, settings

    derandomize = profile.derandomize if derandomize is None else derandomize
    if database is PROFILE_DATABASE:
        from mlx_invariants.fuzz.database import open_database

        path = profile.database_path()
        database = open_database(path, check=False) if path else None
    return settings(
        max_examples=max_examples,
        derandomize=derandomize,
        database=None if derandomize else database,
        deadline=None,
        print_blob=True,
        report_multiple_bugs=False,
        phases=tuple(Phase[name] for name in phases) + ((Phase.shrink,) if shrink else ()),
        suppress_health_check=list(HealthCheck),
    )


def register_hypothesis_profiles() -> None:
    """Make `--hypothesis-profile=ci|runner` work for tests that use `scenarios()` directly."""
    from hypothesis import settings

    for profile in PROFILES.values():
        settings.register_profile(profile.name, hypothesis_settings(profile, min(profile.examples, 1000)))
