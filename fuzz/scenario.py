"""A scenario as plain data: requests, faults aimed at named points, and the executor policy.

Everything here round-trips through JSON, so a failing case is a file that
`invariants fuzz --replay FILE` runs again without Hypothesis. Points and fault
kinds travel by name (`"BEFORE_DECODE"`, `"cancel-twice"`), as files written
before either was an enum do.

The vocabularies are declared once: points in `mlx_invariants.points.Point`
(shared with the engine), fault kinds in `FaultKind` below; the name sets the
rest of the fuzzer uses (`POINTS`, `RAISE_POINTS`, `FAULT_KINDS`,
`VICTIM_KINDS`, ...) are derived from those declarations, and docs/fuzz-reference.md's
tables are generated from them (ci/fuzz_docs.py).
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from mlx_invariants.points import Point, Side

# Simplest first: Hypothesis shrinks towards the front of each list.
POINTS: tuple[str, ...] = tuple(p.name for p in Point if p.engine_marks)
# Points the engine marks on its owner thread: the fuzzer pauses the worker there.
OWNER_POINTS: frozenset[str] = frozenset(p.name for p in Point if p.side is Side.OWNER)
# Points inside the worker's MLX work: where a "raise" fault stands for an MLX error.
RAISE_POINTS: frozenset[str] = frozenset(p.name for p in Point if p.may_raise)
# Points only an HTTP client reaches (fuzz/adapters/http.py): a server-side MLX entry seen while waiting
# for the response, half the request body sent. Drawn for HTTP targets only.
CLIENT_POINTS: tuple[str, ...] = tuple(p.name for p in Point if p.side is Side.CLIENT)
INDEXED_POINTS: frozenset[str] = frozenset(p.name for p in Point if p.indexed)
# Points a client of a server reaches: where a worker fault against a launched server is armed in its
# sentinel, to fire at the server's next MLX call (fuzz/worker_switch.py).
SERVER_POINTS: frozenset[str] = frozenset(p.name for p in Point if p.over_http)
# Points marked once the request they name has ended: a late arrival aimed there is sent only after the engine
# settled (fuzz/driver.py), or it would always beat the owner to its idle check.
AFTER_END_POINTS: frozenset[str] = frozenset({Point.OWNER_IDLE.name})


class Delivery(enum.Enum):
    """Who delivers a fault once its point is reached (fuzz/faults.py's `Injector` sorts them by this)."""

    LOOP = "loop"          # `ScenarioRun._deliver`'s table, on the event loop (an owner-side worker waits)
    WORKER = "worker"      # the injector raises it in the worker at the point (owner side only)
    IN_CALL = "in-call"    # the worker goes on into its MLX call; the loop then delivers a plain cancel


class FaultKind(enum.Enum):
    """What a fault does when its point is reached. Simplest first: shrinking moves towards the front."""

    # value, hits a client (may take a victim), delivery, aimed at servers, only at `Point.may_raise`, doc
    CANCEL = ("cancel", True, Delivery.LOOP, True, False,
              "cancels the request's client task (a client that goes away); over HTTP the client disconnects")
    ABORT = ("abort", True, Delivery.LOOP, False, False,
             "calls the handle's `abort()` (deferred until `submit` returned); an acknowledged abort must stop "
             "decoding and never complete")
    DISCONNECT = ("disconnect", True, Delivery.LOOP, True, False,
                  "cancels the client task and ends the request as disconnected (the client takes the cancel "
                  "itself, as a server's handler does when its socket closes)")
    CANCEL_TWICE = ("cancel-twice", True, Delivery.LOOP, False, False,
                    "a cancel, then a second one once the loop went idle (the first has been taken): a drain "
                    "that survives one cancel but not two lets go early; at a loop-side point of an in-process "
                    "engine the first lands as cancel-in-call's does, once any thread but the loop's entered MLX "
                    "(or the request ended), so there is work for the drain to wait for")
    RAISE = ("raise", False, Delivery.WORKER, False, True,
             "raises `InjectedFault` out of the hook in the worker, standing for an exception inside the MLX "
             "call at that spot; the engine must end that request with a clear error and go on")
    WORKER_DIES = ("worker-dies", False, Delivery.WORKER, False, True,
                   "raises `WorkerKilled` (a `BaseException`, past every per-request `except Exception`) out of "
                   "the hook in the worker, so the owner/generation thread dies as with an uncaught bug; every "
                   "request in flight must then end and every new one be refused or fail, none may hang; in a "
                   "launched server, reached at any of its points, it is armed in the injected sentinel and raised "
                   "out of the server's next MLX call")
    WORKER_WEDGES = ("worker-wedges", False, Delivery.WORKER, False, True,
                     "blocks the worker in the hook, standing for an MLX call that never returns (a deadlock "
                     "inside `eval`), until the scenario's requests have ended or stalled; within the engine's "
                     "declared stall bound (the adapter's `stall_timeout_s`) every request in flight must end, "
                     "new ones be refused and its health stop answering healthy; in a launched server, reached at any "
                     "of its points, it is armed in the injected sentinel and blocks the server's next MLX call")
    SHUTDOWN = ("shutdown", False, Delivery.LOOP, False, False,
                "starts the adapter's `shutdown()` in a task; every request must then end and nothing may be "
                "left waiting, running or alive")
    CANCEL_IN_CALL = ("cancel-in-call", True, Delivery.IN_CALL, False, False,
                      "a cancel that never pauses the worker: at an owner-side point before MLX work it lands "
                      "once the sentinel saw the worker enter its next MLX call, so the task unwinds while the "
                      "call runs; at a loop-side point of an in-process engine, once any thread but the loop's "
                      "entered MLX (or the request ended); elsewhere, or aimed at another request, a plain "
                      "cancel at once")
    RESTART = ("restart", False, Delivery.LOOP, False, False,
               "in-process targets only: shuts the engine down (checked as after any shutdown) and starts it "
               "again through the adapter's `start()`; later arrivals, the follow-up and the status check meet "
               "the second run, so a lock or flag a stop left behind is found")

    def __new__(cls, value: str, victim: bool, delivery: Delivery, over_http: bool, inside_mlx: bool,
                doc: str) -> "FaultKind":
        member = object.__new__(cls)
        member._value_ = value
        member.victim = victim          # acts on one request's client, so it may hit another one (FaultSpec.rid)
        member.delivery = delivery
        member.over_http = over_http    # aimed at a server by default (its client can do it)
        member.inside_mlx = inside_mlx  # only at points inside the worker's MLX work (RAISE_POINTS)
        member.doc = doc
        return member

    @property
    def pauses(self) -> bool:
        """Whether an owner-side worker waits at the point while the loop delivers it."""
        return self.delivery is Delivery.LOOP


FAULT_KINDS: tuple[str, ...] = tuple(k.value for k in FaultKind)
# Kinds drawn only when asked for (`invariants fuzz --faults`, `Target(fault_kinds=...)`): they kill or wedge
# the engine's worker thread, a bar an engine may fairly not be built to (none of the false-alarm benchmark's
# correct engines is measured against it yet), so a default run never fails an engine for it.
OPT_IN_KINDS: frozenset[str] = frozenset({FaultKind.WORKER_DIES.value, FaultKind.WORKER_WEDGES.value})
WORKER_FAULTS: tuple[str, ...] = (FaultKind.WORKER_DIES.value, FaultKind.WORKER_WEDGES.value)  # the owner is lost


def aimable(kind: str, point: str, armed: bool = True) -> bool:
    """Whether a fault of `kind` may be aimed at `point`: a fault inside MLX only at `RAISE_POINTS`, where the
    worker runs the hook, or, for a worker fault with `armed` (a launched server's sentinel arms it), at
    any point a server scenario has."""
    if not FaultKind(kind).inside_mlx:
        return True
    return point in RAISE_POINTS or (armed and kind in WORKER_FAULTS and point in SERVER_POINTS)
DEFAULT_KINDS: tuple[str, ...] = tuple(k for k in FAULT_KINDS if k not in OPT_IN_KINDS)
# Kinds that act on one request's client: they may hit another request than the one whose point triggers
# them (`FaultSpec.rid`). The others act on the engine or the worker at the point.
VICTIM_KINDS: frozenset[str] = frozenset(k.value for k in FaultKind if k.victim)
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
    # What else the client asks for, in the reference engine's terms (`engine.SamplingParams`); the defaults
    # are the plain greedy request, which is all a scenario file written before these fields asks for.
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    stop: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        """Its tokens are the likeliest ones, so the same request on the same engine answers the same."""
        return self.temperature == 0

    def asks(self) -> str:
        """The fields it sets beyond the plain greedy request, as `describe()` shows them ("" if none)."""
        shown = [f"t{self.temperature:g}" if self.temperature else "",
                 f"top_p{self.top_p:g}" if self.top_p != 1.0 else "",
                 f"seed{self.seed}" if self.seed is not None else "",
                 f"logprobs{self.top_logprobs or ''}" if self.logprobs or self.top_logprobs else "",
                 f"stop{list(self.stop)}" if self.stop else ""]
        return " ".join(part for part in shown if part)


# A request's fields past `arrival`, left out of its JSON at these values (an old file's request reads the same).
SURFACE_DEFAULTS: dict[str, Any] = {"temperature": 0.0, "top_p": 1.0, "seed": None, "logprobs": False,
                                    "top_logprobs": 0, "stop": ()}
MAX_STOPS = 4  # stop strings a request may carry (OpenAI's limit, the reference server's too)


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
            f"{' ' + r.route if r.route != 'completions' else ''}{' ' + r.asks() if r.asks() else ''}"
            f"{' after ' + str(r.arrival) if r.arrival else ''})"
            for r in self.requests)
        faults = "; ".join(str(f) for f in self.faults) or "no faults"
        return f"[{reqs}] {faults} executor={self.executor}{' debug' if self.debug else ''}"

    # -- JSON -----------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for request in data["requests"]:
            for name, default in SURFACE_DEFAULTS.items():
                if request[name] == default or (name == "stop" and not request[name]):
                    del request[name]  # the plain request: the file reads as one written before these fields
            if "stop" in request:
                request["stop"] = list(request["stop"])
        for fault in data["faults"]:
            if fault["rid"] is None:
                del fault["rid"]  # same request: the file reads as one written before victims existed
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Scenario":
        if "scenario" in data and "requests" not in data:
            data = data["scenario"]  # a report.json names its scenario
        requests = tuple(
            RequestSpec(**{**r, "arrival": At(**r["arrival"]) if r.get("arrival") else None,
                           "stop": tuple(r.get("stop") or ())})
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
            _check_surface(request)
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
            if not aimable(fault.kind, fault.at.point):
                where = sorted(RAISE_POINTS) + (sorted(SERVER_POINTS) if fault.kind in WORKER_FAULTS else [])
                raise ValueError(f"{fault}: a {fault.kind} fault needs one of {where}")


def _check_surface(request: RequestSpec) -> None:
    """The sampling, log-probability and stop fields within what the reference server accepts."""
    if not 0 <= request.temperature <= 2 or not 0 < request.top_p <= 1:
        raise ValueError(f"{request.rid}: temperature must be in 0..2 and top_p in (0, 1]")
    if request.seed is not None and (isinstance(request.seed, bool) or not isinstance(request.seed, int)
                                     or request.seed < 0):
        raise ValueError(f"{request.rid}: seed must be a whole number from 0, or null")
    if request.top_logprobs < 0 or (request.top_logprobs and not request.logprobs):
        raise ValueError(f"{request.rid}: top_logprobs must be at least 0, and above 0 only with logprobs")
    if len(request.stop) > MAX_STOPS or not all(isinstance(s, str) and s for s in request.stop):
        raise ValueError(f"{request.rid}: stop must be up to {MAX_STOPS} non-empty strings")


def _check_at(at: At, rids: list[str]) -> None:
    if at.rid not in rids:
        raise ValueError(f"{at} names no request of this scenario")
    if at.point not in POINTS + CLIENT_POINTS:
        raise ValueError(f"{at}: point must be one of {POINTS + CLIENT_POINTS}")
