"""What one file tells the package model: its functions, what each calls, hands to a thread
and touches in MLX, in plain values that depend on the file's text alone.

A summary names things by reference strings, resolved only when the package is known
(`graph.py`), so the same text gives the same summary wherever the file lives and a summary
can be cached by content hash:

    mlx.core.eval              an absolute dotted name (imported, or a module of the package)
    .engine.Engine             relative, as in `from .engine import Engine` (one dot per level)
    :Engine.run                defined in this file (`Engine.run`, `outer.<locals>.inner`)
    :Engine().engine.step      `()` after a part: what calling it returns (an instance of a class)
    $fn                        this function's own parameter `fn`

`to_json` gives lists and dicts only (what the result cache stores); `from_json` reads them back.

A summary never changes once made, but the classes it is made of in numbers (Place, Call, Offload,
Touch, Function) are not frozen: a frozen dataclass's `__init__` sets each field through
`object.__setattr__`, and a re-run after one edit of vllm-mlx reads 70 summaries back, some 15 000 of
these, which took over twice as long so (250 M instructions against 115 M). They hash and compare by
their fields as frozen ones do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# What a direct MLX call does (Touch.kind).
BLOCK = "block"      # runs MLX and waits for it: mx.eval, a forward pass, a model's save_weights
GEN = "generate"     # a generation: it waits too, on the generation library's own stream (mlx_facts.py)
TOUCH = "touch"      # encodes MLX work without waiting for it (mx.array, a prompt cache)
LOAD = "load"        # loads weights: start-up work
RETURNS = "returns"  # returns an MLX generator (`return stream_generate(...)`): MLX runs where it is iterated
BIND = "bind"        # gives the calling thread its own generation stream (beside the call's other kind, if any)
# A model-named attribute of this file's class called (`self.model(x)`, `self.model.generate(...)`) where the
# attribute holds an MLX object or a value the file does not name: MLX by its name alone, as the per-file rules
# judge it. Only INV125's inferred lock counts it; INV107/INV108 leave such calls to the per-file rules.
MODEL = "model"
# MLX that runs in Metal (a forward pass, an eval, a generation, a model-named call): what an inferred MLX lock
# guards (model/locks.py). Building an array outside the lock is no collision inside Metal.
METAL = frozenset({BLOCK, GEN, MODEL})

# How a call's result is used (Call.use).
PLAIN = "call"
ITERATED = "iter"    # iterated here: `for x in f()`, `next(g)` of `g = f()`, `list(f())`, `yield from f()`
RETURNED = "return"  # `return f()` from a def that is not a generator
AWAITED = "await"    # awaited where it is made (`await f()`): run by its caller's task, cancelled with it
DETACHED = "detached"  # the coroutine of a task nobody keeps (`asyncio.create_task(f())` as a statement): the
                       # loop's own shutdown is all that can cancel it

# Where an offload runs its callable (Offload.pool).
DEFAULT_POOL = "default"  # asyncio.to_thread, run_in_executor(None, ...): a different thread each call
EXECUTOR = "executor"     # an executor's submit or run_in_executor: whichever thread it has
THREAD = "thread"         # threading.Thread(target=...)
OWNER = "owner"           # an executor declared to own MLX (owner-executors): its one thread
ONE_THREAD = "one-thread"  # an executor this file builds with one worker (offload.is_owner_executor): its one thread


# The web frameworks whose app (and a request's `.app`) carries a `state` namespace: what the package stores there
# (collect.py) is what a route reads back (graph.py).
WEB_APPS = ("fastapi.", "starlette.")

@dataclass(unsafe_hash=True)
class Place:
    """Where a finding would point: 1-based line and column, and the statement's lines
    (`first`..`last`; `above`: the first comment line right above it) for suppressions."""

    line: int
    col: int
    first: int
    last: int
    above: int

    def to_json(self) -> list[int]:
        return [self.line, self.col, self.first, self.last, self.above]

    @classmethod
    def from_json(cls, data: list[int]) -> Place:
        return cls(*data)


@dataclass(unsafe_hash=True)
class Call:
    """A call in a function's own body. `args` are the arguments that name something (a
    function, a lambda, a parameter, or a call's result: `engine.stream()`), keyed by position or
    keyword: what a helper may be handed to run, or to step."""

    target: str
    text: str
    place: Place
    use: str = PLAIN
    iterated_at: Place | None = None
    args: tuple[tuple[int | str, str], ...] = ()

    def to_json(self) -> list[Any]:
        return [self.target, self.text, self.place.to_json(), self.use,
                self.iterated_at.to_json() if self.iterated_at else None, [list(a) for a in self.args]]

    @classmethod
    def from_json(cls, data: list[Any]) -> Call:
        target, text, place, use, iterated_at, args = data
        return cls(target, text, Place(*place), use, Place(*iterated_at) if iterated_at else None, tuple(map(tuple, args)))


@dataclass(unsafe_hash=True)
class Offload:
    """A callable handed to another thread. `target` is its reference (None when it cannot be
    named); `param` the parameter of this function it is, or calls (a helper that forwards);
    `serialized`: made inside `with`/`async with` a lock (lock-names); `stepped`: the generator the
    callable steps (`next` handed over with it, or a lambda or nested def that calls `next` on it or
    loops over it), as `$name` for a parameter (a helper that steps what it is handed) or as the
    reference of the call that made it (`engine.stream()`): its body runs on that thread."""

    how: str
    pool: str
    target: str | None
    param: str | None
    place: Place
    text: str  # the callable as written
    serialized: bool = False
    stepped: str | None = None
    body: str | None = None  # a lambda's body, where it is a call of a dotted name: that name as written

    def to_json(self) -> list[Any]:
        return [self.how, self.pool, self.target, self.param, self.place.to_json(), self.text, self.serialized,
                self.stepped, self.body]

    @classmethod
    def from_json(cls, data: list[Any]) -> Offload:
        how, pool, target, param, place, text, serialized, stepped, body = data
        return cls(how, pool, target, param, Place(*place), text, serialized, stepped, body)


@dataclass(unsafe_hash=True)
class Touch:
    """A direct MLX call: its kind (BLOCK, GEN, TOUCH, LOAD, RETURNS), its text (`mx.eval`), and
    where it is (INV125 points at one in a request handler)."""

    kind: str
    text: str
    line: int
    place: Place | None = None

    def to_json(self) -> list[Any]:
        return [self.kind, self.text, self.line, self.place.to_json() if self.place else None]

    @classmethod
    def from_json(cls, data: list[Any]) -> Touch:
        kind, text, line, place = data
        return cls(kind, text, line, Place(*place) if place else None)


@dataclass(unsafe_hash=True)
class Function:
    """A def, async def or lambda. `params` are those a caller passes, in order (`self` and
    `cls` of a method left out); `opaque`: a decorator may change what calling it does;
    `owner`: declared to run on the MLX owner thread (`# invariants: owner-thread` on its def
    line); `guards`: the `with <lock>:` blocks of its body, (first line, last line, the lock
    as written), for the names of lock-names and the declared MLX locks."""

    name: str
    line: int
    is_async: bool
    is_generator: bool
    params: tuple[str, ...]
    opaque: bool = False
    calls: tuple[Call, ...] = ()
    offloads: tuple[Offload, ...] = ()
    mlx: tuple[Touch, ...] = ()
    owner: bool = False
    guards: tuple[tuple[int, int, str], ...] = ()
    fallbacks: tuple[tuple[int, int], ...] = ()  # arms of a mode `if` whose other arm hands work to a thread
    loops: bool = False  # an async def with a `while` in its own body: an engine loop (loop_owner.py)
    startup: tuple[int, int] | None = None  # the lines a start-up coroutine runs before serving (startup.py)
    waits: tuple[Touch, ...] = ()  # calls that wait on another thread (model/waits.py), kind waits.THREAD
    own_loop: bool = False  # a coroutine function its decorator runs on a thread of its own (`@work(thread=True)`)
    end: int = 0  # its last line
    route: bool = False  # decorated as an HTTP route (`@app.post(...)`, `@router.get(...)`: cancellers.py)
    deadline: bool = False  # its own body calls a deadline (`asyncio.timeout`, `wait_for`, ...: cancellers.py)
    returns: str | None = None  # an instance of the class its return annotation names (`-> Engine`: `:Engine()`)
    prop: bool = False  # a property (`@property`, `@cached_property`): reading the attribute gives what it returns
    # Module-level streams its own body reads, first use each: `:NAME` (this file's), an import's reference
    # (`.engine.STREAM`, `mlx_lm.generate.generation_stream`); the package says where each was made (INV131).
    streams: tuple[tuple[str, Place], ...] = ()
    # A method with no body of its own (`...`, `pass`, a docstring, `raise NotImplementedError`, or
    # `@abstractmethod`): calling it runs one of its class's implementations (graph.py, `implementations`).
    stub: bool = False
    # Calls that may raise every time, with the lines that then never run (model/raises.py): (first, last, the
    # call's reference), the reference "" where it raises NameError for sure; the package judges the rest.
    raises: tuple[tuple[int, int, str], ...] = ()
    # The bodies of its lazy set-up branches (`if _engine is None:` on a `global` it declares, or on a name or
    # `self.x` the branch assigns): work done once, the first time (graph.py, `preloaded`).
    lazy: tuple[tuple[int, int], ...] = ()

    def guarded(self, line: int, is_lock: Any) -> bool:
        """Line `line` runs inside a `with` block of a lock `is_lock` accepts (a text -> bool)."""
        return any(first <= line <= last and is_lock(text) for first, last, text in self.guards)

    def in_fallback(self, line: int) -> bool:
        """Line `line` is in the arm a mode `if` takes without the worker its other arm hands work to
        (checker/branches.py: an `if` outside loops, on nothing the caller passes in)."""
        return any(first <= line <= last for first, last in self.fallbacks)

    def in_lazy_setup(self, line: int) -> bool:
        """Line `line` is in a lazy set-up branch (`Function.lazy`): it runs once, the first time."""
        return any(first <= line <= last for first, last in self.lazy)

    def before_serving(self, line: int) -> bool:
        """Line `line` runs in a start-up coroutine before the server serves anyone (checker/startup.py)."""
        return self.startup is not None and self.startup[0] <= line <= self.startup[1]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"line": self.line, "end": self.end, "params": list(self.params)}
        flags = ("a" * self.is_async + "g" * self.is_generator + "o" * self.opaque + "w" * self.owner + "l" * self.loops
                 + "t" * self.own_loop + "r" * self.route + "d" * self.deadline + "p" * self.prop + "s" * self.stub)
        if flags:
            out["flags"] = flags
        if self.calls:
            out["calls"] = [c.to_json() for c in self.calls]
        if self.offloads:
            out["offloads"] = [o.to_json() for o in self.offloads]
        if self.mlx:
            out["mlx"] = [t.to_json() for t in self.mlx]
        if self.guards:
            out["guards"] = [list(g) for g in self.guards]
        if self.fallbacks:
            out["fallbacks"] = [list(f) for f in self.fallbacks]
        if self.startup:
            out["startup"] = list(self.startup)
        if self.waits:
            out["waits"] = [t.to_json() for t in self.waits]
        if self.returns:
            out["returns"] = self.returns
        if self.streams:
            out["streams"] = [[ref, place.to_json()] for ref, place in self.streams]
        if self.raises:
            out["raises"] = [list(r) for r in self.raises]
        if self.lazy:
            out["lazy"] = [list(r) for r in self.lazy]
        return out

    @classmethod
    def from_json(cls, name: str, data: dict[str, Any]) -> Function:
        flags = data.get("flags", "")
        return cls(
            name, data["line"], "a" in flags, "g" in flags, tuple(data["params"]), "o" in flags,
            tuple(map(Call.from_json, data.get("calls", ()))),
            tuple(map(Offload.from_json, data.get("offloads", ()))),
            tuple(map(Touch.from_json, data.get("mlx", ()))),
            "w" in flags, tuple(map(tuple, data.get("guards", ()))),
            tuple(map(tuple, data.get("fallbacks", ()))), "l" in flags,
            tuple(data["startup"]) if "startup" in data else None,  # type: ignore[arg-type]
            tuple(map(Touch.from_json, data.get("waits", ()))), "t" in flags, data.get("end", 0),
            "r" in flags, "d" in flags, data.get("returns"), "p" in flags,
            tuple((ref, Place(*place)) for ref, place in data.get("streams", ())), "s" in flags,
            tuple(map(tuple, data.get("raises", ()))),
            tuple(map(tuple, data.get("lazy", ()))),
        )


@dataclass(frozen=True)
class Class:
    """A class: its bases and the attributes its methods assign a known value (`self.engine =
    Engine()` -> `engine: .engine.Engine()`). `names`: every attribute it defines (methods, its body's
    assignments, any `self.x = ...` of its methods), or None where that cannot be known (a decorator, a
    metaclass, a base the file cannot name, a body with other statements): model/raises.py reads a
    missing one as AttributeError."""

    name: str
    bases: tuple[str, ...] = ()
    attrs: dict[str, str] = field(default_factory=dict)
    names: frozenset[str] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"bases": list(self.bases), "attrs": self.attrs}
        if self.names is not None:
            out["names"] = sorted(self.names)
        return out

    @classmethod
    def from_json(cls, name: str, data: dict[str, Any]) -> Class:
        names = data.get("names")
        return cls(name, tuple(data["bases"]), dict(data["attrs"]), frozenset(names) if names is not None else None)


@dataclass(frozen=True)
class FileSummary:
    """One file: what its module-level names hold, its functions and classes (by local name), the
    locks it declares to guard MLX (`self._generation_lock = asyncio.Lock()  # invariants:
    mlx-lock` gives `self._generation_lock`), and the streams it makes at import (`STREAM =
    mx.new_stream(...)` at module level: where)."""

    imports_mlx: bool = False
    names: dict[str, str] = field(default_factory=dict)
    functions: dict[str, Function] = field(default_factory=dict)
    classes: dict[str, Class] = field(default_factory=dict)
    mlx_locks: tuple[str, ...] = ()
    streams: dict[str, Place] = field(default_factory=dict)
    defined: frozenset[str] = frozenset()  # every name its top level binds: another name read from it raises
    star: bool = False  # it has a star import: what it defines is unknown
    state: dict[str, str] = field(default_factory=dict)  # what it stores on a web app's state, by attribute

    def to_json(self) -> dict[str, Any]:
        return {
            "mlx": self.imports_mlx,
            "names": self.names,
            "functions": {k: f.to_json() for k, f in self.functions.items()},
            "classes": {k: c.to_json() for k, c in self.classes.items()},
            **({"mlx_locks": list(self.mlx_locks)} if self.mlx_locks else {}),
            **({"streams": {k: p.to_json() for k, p in self.streams.items()}} if self.streams else {}),
            "defined": sorted(self.defined),
            **({"star": True} if self.star else {}),
            **({"state": self.state} if self.state else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileSummary:
        return cls(
            data["mlx"], dict(data["names"]),
            {k: Function.from_json(k, f) for k, f in data["functions"].items()},
            {k: Class.from_json(k, c) for k, c in data["classes"].items()},
            tuple(data.get("mlx_locks", ())),
            {k: Place.from_json(p) for k, p in data.get("streams", {}).items()},
            frozenset(data.get("defined", ())), bool(data.get("star")), dict(data.get("state", {})),
        )
