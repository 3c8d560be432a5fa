"""How long and how to fuzz, as one value: `FuzzSettings`, which travels to child processes as JSON.

Everything `invariants fuzz` passes to a run is here, so a child process runs
exactly what the parent was asked for (`--replays`, `--strict`, `--fresh-engine`
included). The target (what is fuzzed) is the other half: `fuzz.target`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

from mlx_invariants.fuzz.defaults import CONFIRM, REPLAYS, SHRINK_S
from mlx_invariants.fuzz.errors import SettingsError
from mlx_invariants.fuzz.profiles import PROFILES
from mlx_invariants.fuzz.scenario import Scenario


@dataclass(frozen=True)
class FuzzSettings:
    """None means "the profile's" (budget, examples, reuse, debug run) or "none" (seed, report, workdir).

    A budget given without examples is wall time alone: the profile's example
    cap applies only when neither is given. `explicit` scenarios run first
    (None: the seed-bug corpus, `fuzz.corpus`; `()` measures what generation
    alone finds). `shrink=False` keeps each failure as found. `reuse=False`
    starts a fresh engine for every scenario. Each scenario is written to
    `workdir/current.json` before it runs, so a process that dies inside MLX
    leaves it behind.

    A new finding is re-run `replays` times on fresh engines and counts only if
    `confirm` of them show it again (or its oracle is exact, see
    `oracles.EXACT_KINDS`); `replays=0` counts everything. `keep_going` searches
    on after a finding until the budget ends; `baseline` holds the signatures
    of accepted findings (`fuzz.baseline`). With `report_dir`, the run folder
    (`fuzz.evidence`) is written under it, or at `run_dir` if that is given.
    `capacity` is how many requests the target holds at once (slots and queue),
    overriding what its adapter says: scenarios draw past it
    (`fuzz.profiles.requests_for`); a server's is unknown unless given.
    `database` is the Hypothesis example database, a directory or a Redis URL
    (`fuzz.database`; None: the profile's), whose failures for this target are
    replayed before anything else; `database_readonly` reads it and writes nothing
    (with no database at all, as a fork's pull request without the fleet's secret, it has nothing to do).
    """

    profile: str = "ci"
    budget_s: Optional[float] = None
    examples: Optional[int] = None
    seed: Optional[int] = None
    replays: int = REPLAYS
    confirm: int = CONFIRM
    keep_going: bool = False
    baseline: tuple[str, ...] = ()
    shrink_s: float = SHRINK_S
    shrink: bool = True
    reuse: Optional[bool] = None
    debug_run: Optional[bool] = None
    strict: bool = False              # the sentinel refuses bad MLX entries (raises) instead of recording only
    steer: bool = False               # end each round that is not derandomized in Hypothesis's target phase
    capacity: Optional[int] = None    # requests the target holds at once; None: as its adapter says, if it does
    database: Optional[str | Path] = None  # a directory or a Redis URL; None: the profile's (runner's directory, ci's none)
    database_readonly: bool = False   # read the database, write nothing (pull-request runs of a shared one)
    explicit: Optional[tuple[Scenario, ...]] = None
    report_dir: Optional[str | Path] = None
    workdir: Optional[str | Path] = None
    run_dir: Optional[str | Path] = None

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise SettingsError(f"profile must be one of {sorted(PROFILES)}, got {self.profile!r}")
        if self.examples is not None and self.examples < 1:
            raise SettingsError(f"examples must be at least 1, got {self.examples}")
        if self.budget_s is not None and self.budget_s <= 0:
            raise SettingsError(f"the budget must be a positive number of seconds, got {self.budget_s}")
        if self.replays < 0 or self.shrink_s < 0:
            raise SettingsError("replays and the shrink time must not be negative")
        if self.confirm < 1:
            raise SettingsError(f"confirm must be at least 1 replay, got {self.confirm}")
        if self.capacity is not None and (isinstance(self.capacity, bool) or not isinstance(self.capacity, int)
                                          or self.capacity < 1):
            raise SettingsError(f"the capacity must be a positive number of requests, got {self.capacity!r}")
        if self.database is not None and (not isinstance(self.database, (str, Path)) or not str(self.database)):
            raise SettingsError(f"the database must be a directory or a Redis URL, got {self.database!r}")
        # Normalized in place (the dataclass is frozen): folders may be given as Paths, scenarios as any iterable.
        object.__setattr__(self, "baseline", tuple(self.baseline))
        for name in ("report_dir", "workdir", "run_dir", "database"):
            if isinstance(getattr(self, name), Path):
                object.__setattr__(self, name, str(getattr(self, name)))
        if self.explicit is not None:
            object.__setattr__(self, "explicit", tuple(self.explicit))

    def database_path(self) -> Optional[str]:
        """The example database this run uses (a directory or a Redis URL): the one given, else the
        profile's; None: none."""
        return self.database or PROFILES[self.profile].database_path()

    # -- JSON -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.explicit is not None:
            data["explicit"] = [s.to_json() for s in self.explicit]
        data["baseline"] = list(self.baseline)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "FuzzSettings":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SettingsError(f"unknown fuzz settings {unknown}")
        values = dict(data)
        if values.get("explicit") is not None:
            values["explicit"] = tuple(Scenario.from_json(s) for s in values["explicit"])
        return cls(**values)
