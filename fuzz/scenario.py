"""A scenario as plain data: requests, faults aimed at named points, and the executor policy.

Everything here round-trips through JSON, so a failing case is a file that
`invariants fuzz --replay FILE` runs again without Hypothesis.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

POINTS: tuple[str, ...] = (
    "ADMITTED", "SLOT_ACQUIRED", "WORKER_STARTED", "PREFILL_DONE",
    "BEFORE_DECODE", "CHUNK_SENT", "FINISHED", "SLOT_RELEASED",
)
# Points the engine marks on its owner thread: the fuzzer pauses the worker there.
OWNER_POINTS: frozenset[str] = frozenset({"WORKER_STARTED", "PREFILL_DONE", "BEFORE_DECODE", "FINISHED"})
# Points inside the worker's MLX work: where a "raise" fault stands for an MLX error.
RAISE_POINTS: frozenset[str] = frozenset({"WORKER_STARTED", "PREFILL_DONE", "BEFORE_DECODE"})
# Points only an HTTP client reaches (fuzz/adapters/http.py): a server-side MLX entry seen while waiting
# for the response, half the request body sent. Drawn for HTTP targets only.
CLIENT_POINTS: tuple[str, ...] = ("SERVER_STEP", "BODY_PART")
INDEXED_POINTS: frozenset[str] = frozenset({"BEFORE_DECODE", "CHUNK_SENT", "SERVER_STEP"})
# Simplest first: Hypothesis shrinks towards the front of each list.
FAULT_KINDS: tuple[str, ...] = ("cancel", "abort", "disconnect", "cancel-twice", "raise", "shutdown",
                               "cancel-in-call", "restart")
# Kinds that act on one request's client: they may hit another request than the one whose point triggers
# them (`FaultSpec.rid`). The others act on the engine or the worker at the point.
VICTIM_KINDS: frozenset[str] = frozenset({"cancel", "abort", "disconnect", "cancel-twice", "cancel-in-call"})
EXECUTORS: tuple[str, ...] = ("owner", "alternate", "pool")
ROUTES: tuple[str, ...] = ("completions", "chat")


@dataclass(frozen=True)
class At:
    """A named point of one request; `index` is the decode step or chunk number where it has one."""

    rid: str
    point: str
    index: int = 0

    def __str__(self) -> str:
        suffix = f"({self.index})" if self.point in INDEXED_POINTS else ""
        return f"{self.rid}@{self.point}{suffix}"


@dataclass(frozen=True)
class RequestSpec:
    """One client request. `arrival` None: sent at the start; else when that point is reached
    (or, if it never is, once every earlier request has ended)."""

    rid: str
    prompt_len: int = 4
    max_tokens: int = 8
    stream: bool = True
    route: str = "completions"
    arrival: At | None = None


@dataclass(frozen=True)
class FaultSpec:
    """`kind` delivered when `at` is reached: on the loop, while an owner-side worker waits.

    `rid` names the request it hits when that is not the one at `at` (None: the same one): one request's
    point is then the moment another is cancelled, e.g. while that other one waits in the engine's
    admission queue, where it reaches no point of its own. Only `VICTIM_KINDS` take one."""

    kind: str
    at: At
    rid: str | None = None

    @property
    def victim(self) -> str:
        return self.rid or self.at.rid

    def __str__(self) -> str:
        victim = f" {self.rid}" if self.rid and self.rid != self.at.rid else ""
        return f"{self.kind}{victim} at {self.at}"


@dataclass(frozen=True)
class Scenario:
    requests: tuple[RequestSpec, ...]
    faults: tuple[FaultSpec, ...] = ()
    executor: str = "owner"
    followup: bool = True
    debug: bool = False  # run the loop in asyncio debug mode
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def describe(self) -> str:
        reqs = ", ".join(
            f"{r.rid}(p{r.prompt_len} m{r.max_tokens}{' stream' if r.stream else ''}"
            f"{' ' + r.route if r.route != 'completions' else ''}{' after ' + str(r.arrival) if r.arrival else ''})"
            for r in self.requests)
        faults = "; ".join(str(f) for f in self.faults) or "no faults"
        return f"[{reqs}] {faults} executor={self.executor}{' debug' if self.debug else ''}"

    # -- JSON -----------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for fault in data["faults"]:
            if fault["rid"] is None:
                del fault["rid"]  # same request: the file reads as one written before victims existed
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Scenario":
        if "scenario" in data and "requests" not in data:
            data = data["scenario"]  # a report.json names its scenario
        requests = tuple(
            RequestSpec(**{**r, "arrival": At(**r["arrival"]) if r.get("arrival") else None})
            for r in data["requests"])
        faults = tuple(FaultSpec(f["kind"], At(**f["at"]), f.get("rid")) for f in data.get("faults", ()))
        scenario = cls(requests, faults, data.get("executor", "owner"), data.get("followup", True),
                       data.get("debug", False), dict(data.get("meta", {})))
        scenario.validate()
        return scenario

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)

    @classmethod
    def loads(cls, text: str) -> "Scenario":
        return cls.from_json(json.loads(text))

    def validate(self) -> None:
        """Raise ValueError naming the first field a hand-edited scenario file got wrong."""
        rids = [r.rid for r in self.requests]
        if len(set(rids)) != len(rids):
            raise ValueError(f"request ids must be unique, got {rids}")
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {self.executor!r}")
        for request in self.requests:
            if request.max_tokens < 1 or request.prompt_len < 1:
                raise ValueError(f"{request.rid}: prompt_len and max_tokens must be at least 1")
            if request.route not in ROUTES:
                raise ValueError(f"{request.rid}: route must be one of {ROUTES}")
            if request.arrival:
                _check_at(request.arrival, rids)
        for fault in self.faults:
            if fault.kind not in FAULT_KINDS:
                raise ValueError(f"fault kind must be one of {FAULT_KINDS}, got {fault.kind!r}")
            _check_at(fault.at, rids)
            if fault.rid is not None and fault.rid not in rids:
                raise ValueError(f"{fault}: its victim {fault.rid!r} names no request of this scenario")
            if fault.rid is not None and fault.kind not in VICTIM_KINDS:
                raise ValueError(f"{fault}: only {sorted(VICTIM_KINDS)} hit a request; a {fault.kind} takes no rid")
            if fault.kind == "raise" and fault.at.point not in RAISE_POINTS:
                raise ValueError(f"{fault}: a raise fault needs one of {sorted(RAISE_POINTS)}")


def _check_at(at: At, rids: list[str]) -> None:
    if at.rid not in rids:
        raise ValueError(f"{at} names no request of this scenario")
    if at.point not in POINTS + CLIENT_POINTS:
        raise ValueError(f"{at}: point must be one of {POINTS + CLIENT_POINTS}")
