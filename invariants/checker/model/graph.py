"""One package's summaries joined: names resolved across modules, a call graph, and a fixpoint
that says which functions reach MLX through plain calls, and by which chain.

Modules are read on demand: `prepare` starts from the functions of the entry modules (those
with an `async def` or a thread handoff) and loads only the modules their calls lead to.
What cannot be resolved (a name the summaries cannot follow, a module outside the files of
the run) is unknown, never MLX.

Each function has two ways to run: called (`RUN`), and, for a generator or a def that returns
one, iterated (`ITER`). A plain call of `g` runs `g`; iterating `g()` runs it and iterates it;
`return g()` passes `g`'s iteration on to the caller; a generator's body runs only when it is
iterated. A callable handed to a thread (an offload) is not called here, and an `async def`
runs only when awaited, where it is judged on its own.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from mlx_invariants.checker.globs import matcher
from mlx_invariants.checker.model import blocking, waits
from mlx_invariants.checker.model.locks import identity, infer
from mlx_invariants.checker.model.streams import LIBRARY_STREAMS
from mlx_invariants.checker.model.summary import (
    BIND, BLOCK, DEFAULT_POOL, EXECUTOR, GEN, ITERATED, LOAD, METAL, ONE_THREAD, OWNER, RETURNED, RETURNS, THREAD, TOUCH,
    WEB_APPS, Call, FileSummary, Function, Place, Touch,
)
from mlx_invariants.checker.worker_loops import on_worker_loops

RUN, ITER = "run", "iter"
BLOCKING = frozenset({BLOCK, GEN})            # what INV108 counts: MLX that makes the caller wait
ANY_MLX = frozenset({BLOCK, GEN, TOUCH, LOAD})  # what INV107 counts: any MLX on the wrong thread
GENERATION = frozenset({GEN})                 # a generation library's own stream: a version fact for INV107
LOADING = frozenset({LOAD})
BINDING = frozenset({BIND})                   # gives the calling thread its own generation stream
WAITING = frozenset({waits.THREAD})           # what INV130 counts: a wait on another thread (model/waits.py)
HTTP_CALLS = frozenset({blocking.HTTP})       # what INV137 counts: a sync HTTP call (model/blocking.py)
INFERENCE = frozenset({blocking.INFERENCE, blocking.GUESSED})  # what INV138 counts: a model's inference (model/blocking.py)
# MLX reached with no declared MLX lock held (INV125); the marker keeps its chains apart in `reach`.
UNGUARDED = frozenset({BLOCK, GEN, TOUCH, "unguarded"})
# With an inferred MLX lock, only MLX that runs in Metal counts (summary.METAL): the lock was not declared
# to cover the rest.
INFERRED = METAL | {"unguarded"}
# Thread roles: where a function runs.
LOOP = "the event loop"
PRIVATE_LOOP = "an event loop of its own"  # a thread worker's (`@work(thread=True)`): serving nothing else
OWNER_THREAD = "the owner thread"
ROLE_OF_POOL = {DEFAULT_POOL: "the default pool", EXECUTOR: "an executor", THREAD: "a thread", OWNER: OWNER_THREAD,
                ONE_THREAD: "an executor of one worker"}
THREAD_ROLES = frozenset({*ROLE_OF_POOL.values(), PRIVATE_LOOP})  # not the thread that imported the modules
_MLX_ROOTS = ("mlx.", "mlx_lm.", "mlx_vlm.")
_INERT_BASES = frozenset({"object", "ABC", "Generic", "Protocol"})  # bases that add no attribute a call would use
_DEPTH = 24  # alias chains, base classes: deeper is a cycle or not worth following

Key = tuple[str, str]  # (module, function's local name)
Node = tuple[Key, str]  # (function, RUN or ITER)


@dataclass(unsafe_hash=True)  # not frozen, for speed, as summary.py's classes (see there)
class Symbol:
    """What a reference names: a module, a class, a function, an instance of a class (all of
    the package), or an external dotted name (`mlx.core.eval`, `asyncio.to_thread`)."""

    kind: str  # "module", "class", "function", "instance", "external"
    module: str
    name: str = ""
    via_class: bool = False  # a method reached through its class (`Engine.run`), not an instance


@dataclass(frozen=True)
class StreamUse:
    """A function that reads a stream made at import (model/streams.py) and runs on other threads: where it
    reads it first, and the stream's origin: `(module, name)` of the package, or the library's reference."""

    user: Key
    place: Place
    made: tuple[str, str] | None
    library: str | None
    roles: frozenset[str]


@dataclass(unsafe_hash=True)  # not frozen, for speed, as summary.py's classes (see there)
class Step:
    """One link of a chain: the text shown for it, and the next node (None: the MLX call itself)."""

    text: str
    next: Node | None


@dataclass(frozen=True)
class Forward:
    """A helper hands its parameter to a thread: `pool` (DEFAULT_POOL, ...), `how` (the handoff as written)."""

    pool: str
    how: str


class _Spans:
    """Line spans, asked whether one holds a line: sorted by first line, with the furthest last line so far,
    so a question walks back only over spans that may still reach it (nested functions), not all of them."""

    def __init__(self, spans: Iterable[tuple[int, int]]) -> None:
        self._spans = sorted(spans)
        self._firsts = [first for first, _ in self._spans]
        self._reach = list(accumulate((last for _, last in self._spans), max))

    def __contains__(self, line: int) -> bool:
        index = bisect_right(self._firsts, line) - 1
        while index >= 0 and self._reach[index] >= line:
            if self._spans[index][1] >= line:
                return True
            index -= 1
        return False


def made_by(ref: str) -> str:
    """The function whose call made `ref` (`engine.stream()` -> `engine.stream`); any other reference itself."""
    return ref[:-2] if ref.endswith("()") else ref


class Package:
    """The model of one package (the files of one run under one root)."""

    def __init__(self, modules: dict[str, bool], load: Callable[[str], FileSummary | None],
                 shared: dict[str, Any] | None = None, classes: dict[str, dict[str, list[list[str]]]] | None = None,
                 state: dict[str, list[str]] | None = None) -> None:
        self.modules = modules  # module name -> is a package (`__init__.py`)
        self._load = load
        # Each module's top-level classes by name: [their bases' last names, their methods' names], read from the
        # text (phase.top_classes) so that the modules that may implement an abstract method are found unloaded.
        self._classes = classes or {}
        # Each module's stores on a web app's state (`app.state.engine = ...`), read from the text likewise.
        self._state = state or {}
        self._states: dict[str, Symbol | None] = {}  # attribute -> what the package's stores put there
        self._raising: dict[str, _Spans] = {}  # module -> the dead spans of its functions
        shared = shared or {}
        self._owner_names = list(shared.get("owner-functions", ()))
        self._configured_locks: list[str] = list(shared.get("mlx-locks", ()))
        self.mlx_locks: list[str] = []  # the configured ones, then those declared by a comment
        self._families: set[Key] = set()  # the families (`family`) that take a declared MLX lock
        self.is_mlx_lock: Callable[[str | None], bool] = lambda text: False  # a lock's text -> declared
        # Without a declared one: the process-wide locks inferred to guard MLX (locks.py of the model), by
        # identity (`app.utils:MLX_LOCK`), each with the lock as first written and the functions that hold it.
        self.inferred_locks: dict[str, tuple[str, list[Key]]] = {}
        self.lock_identities: dict[tuple[Key, str], str | None] = {}  # (function, lock as written) -> identity
        self._owned: dict[Key, bool] = {}  # family -> it serializes its MLX on an owner of its own
        self.roles: dict[Key, set[str]] = {}
        self.private: set[Key] = set()  # coroutine functions run only on a loop of their own (`_privately_run`)
        self.held: set[Key] = set()
        self._summaries: dict[str, FileSummary | None] = {}
        self.functions: dict[Key, Function] = {}
        self.edges: dict[Key, list[tuple[Call | None, str, Key | None, str]]] = {}
        self.reach: dict[frozenset[str], dict[Node, Step]] = {}
        self.forwards: dict[Key, dict[str, Forward]] = {}
        self._via_class: set[int] = set()
        self.loaders: set[Key] = set()
        self._hands_off: dict[str, bool] = {}  # module -> it hands MLX to a thread somewhere
        self._callees: dict[tuple[str, str], tuple[Key | None, Symbol | None]] = {}
        self._stream_uses: list[StreamUse] | None = None
        self._dead: dict[Key, list[tuple[int, int]]] = {}
        self._sync_callers: list[tuple[Key, Function, str, list[Touch], list[Any]]] | None = None  # `_callers`
        self.started: set[Key] = set()  # functions start-up code calls before the server serves (`prepare`)
        self.memo: dict[str, Any] = {}  # what a query derives once for the whole package (model/handed.py)

    # --- modules and names -----------------------------------------------------------------
    def summary(self, module: str) -> FileSummary | None:
        if module not in self._summaries:
            self._summaries[module] = self._load(module) if module in self.modules else None
        return self._summaries[module]

    def loaded(self) -> Iterator[tuple[str, FileSummary]]:
        """The modules read so far (the entry modules and those their calls lead to), with their summaries."""
        return ((module, summary) for module, summary in self._summaries.items() if summary is not None)

    def resolve(self, module: str, ref: str, depth: int = 0) -> Symbol | None:
        """The symbol `ref` names, seen from `module`; None when unknown."""
        if not ref or ref.startswith("$") or depth > _DEPTH:
            return None
        if ref.startswith(":"):
            return self._local(module, ref[1:], depth)
        if ref.startswith("."):
            level = len(ref) - len(ref.lstrip("."))
            package = self._package_of(module, level)
            return self._walk(package, _parts(ref[level:]), module, depth) if package is not None else None
        parts = _parts(ref)
        head, called = parts[0]
        if head in self.modules and not called:
            return self._walk(Symbol("module", head), parts[1:], module, depth)
        if ".state." in ref and ref.startswith(WEB_APPS):  # a web app's state, which the package may have stored
            return self._walk(Symbol("external", head + ("()" if called else "")), parts[1:], module, depth)
        return Symbol("external", ref)

    def _app_state(self, attr: str, depth: int) -> Symbol | None:
        """What `request.app.state.<attr>` holds: the value the package's modules store there
        (`app.state.engine = Engine()` in a lifespan), when every module that stores it names the same thing.
        heylookitsanllm's routes reach their provider as `request.app.state.router_instance.get_provider()`.
        Kept by attribute; a store that reads the state back (`app.state.a = app.state.b`) while its own
        attribute is being resolved is unknown."""
        if attr in self._states:
            return self._states[attr]
        self._states[attr] = None  # while resolving: a cycle through the state ends here
        found: set[Symbol | None] = set()
        for module, attrs in self._state.items():
            if attr in attrs:
                summary = self.summary(module)
                ref = summary.state.get(attr) if summary is not None else None
                found.add(self.resolve(module, ref, depth + 1) if ref is not None else None)
        symbol = found.pop() if len(found) == 1 else None
        self._states[attr] = symbol
        return symbol

    def _local(self, module: str, path: str, depth: int) -> Symbol | None:
        summary = self.summary(module)
        if summary is None:
            return None
        parts = _parts(path)
        for cut in range(len(parts), 0, -1):  # the longest prefix defined in this file (`f.<locals>.g`)
            if any(called for _, called in parts[: cut - 1]):
                continue
            name = ".".join(n for n, _ in parts[:cut])
            symbol = None
            if name in summary.functions:
                symbol = Symbol("function", module, name)
            elif name in summary.classes:
                symbol = Symbol("class", module, name)
            elif cut == 1 and name in summary.names:
                symbol = self.resolve(module, summary.names[name], depth + 1)
            if symbol is not None:
                if parts[cut - 1][1]:
                    symbol = self._call(symbol, depth)
                return self._walk(symbol, parts[cut:], module, depth) if symbol is not None else None
        return None

    def _walk(self, symbol: Symbol | None, parts: list[tuple[str, bool]], module: str, depth: int) -> Symbol | None:
        for name, called in parts:
            if symbol is None:
                return None
            symbol = self._member(symbol, name, depth)
            if called and symbol is not None:
                symbol = self._call(symbol, depth)
        return symbol

    def _member(self, symbol: Symbol, name: str, depth: int) -> Symbol | None:
        if symbol.kind == "external":
            if symbol.module.endswith(".state") and symbol.module.startswith(WEB_APPS):
                stored = self._app_state(name, depth)
                if stored is not None:
                    return stored
            return Symbol("external", f"{symbol.module}.{name}")
        if symbol.kind == "module":
            sub = f"{symbol.module}.{name}"
            if sub in self.modules:
                return Symbol("module", sub)
            summary = self.summary(symbol.module)
            if summary is None:
                return None
            if name in summary.functions:
                return Symbol("function", symbol.module, name)
            if name in summary.classes:
                return Symbol("class", symbol.module, name)
            if name in summary.names:
                return self.resolve(symbol.module, summary.names[name], depth + 1)
            return None
        if symbol.kind in ("class", "instance"):
            for module, cls in self.mro(symbol.module, symbol.name):
                summary = self.summary(module)
                if summary is None:
                    continue
                if f"{cls}.{name}" in summary.functions:
                    if symbol.kind == "instance" and summary.functions[f"{cls}.{name}"].prop:
                        return self._read_property((module, f"{cls}.{name}"), depth)
                    return Symbol("function", module, f"{cls}.{name}", via_class=symbol.kind == "class")
                if f"{cls}.{name}" in summary.classes:
                    return Symbol("class", module, f"{cls}.{name}")
                if symbol.kind == "instance" and name in summary.classes[cls].attrs:
                    return self.resolve(module, summary.classes[cls].attrs[name], depth + 1)
        return None

    def _call(self, symbol: Symbol, depth: int = 0) -> Symbol | None:
        """What calling `symbol` returns, where the model knows: a class gives an instance, and so does a
        function whose return annotation names a class of the package (`def get_engine() -> Engine`)."""
        if symbol.kind == "class":
            return Symbol("instance", symbol.module, symbol.name)
        if symbol.kind == "external":
            return Symbol("external", symbol.module + "()")
        fn = self.function((symbol.module, symbol.name)) if symbol.kind == "function" else None
        if fn is not None and fn.returns is not None:
            found = self.resolve(symbol.module, fn.returns, depth + 1)
            return found if found is not None and found.kind == "instance" else None
        return None

    def _read_property(self, key: Key, depth: int) -> Symbol | None:
        """What reading a property of an instance gives: an instance of the class its return annotation
        names (`@property def engine(self) -> Engine`), as a getter's call does (`_call`); else unknown.
        Without this, `manager.engine.transcribe(...)` stopped at the property, a function, whose members
        are nothing; with it, a route reaches the engine its manager hands out lazily."""
        return self._call(Symbol("function", *key), depth)

    def mro(self, module: str, cls: str) -> Iterator[tuple[str, str]]:
        """The class and its bases of the package, depth first (close enough to Python's MRO here)."""
        seen: set[tuple[str, str]] = set()
        stack = [(module, cls, 0)]
        while stack:
            mod, name, depth = stack.pop()
            summary = self.summary(mod)
            if (mod, name) in seen or depth > _DEPTH or summary is None or name not in summary.classes:
                continue
            seen.add((mod, name))
            yield mod, name
            for base in reversed(summary.classes[name].bases):
                found = self.resolve(mod, base)
                if found is not None and found.kind == "class":
                    stack.append((found.module, found.name, depth + 1))

    def callee(self, module: str, ref: str) -> tuple[Key | None, Symbol | None]:
        """The function a call of `ref` runs (a class's `__init__`, an instance's `__call__`),
        and the symbol itself. Kept by (module, ref): the summaries, and so the answer, never change,
        and the graph and the queries ask again for the same calls (on vllm-mlx, 11 000 asks of 2 700 calls)."""
        found = self._callees.get((module, ref))
        if found is None:
            found = self._callees[(module, ref)] = self._callee(module, ref)
        return found

    def _callee(self, module: str, ref: str) -> tuple[Key | None, Symbol | None]:
        symbol = self.resolve(module, ref)
        if symbol is None:
            return None, None
        if symbol.kind == "function":
            return (symbol.module, symbol.name), symbol
        if symbol.kind in ("class", "instance"):
            method = self._member(Symbol("instance", symbol.module, symbol.name),
                                  "__init__" if symbol.kind == "class" else "__call__", 0)
            if method is not None and method.kind == "function":
                return (method.module, method.name), symbol
        return None, symbol

    def function(self, key: Key) -> Function | None:
        found = self.functions.get(key)
        if found is None:
            summary = self.summary(key[0])
            found = summary.functions.get(key[1]) if summary is not None else None
            if found is not None:
                self.functions[key] = found
        return found

    def waits(self, key: Key, fn: Function) -> Iterator[Touch]:
        """`fn`'s calls that hold its thread (`Function.waits`), but an inference guessed by its name on a line where
        it calls a def of the package: the package model follows that def instead (model/blocking.py, `guessed`)."""
        called: set[tuple[int, int, str]] | None = None
        for wait in fn.waits:
            if wait.kind == blocking.GUESSED:
                if called is None:  # each resolved call by its place and its method (`get_backend().embed` shares a col)
                    called = {(call.place.line, call.place.col, call.text.rpartition(".")[2])
                              for call, _, target, _ in self.edges.get(key, ()) if call is not None and target is not None}
                if (wait.line, wait.place.col, wait.text.rpartition(".")[2]) in called:  # type: ignore[union-attr]
                    continue
            yield wait

    # --- the graph -----------------------------------------------------------------------------
    def prepare(self, entries: list[str]) -> None:
        """Load what the entry modules' functions lead to; work out reach and forwarding helpers."""
        queue: deque[Key] = deque()
        for module in entries:
            summary = self.summary(module)
            if summary is not None:
                queue.extend((module, name) for name in summary.functions)
        seen: set[Key] = set()
        while queue:
            key = queue.popleft()
            if key in seen:
                continue
            seen.add(key)
            fn = self.function(key)
            if fn is None:
                continue
            edges = self.edges[key] = []
            for call in fn.calls:
                if not self.can_run(key, call.place.line):
                    continue
                target, symbol = self.callee(key[0], call.target)
                if symbol is not None and symbol.via_class:
                    self._via_class.add(id(call))
                if target is not None:
                    edges.append((call, call.use, target, ""))
                    queue.append(target)
                elif symbol is not None and symbol.kind == "external" and symbol.module.startswith(_MLX_ROOTS):
                    kind = _external_kind(symbol.module, call.use)
                    if kind is not None:
                        edges.append((call, call.use, None, kind))
                for _, ref in call.args:
                    if ref.endswith("()"):  # a value made here: its maker runs where the value is used, if at all
                        continue
                    found, _ = self.callee(key[0], ref)
                    if found is not None:
                        queue.append(found)
            for work in fn.offloads:
                for ref in (work.target, work.stepped):
                    if ref is not None and not ref.startswith("$") and self.can_run(key, work.place.line):
                        found, _ = self.callee(key[0], made_by(ref))
                        if found is not None:
                            queue.append(found)
            if fn.stub:
                for found in self.implementations(key):
                    edges.append((Call(f":{found[1]}", self.display(found), _place_of(fn), RETURNED), RETURNED, found, ""))
                    queue.append(found)
        # A function that loads weights is start-up work, and so is the rest of the MLX it runs
        # (evaluating the weights, patching the model): INV108 leaves it out, as it leaves loads out.
        loading = self._reach(LOADING)
        self.loaders = {key for key, mode in loading if mode == RUN}
        # Building an object is set-up work too: MLX reached through a constructor makes the object's own
        # arrays once (a rotation matrix, a quantization self-test on a tiny tensor), as a load evaluates
        # its weights once. Issue 23's blind reviews graded every INV108 through an `__init__` on thirty-odd
        # servers arguable or false (vmlx's Scheduler.__init__ self-test, olmlx's TurboQuantRotation.__init__).
        constructors = {key for key in self.edges if key[1].rsplit(".", 1)[-1] == "__init__"}
        # And so is a lazy set-up branch (`if _engine is None: load_engine()`) that start-up code also runs: it
        # has run before the server serves anyone, and does nothing after.
        self.started = {target for key, edges in self.edges.items() for call, _, target, _ in edges
                        if target is not None and call is not None and self.functions[key].before_serving(call.place.line)}
        self.reach[BLOCKING] = self._reach(BLOCKING, skip=self.loaders | constructors, once=True)
        self.reach[ANY_MLX] = self._reach(ANY_MLX)
        self.reach[GENERATION] = self._reach(GENERATION)
        self.reach[BINDING] = self._reach(BINDING)
        self.reach[WAITING] = self._reach(WAITING, skip=self.loaders | constructors, once=True)
        self.reach[HTTP_CALLS] = self._reach(HTTP_CALLS, skip=self.loaders | constructors, once=True)
        self.reach[INFERENCE] = self._reach(INFERENCE, skip=self.loaders | constructors, once=True)
        self._forwarders()
        self.private = self._privately_run()
        self._roles()
        inline = sorted({lock for summary in self._summaries.values() if summary is not None for lock in summary.mlx_locks})
        self.mlx_locks = [*self._configured_locks, *(n for n in inline if n not in self._configured_locks)]
        if self.mlx_locks:

            self.is_mlx_lock = matcher(self.mlx_locks)
            self._families = {self.family(key) for key, fn in self.functions.items()
                              if any(self.is_mlx_lock(text) for _, _, text in fn.guards)}
            self._held()
            self.reach[UNGUARDED] = self._reach(UNGUARDED, skip=self.loaders | self.held, guarded=True)
        else:
            self.reach[METAL] = self._reach(METAL, skip=self.loaders)
            self.inferred_locks = infer(self)
            if self.inferred_locks:
                self._held()
                self.reach[UNGUARDED] = self._reach(INFERRED, skip=self.loaders | self.held, guarded=True)

    # --- thread roles and declared locks -------------------------------------------------------
    def declared_owner(self, key: Key) -> bool:
        """Declared to run on the MLX owner thread: by owner-functions (`Engine._generation_loop`,
        matched against the name in its module and with the module's: `app.engine.Engine.run`),
        or by `# invariants: owner-thread` on its def line."""
        fn = self.function(key)
        if fn is not None and fn.owner:
            return True
        if not self._owner_names:
            return False

        match = matcher(self._owner_names)
        return match(key[1]) or match(f"{key[0]}.{key[1]}")

    def family(self, key: Key) -> Key:
        """A handler's family: its class (`Engine` of `Engine.generate`), or its module's top level."""
        head = key[1].split(".", 1)[0]
        summary = self.summary(key[0])
        return (key[0], head if summary is not None and head in summary.classes and "." in key[1] else "")

    def asks_locks(self, key: Key) -> bool:
        """Whether INV125 asks about this function: its family takes a declared MLX lock somewhere
        (a class that serializes its MLX by one), so other classes' handlers are not judged by it."""
        return self.family(key) in self._families

    def mlx_guarded(self, key: Key, line: int) -> bool:
        """Line `line` of function `key` runs inside `with`/`async with` an MLX lock: a declared one
        (by its text), else one inferred (by what the text names, seen from `key`: locks.py)."""
        fn = self.function(key)
        if fn is None:
            return False
        if self.mlx_locks:
            return fn.guarded(line, self.is_mlx_lock)
        if not self.inferred_locks:
            return False
        return any(first <= line <= last and identity(self, key, text) in self.inferred_locks
                   for first, last, text in fn.guards)

    def runs(self, level: frozenset[str], key: Key, first: int, last: int) -> bool:
        """Lines `first`..`last` of function `key` run MLX of `level` (prepared in `reach`): a call of
        their own, a call of a function that reaches one, or a callable handed to a thread there."""
        fn = self.functions[key]
        if any(first <= touch.line <= last and touch.kind in level for touch in fn.mlx):
            return True
        reach = self.reach[level]
        for call, use, target, external in self.edges.get(key, ()):
            if call is None or not first <= call.place.line <= last:
                continue
            if target is None:
                if external in level:
                    return True
            elif (target, RUN) in reach or (use == ITERATED and (target, ITER) in reach):
                return True
        for work in fn.offloads:
            if first <= work.place.line <= last and work.target is not None:
                found, _ = self.callee(key[0], work.target)
                if found is not None and (found, RUN) in reach:
                    return True
        return False

    def owned_family(self, key: Key) -> bool:
        """`key`'s family serializes its MLX on an owner of its own, so a lock is not what keeps its
        MLX apart: one of its functions is declared to run on the owner thread, or is an engine loop
        owning MLX on the event loop (`owns_on_loop`), or hands MLX to the declared owner executor or
        to an executor its file builds with one worker."""
        family = self.family(key)
        found = self._owned.get(family)
        if found is None:
            summary = self.summary(family[0])
            members = [(family[0], name) for name in summary.functions
                       if self.family((family[0], name)) == family] if summary is not None else []
            found = any(self.declared_owner(k) or self.owns_on_loop(k) or self._hands_to_owner(k) for k in members)
            self._owned[family] = found
        return found

    def _hands_to_owner(self, key: Key) -> bool:
        fn = self.function(key)
        for work in fn.offloads if fn is not None else ():
            if work.pool in (OWNER, ONE_THREAD) and work.target is not None:
                found, _ = self.callee(key[0], work.target)
                if found is not None and ((found, RUN) in self.reach[ANY_MLX] or (found, RUN) in self.reach.get(METAL, {})):
                    return True
        return False

    def owns_on_loop(self, key: Key) -> bool:
        """An engine loop that made the event loop's thread its MLX owner (checker/loop_owner.py):
        an async def with a `while` that binds the generation streams, itself or through the sync
        defs it calls, in a module that hands no MLX to any thread."""
        fn = self.function(key)
        if fn is None or not fn.is_async or not fn.loops:
            return False
        binds = any(t.kind == BIND for t in fn.mlx) or any(
            target is not None and (target, RUN) in self.reach[BINDING] for _, _, target, _ in self.edges.get(key, ()))
        return binds and not self._hands_off_mlx(key[0])

    def _hands_off_mlx(self, module: str) -> bool:
        """Some function of `module` hands a callable that reaches MLX (or an MLX name) to a thread."""
        found = self._hands_off.get(module)
        if found is None:
            summary = self.summary(module)
            found = False
            for fn in summary.functions.values() if summary is not None else ():
                for work in fn.offloads:
                    target, symbol = self.callee(module, work.target) if work.target is not None else (None, None)
                    if (target is not None and (target, RUN) in self.reach[ANY_MLX]) or (
                            symbol is not None and symbol.kind == "external" and symbol.module.startswith(_MLX_ROOTS)):
                        found = True
            self._hands_off[module] = found
        return found

    def on_loop(self, key: Key) -> bool:
        """Runs on the event loop: an `async def`, or called from one, and not declared an owner's."""
        return LOOP in self.roles.get(key, ()) and not self.declared_owner(key)

    def _roles(self) -> None:
        """Each function's thread roles: seeded by async defs (the loop), declarations (the owner
        thread) and handoffs (the thread they hand to), carried from callers to callees."""
        queue: deque[tuple[Key, str]] = deque()
        for key in self.edges:
            fn = self.functions[key]
            if self.declared_owner(key):
                queue.append((key, OWNER_THREAD))
            elif fn.is_async:
                queue.append((key, PRIVATE_LOOP if key in self.private else LOOP))
            for work in fn.offloads:
                found, _ = self.callee(key[0], work.target) if work.target is not None else (None, None)
                if found is not None:
                    queue.append((found, ROLE_OF_POOL.get(work.pool, ROLE_OF_POOL[EXECUTOR])))
        while queue:
            key, role = queue.popleft()
            roles = self.roles.setdefault(key, set())
            if role in roles or (role == LOOP and self.declared_owner(key)):
                continue
            roles.add(role)
            for _call, _use, target, _ in self.edges.get(key, ()):
                if target is not None:
                    # Calling a thread worker's coroutine function (`@work(thread=True)`) only starts it on its
                    # thread, with a loop of its own, whatever runs the caller.
                    own = (fn := self.function(target)) is not None and fn.own_loop
                    queue.append((target, PRIVATE_LOOP if own else role))

    def _privately_run(self) -> set[Key]:
        """Coroutine functions that run only on an event loop of their own: one its decorator runs
        on a thread (`Function.own_loop`: Textual's `@work(thread=True)` worker), and one awaited
        only by coroutine functions that are. Such a loop serves that worker alone, so blocking it
        holds no server's requests. Any other caller (an `async def` on the server's loop, a sync def
        that schedules it there with `create_task`) makes it the event loop's, as does none at all.
        `asyncio.run(main())` is not such a run: the loop it makes is often the server's own (smg's
        gRPC servicer runs `asyncio.run(serve_grpc(args))` and serves on that loop,
        grpc_servicer/smg_grpc_servicer/mlx/server.py@fbe2497:200, the corpus's S2a)."""
        callers: dict[Key, list[Key | None]] = {}  # callee -> its callers; None: started on its own thread
        for key, edges in self.edges.items():
            for _call, _use, target, _ in edges:
                if target is not None:
                    callers.setdefault(target, []).append(key)
        for key, fn in self.functions.items():
            if fn.own_loop:  # calling it only starts it on its thread
                callers[key] = [None]
        coroutines = {key: found for key, found in callers.items()
                      if (fn := self.function(key)) is not None and fn.is_async}
        return on_worker_loops(coroutines, lambda key: (t for _, _, t, _ in self.edges.get(key, ()) if t is not None))

    def _held(self) -> None:
        """Functions entered only with a declared MLX lock held: every call of theirs in the
        package (a handoff too) is inside `with <mlx-lock>:` or in a function itself held (the
        greatest such set). A function nothing in the package calls (a route) is not held."""
        callers: dict[Key, list[tuple[Key, int]]] = {}
        for key, edges in self.edges.items():
            for call, _use, target, _ in edges:
                if target is not None and call is not None:
                    callers.setdefault(target, []).append((key, call.place.line))
            for work in self.functions[key].offloads:
                found, _ = self.callee(key[0], work.target) if work.target is not None else (None, None)
                if found is not None:
                    callers.setdefault(found, []).append((key, work.place.line))
        held = set(callers)
        changed = True
        while changed:
            changed = False
            for key in list(held):
                for caller, line in callers[key]:
                    if caller not in held and not self.mlx_guarded(caller, line):
                        held.discard(key)
                        changed = True
                        break
        self.held = held

    def _reach(self, level: frozenset[str], skip: set[Key] = frozenset(),  # type: ignore[assignment]
               guarded: bool = False, once: bool = False) -> dict[Node, Step]:
        """Shortest chains to MLX of `level`: a breadth-first search backwards from the MLX calls,
        not through the functions in `skip`; `guarded`: nor through a line inside `with <mlx-lock>:`."""
        reached: dict[Node, Step] = {}
        back: dict[Node, list[tuple[Node, str]]] = {}
        queue: deque[Node] = deque()

        def sink(node: Node, text: str) -> None:
            if node not in reached:
                reached[node] = Step(text, None)
                queue.append(node)

        for key, fn, mode, touches, edges in self._callers():
            if key in skip:
                continue
            # Lines are asked about only where the answer may be yes: a function with lock blocks, a lazy set-up.
            locked, lazy = guarded and bool(fn.guards), once and bool(fn.lazy)
            for touch in touches:
                if (locked and self.mlx_guarded(key, touch.line)) or (lazy and self.preloaded(key, touch.line)):
                    continue
                if touch.kind == RETURNS:  # an MLX generator, which generates where it is iterated
                    if GEN in level:
                        sink((key, ITER), touch.text)
                elif touch.kind in level:
                    sink((key, mode), touch.text)
            for call, use, target, external, followed in edges:
                if call is not None and ((locked and self.mlx_guarded(key, call.place.line))
                                         or (lazy and self.preloaded(key, call.place.line))):
                    continue
                if target is None:
                    if external == RETURNS and GEN in level:
                        sink((key, ITER), call.text)  # type: ignore[union-attr]
                    elif external in level:
                        sink((key, mode), call.text)  # type: ignore[union-attr]
                    continue
                if not followed or target in skip:
                    continue
                text = call.text  # type: ignore[union-attr]
                if use == RETURNED and not fn.is_generator:
                    back.setdefault((target, RUN), []).append(((key, RUN), text))
                    back.setdefault((target, ITER), []).append(((key, ITER), text))
                else:
                    back.setdefault((target, RUN), []).append(((key, mode), text))
                    if use == ITERATED:
                        back.setdefault((target, ITER), []).append(((key, mode), text))
        while queue:
            node = queue.popleft()
            for caller, text in back.get(node, ()):
                if caller not in reached:
                    reached[caller] = Step(text, node)
                    queue.append(caller)
        return reached

    def _callers(self) -> list[tuple[Key, Function, str, list[Touch], list[tuple[Call | None, str, Key | None, str, bool]]]]:
        """What `_reach` reads of each function of the graph, the same for every level, so worked out at its first
        call (the graph is complete by then) and not at each of its seven: each function but an `async def` (one
        runs where it is awaited, and is judged there), how it runs, its MLX calls and waits (blocking first: the
        clearer chain), and its edges, each with whether a chain may go on through its target (a function of the
        package, neither async nor opaque)."""
        if self._sync_callers is None:
            self._sync_callers = []
            for key, edges in self.edges.items():
                fn = self.functions[key]
                if fn.is_async:
                    continue
                touches = sorted((*fn.mlx, *self.waits(key, fn)), key=lambda t: t.kind not in BLOCKING)
                marked = []
                for call, use, target, external in edges:
                    callee = self.function(target) if target is not None else None
                    marked.append((call, use, target, external,
                                   callee is not None and not callee.is_async and not callee.opaque))
                self._sync_callers.append((key, fn, ITER if fn.is_generator else RUN, touches, marked))
        return self._sync_callers

    def _forwarders(self) -> None:
        """Helpers that hand a parameter to the default pool, directly or through another such helper.

        A helper that takes a lock around the handoff (`async with self._generation_lock:
        await asyncio.to_thread(func)`) is the engine's one serialization point, its own design
        decision: INV105 and INV106 judge it there, and its callers are not reported one by one."""
        for key in self.edges:
            for work in self.functions[key].offloads:
                if work.param is not None and work.pool == DEFAULT_POOL and not work.serialized:
                    self.forwards.setdefault(key, {}).setdefault(work.param, Forward(work.pool, work.how))
        changed = True
        while changed:
            changed = False
            for key, edges in self.edges.items():
                for call, _use, target, _ in edges:
                    if target is None or target not in self.forwards or call is None:
                        continue
                    for arg, ref in call.args:
                        if not ref.startswith("$"):
                            continue
                        param = self.parameter(target, arg, call)
                        forward = self.forwards[target].get(param or "")
                        if forward is not None and ref[1:] not in self.forwards.get(key, {}):
                            self.forwards.setdefault(key, {})[ref[1:]] = Forward(forward.pool, call.text)
                            changed = True

    def forwarded(self, helper: Key | None, call: Call) -> Iterator[tuple[str, Forward]]:
        """The arguments of `call`, a call of `helper`, that `helper` hands to the default pool (`_forwarders`), each
        with how: a callable the caller names (not a parameter of its own, nor a value the call makes)."""
        forwards = self.forwards.get(helper) if helper is not None else None
        if not forwards:
            return
        for arg, ref in call.args:
            if ref.startswith("$") or ref.endswith("()"):
                continue
            forward = forwards.get(self.parameter(helper, arg, call) or "")  # type: ignore[arg-type]
            if forward is not None:
                yield ref, forward

    def stepping_modules(self) -> set[str]:
        """The modules INV107 also reports in: those of the functions the calls reach that step a generator they
        are handed on a pool (a module of stream helpers may mention no MLX, and so be no entry)."""
        return {key[0] for key in self.edges
                if any(o.stepped is not None and o.stepped.startswith("$") for o in self.functions[key].offloads)}

    def handed_generators(self, key: Key, param: str, seen: set[tuple[Key, str]] | None = None
                          ) -> Iterator[tuple[str, str, str]]:
        """The generators the package's callers hand to parameter `param` of `key`, as (the caller's module,
        the reference of the call that made it, the caller's name): made at the call (`chunks(engine.stream())`),
        or handed to a parameter of the caller's own, followed up the same way."""
        seen = set() if seen is None else seen
        if (key, param) in seen:
            return
        seen.add((key, param))
        for caller, edges in self.edges.items():
            for call, _use, target, _ in edges:
                if target != key or call is None:
                    continue
                for arg, ref in call.args:
                    if self.parameter(key, arg, call) != param:
                        continue
                    if ref.startswith("$"):
                        yield from self.handed_generators(caller, ref[1:], seen)
                    elif ref.endswith("()"):
                        yield caller[0], ref, self.display(caller)

    def parameter(self, target: Key, arg: int | str, call: Call) -> str | None:
        """The parameter of `target` that argument `arg` (a position or a keyword) of `call` binds.
        A method called through its class (`Engine.run(engine, fn)`) takes `self` first: its
        positions are not mapped."""
        fn = self.function(target)
        if fn is None:
            return None
        if isinstance(arg, str):
            return arg if arg in fn.params else None
        if self._through_class(call):
            return None
        return fn.params[arg] if arg < len(fn.params) else None

    def _through_class(self, call: Call) -> bool:
        return id(call) in self._via_class

    def chain(self, level: frozenset[str], node: Node) -> list[str] | None:
        """The functions and the MLX call `node` reaches at `level`, as shown in a message."""
        step = self.reach.get(level, {}).get(node)
        if step is None:
            return None
        names = [self.display(node[0])]
        seen = {node}
        while step.next is not None and step.next not in seen:
            seen.add(step.next)
            names.append(self.display(step.next[0]))
            step = self.reach[level][step.next]
        names.append(step.text)
        return names

    def links(self, level: frozenset[str], node: Node) -> list[tuple[Key, str]]:
        """Each function of `node`'s chain with the call it makes next (the last: its MLX call)."""
        step = self.reach.get(level, {}).get(node)
        found: list[tuple[Key, str]] = []
        seen = set()
        while step is not None and node not in seen:
            seen.add(node)
            found.append((node[0], step.text))
            if step.next is None:
                break
            node, step = step.next, self.reach[level].get(step.next)
        return found

    # --- streams made at import (INV131) -------------------------------------------------------
    def stream_uses(self) -> list[StreamUse]:
        """Every read of a stream made at import by a function the graph knows to run on another thread than
        the importing one (a pool, an executor, a thread, an owner thread, a thread worker's own loop)."""
        if self._stream_uses is None:
            self._stream_uses = []
            for key, fn in sorted(self.functions.items()):
                roles = frozenset(self.roles.get(key, ())) & THREAD_ROLES
                if not fn.streams or not roles or self.declared_owner(key):
                    continue
                for ref, place in fn.streams:
                    made, library = self._stream_origin(key[0], ref, 0)
                    if made is not None or library is not None:
                        self._stream_uses.append(StreamUse(key, place, made, library, roles))
        return self._stream_uses

    def stream_modules(self) -> set[str]:
        """The modules INV131 reports in: those that make a stream other threads read, and those whose
        functions read a library's."""
        return {use.made[0] if use.made else use.user[0] for use in self.stream_uses()}

    def _stream_origin(self, module: str, ref: str, depth: int) -> tuple[tuple[str, str] | None, str | None]:
        """Where the stream `ref` (seen from `module`) was made: `(module, name)` of the package, or the
        library's reference; (None, None) when it is no stream made at import, or unknown."""
        if ref in LIBRARY_STREAMS:
            return None, ref
        if depth > _DEPTH:
            return None, None
        owner, name = module, ref[1:]
        if not ref.startswith(":"):
            base, _, name = ref.rpartition(".")
            found = self.resolve(module, base) if base.strip(".") else self._package_of(module, len(base))
            if found is None or found.kind != "module":
                return None, None
            owner = found.module
        summary = self.summary(owner)
        if summary is None:
            return None, None
        if name in summary.streams:
            return (owner, name), None
        if name in summary.names and not ref.startswith(":"):  # imported there from elsewhere
            return self._stream_origin(owner, summary.names[name], depth + 1)
        return None, None

    def preloaded(self, key: Key, line: int) -> bool:
        """Line `line` of `key` is in a lazy set-up branch (`Function.lazy`) that start-up code runs too (it calls
        `key`, or a function the branch calls): by the time a request gets there, it has been set up, and the branch does nothing. A lazy
        branch nothing sets up before serving runs on the first request, which waits for it (and so does
        everything else on the loop): that one is judged."""
        fn = self.function(key)
        if fn is None or not fn.in_lazy_setup(line):
            return False
        if key in self.started:  # the def that sets up lazily is itself called at start-up
            return True
        for first, last in fn.lazy:
            if first <= line <= last and any(
                    first <= call.place.line <= last and self.callee(key[0], call.target)[0] in self.started
                    for call in fn.calls):
                return True
        return False

    # --- code that cannot run (model/raises.py) -----------------------------------------------
    def can_run(self, key: Key, line: int) -> bool:
        """Line `line` of function `key` can run: no call before it, whose statement it follows, raises
        every time (a name its file binds nowhere, an attribute its package module does not define). Asked of
        every call the graph and the queries follow (14 000 times on vllm-mlx), of functions mostly with none."""
        dead = self._dead_spans(key)
        return not dead or not any(first <= line <= last for first, last in dead)

    def _dead_spans(self, key: Key) -> list[tuple[int, int]]:
        """The lines of `key` that follow a call raising each time it runs."""
        dead = self._dead.get(key)
        if dead is None:
            fn = self.function(key)
            dead = self._dead[key] = [(first, last) for first, last, ref in (fn.raises if fn else ())
                                      if not ref or self._undefined(key[0], ref)]
        return dead

    def dead_line(self, module: str, line: int) -> bool:
        """Line `line` of `module` lies in a function, after a call there that raises each time it runs.
        Asked for every finding of a file: the functions with such a call are listed once per module (a
        generated module of 12 000 functions and as many findings asked 150 million pairs otherwise)."""
        spans = self._raising.get(module)
        if spans is None:
            summary = self.summary(module)
            spans = self._raising[module] = _Spans(
                span for name, fn in (summary.functions.items() if summary is not None else ())
                if fn.raises for span in self._dead_spans((module, name)))
        return line in spans

    def _undefined(self, module: str, ref: str) -> bool:
        """`ref` reads an attribute of a module of the package that the module does not define (and has no
        star import, no module `__getattr__` and no submodule of that name): reading it raises AttributeError."""
        base, _, name = ref.rpartition(".")
        found = self.resolve(module, base) if base.strip(".") else self._package_of(module, len(base))
        if found is not None and found.kind == "instance":
            return self._lacks(found, name)
        if found is None or found.kind != "module" or f"{found.module}.{name}" in self.modules:
            return False
        summary = self.summary(found.module)
        return (summary is not None and not summary.star and name not in summary.defined
                and "__getattr__" not in summary.functions and bool(summary.defined))

    def _lacks(self, instance: Symbol, name: str) -> bool:
        """An instance of a package class whose every attribute is known (its class and each base: no
        decorator, metaclass or base from outside the package but `object`, `ABC`, `Generic` and `Protocol`)
        has no attribute `name`, and no `__getattr__`."""
        known: set[str] = set()
        for mod, cls in self.mro(instance.module, instance.name):
            summary = self.summary(mod)
            info = summary.classes.get(cls) if summary is not None else None
            if info is None or info.names is None:
                return False
            for base in info.bases:
                found = self.resolve(mod, base)
                if found is None or (found.kind == "external" and found.module.rpartition(".")[2] not in _INERT_BASES):
                    return False
            known |= info.names
        return bool(known) and name not in known and not {"__getattr__", "__getattribute__"} & known

    def implementations(self, key: Key) -> list[Key]:
        """The methods a call of the abstract method `key` may run: the same method of each class of the package
        that subclasses its class (at any depth) and defines or inherits a body for it, and, for a `Protocol`,
        of each class that defines every abstract method of the protocol (a structural match). A call typed by
        the base (`self._backend: STTBackend`, `llm: LlmService`) runs whichever is configured, so each is
        followed: one that reaches MLX makes the call reach it."""
        module, name = key
        cls, _, method = name.rpartition(".")
        summary = self.summary(module)
        if not cls or summary is None or cls not in summary.classes:
            return []
        protocol = any((found := self.resolve(module, base)) is not None and found.kind == "external"
                       and found.module.rpartition(".")[2] == "Protocol" for base in summary.classes[cls].bases)
        abstract = {n.rpartition(".")[2] for n, f in summary.functions.items() if f.stub and n.rpartition(".")[0] == cls}
        names, found_keys, changed = {cls.rpartition(".")[2]}, set(), True
        while changed:  # subclasses of subclasses, by the last part of their bases' names, checked by their MRO
            changed = False
            for mod, classes in sorted(self._classes.items()):
                for other, (bases, methods) in sorted(classes.items()):
                    structural = protocol and abstract <= set(methods)
                    if other in names or not (structural or names & set(bases)):
                        continue
                    if not structural and (module, cls) not in self.mro(mod, other):
                        continue
                    names.add(other)
                    changed = True
                    impl = self._member(Symbol("instance", mod, other), method, 0)
                    if impl is not None and impl.kind == "function" and (impl.module, impl.name) != key:
                        fn = self.function((impl.module, impl.name))
                        if fn is not None and not fn.stub:
                            found_keys.add((impl.module, impl.name))
        return sorted(found_keys)

    def _package_of(self, module: str, level: int) -> Symbol | None:
        """The package `from {"." * level} import x` in `module` names."""
        base = module if self.modules.get(module) else module.rpartition(".")[0]
        for _ in range(level - 1):
            base = base.rpartition(".")[0]
        return Symbol("module", base) if base else None

    def display(self, key: Key) -> str:
        """`engine.Engine.generate_all`: the module's last part and the function's name in it."""
        name = key[1]
        if name.rpartition(".")[2].startswith("<lambda"):
            return "lambda"
        return f"{key[0].rpartition('.')[2]}.{name}"


def _place_of(fn: Function) -> Place:
    """Where a function is: its `def` line (a dispatch to an implementation has no call of its own)."""
    return Place(fn.line, 1, fn.line, fn.end or fn.line, fn.line)


def _parts(path: str) -> list[tuple[str, bool]]:
    """`Engine().run` -> [("Engine", True), ("run", False)]."""
    out = []
    for part in path.split("."):
        if not part:
            continue
        called = part.endswith("()")
        out.append((part[:-2] if called else part, called))
    return out


def _external_kind(qual: str, use: str) -> str | None:
    """A call of an MLX name reached through the package (a re-export): its kind, as in a summary."""
    from mlx_invariants.checker.model import classify

    if classify.is_generator(qual):
        return GEN if use == ITERATED else (RETURNS if use == RETURNED else None)
    head, _, method = qual.rpartition("().")
    if head and head in classify.BATCH_GENERATORS and method not in classify.GENERATOR_HARMLESS:
        return GEN
    return classify.by_name(qual)


__all__ = ["Package", "Symbol", "Step", "Forward", "RUN", "ITER", "BLOCKING", "ANY_MLX", "GENERATION", "UNGUARDED", "INFERRED",
           "BINDING", "WAITING", "HTTP_CALLS", "INFERENCE",
           "LOOP", "OWNER_THREAD", "PRIVATE_LOOP"]
