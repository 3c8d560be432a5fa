from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from mlx_invariants.checker import mlx_api
from mlx_invariants.checker.facts import CallSite
from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.offload import keyword, positional
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.walker import OWN_BODY_STOP, descendants

THREAD_LOCKS = frozenset({"threading.Lock", "threading.RLock", "_thread.allocate_lock"})
_CONTAINERS = frozenset({"list", "dict", "set", "tuple", "frozenset", "collections.deque", "collections.defaultdict",
                         "collections.OrderedDict", "collections.Counter"})
_LITERALS = (cst.List, cst.Dict, cst.Set, cst.Tuple, cst.ListComp, cst.DictComp, cst.SetComp)
# Calls that finish at once whatever they are called on.
_QUICK_BUILTINS = frozenset({
    "len", "list", "dict", "set", "tuple", "frozenset", "sorted", "reversed", "min", "max", "sum", "any", "all",
    "isinstance", "issubclass", "id", "hash", "bool", "int", "float", "str", "repr", "range", "enumerate", "zip",
    "iter", "getattr", "hasattr", "setattr", "type", "abs", "round", "map", "filter",
})
_QUICK_QUALS = frozenset({"time.time", "time.monotonic", "time.perf_counter", "time.monotonic_ns", "time.time_ns"})
_QUICK_METHODS = frozenset({
    "put_nowait", "get_nowait", "is_set", "qsize", "empty", "full", "done", "cancelled", "call_soon_threadsafe",
})
_LOG_METHODS = frozenset({"debug", "info", "warning", "error", "exception", "critical", "log"})
# What is known to take long, whoever calls it: sleeping, waiting on another thread or process, and
# file, network or process I/O.
_BLOCKING_QUALS = frozenset({
    "time.sleep", "os.fsync", "json.dump", "json.load", "pickle.dump", "pickle.load", "numpy.save", "numpy.load",
    "numpy.savez", "numpy.savez_compressed", "socket.create_connection",
})
_BLOCKING_PACKAGES = ("subprocess.", "shutil.", "requests.", "urllib.request.", "httpx.", "safetensors.")
_BLOCKING_BUILTINS = frozenset({"open", "input"})
# Methods that wait for another thread, process or peer on any receiver.
_WAITS = frozenset({"wait", "wait_for", "result", "communicate", "recv", "recv_into", "sendall", "accept"})
# Methods that wait only on a receiver built as one of these (`str.join` and `dict.get` do not).
_WAITS_ON = {
    "join": frozenset({"threading.Thread", "multiprocessing.Process", "queue.Queue", "multiprocessing.Queue"}),
    "get": frozenset({"queue.Queue", "queue.SimpleQueue", "queue.LifoQueue", "queue.PriorityQueue",
                      "multiprocessing.Queue"}),
    "put": frozenset({"queue.Queue", "queue.LifoQueue", "queue.PriorityQueue", "multiprocessing.Queue"}),
}


@dataclass
class _Section:
    """One stretch of code that holds a lock: what in it is slow by its shape, and the calls to judge."""

    where: str
    on_loop: bool  # held by an async def: on the loop's own thread
    slow: str | None = None  # an await, a yield, an async loop or context, a hold by `.acquire()`
    calls: list[tuple[cst.Call, str]] = field(default_factory=list)  # (call, its text), judged in end()


@dataclass
class _Taking:
    lock: cst.BaseExpression
    key: str
    node: cst.CSTNode
    text: str
    statement: cst.CSTNode | None
    section: _Section  # the stretch this taking holds


class ThreadLockOnEventLoop(Rule):
    """A `threading.Lock` taken in an `async def` (`with lock:`, `lock.acquire()`)
    blocks the event loop thread for as long as another thread holds it: while a
    worker thread holds the lock across a model step, every coroutine of the
    server (health checks, streaming, new admissions) is frozen. smg's MLX
    servicer took `_gen_lock` in Generate and Abort on the loop while its
    generation thread held it across each `BatchGenerator.next()`
    (servicer.py@fbe2497:616, the corpus's S2b); its fix left the loop only a
    brief `_pending_lock` around list and set updates, which this rule accepts.
    mlx-openai-server's handler takes `_generation_lock` on the loop while
    `_stream_with_lock` holds it across a whole streamed generation
    (app/handler/mlx_lm.py@4b7d4b6:493).

    The holder's work has to be shown slow by the file, not merely unknown to it:
    vllm-mlx's stop() takes `_prefix_trie_cache_lock`, which the engine's other
    methods hold around a trie lookup, an insert and building an empty
    `LRUPromptCache` (engine/simple.py@4b654c0:941), graded arguable blind
    (issue 23) when this rule counted every unknown call as slow. Rapid-MLX's video
    engine takes `_state_lock` on the loop around a `put` on an unbounded
    `queue.Queue()`, which never waits (video/engine.py@7222ca7:294, graded false):
    only a bounded queue's `put` counts.

    A coroutine that holds a `threading.RLock` across an await holds it for the
    loop's own thread, and another coroutine's `with lock:` on that loop re-enters
    it at once: mlx-gui's generate_text_stream takes `_lock` while
    load_model_async may hold it across `await asyncio.sleep` (model_manager.py
    @92614c3:806, graded false). That hold is still reported where it is taken
    (:622): the loader thread that needs the lock waits for the whole await."""

    id = "INV114"
    catches = "a threading lock, held elsewhere across slow work, taken on the event loop in an async def"
    message = (
        "`{taking}` takes threading lock `{lock}` on the event loop, and {where} holds it {slow}: "
        "the whole loop stalls until that finishes; hand the work to the lock's thread through a queue, "
        "or take the lock off the loop (`await asyncio.to_thread(...)`)"
    )
    known_problems = (
        "Locks are known by constructor (threading.Lock/RLock) in this file, through the import table and "
        "`self.x = threading.Lock()`. A hold counts as slow only where this file shows slow work in it: an "
        "await, a yield, an async loop or context, MLX (the calls the other rules count as MLX), a sleep, a "
        "wait on another thread, process or peer (`wait()`, `result()`, a Thread's `join()`, a Queue's "
        "`get()`/`put()`), file, network or process I/O (`open`, subprocess, shutil, requests, ...), or a "
        "def of this file that reaches one of those; a hold taken by `.acquire()` is never judged quick. "
        "A call the file cannot see into (another module's function, a method of an object of unknown "
        "type) counts as quick, so a lock held across slow work done elsewhere is missed; so does a call "
        "only named like a model loader (`engine.unload_model(...)`). Holders in "
        "other files are not seen. `acquire(blocking=False)` and `acquire(timeout=...)` are not flagged. "
        "A `put` waits only on a queue built here with a `maxsize` other than 0. "
        "For an RLock, a hold by another async def is taken to be on the same loop thread, and so re-entered: "
        "a coroutine run on a second event loop in a worker thread (`loop.run_until_complete` there) does "
        "stall behind it, and that taking is missed; the hold itself is still reported where it is taken."
    )
    triggers = (("async",), ("threading", "_thread"))

    INVALID = [
        Invalid('''
            import threading

            class MlxServicer:
                def __init__(self, batch_generator):
                    self.batch_generator = batch_generator
                    self._gen_lock = threading.Lock()

                def _generation_loop(self):
                    while True:
                        with self._gen_lock:
                            responses = self.batch_generator.next()
                        self._publish(responses)

                async def Abort(self, request, context):
                    uid = self._uids.get(request.request_id)
                    with self._gen_lock:  # expect: INV114
                        self._aborted.add(uid)
        '''),
        Invalid('''
            from threading import RLock as _RLock

            _STATE_LOCK = _RLock()

            async def snapshot(state):
                _STATE_LOCK.acquire()  # expect: INV114
                try:
                    return dict(state)
                finally:
                    _STATE_LOCK.release()
        '''),
        Invalid('''
            import threading

            class Cache:
                def __init__(self):
                    self._lock = threading.Lock()
                    self._entries = {}

                async def fill(self, key, fetch):
                    with self._lock:  # expect: INV114
                        self._entries[key] = await fetch(key)
        '''),
        Invalid('''
            import pickle
            import threading

            class PromptIndex:
                def __init__(self, path):
                    self._path = path
                    self._index_lock = threading.Lock()
                    self._index = None

                def _write_snapshot(self):
                    with open(self._path, "wb") as out:
                        pickle.dump(self._index, out)

                def checkpoint(self):
                    with self._index_lock:
                        self._write_snapshot()

                async def drop(self):
                    with self._index_lock:  # expect: INV114
                        self._index = None
        '''),
        # A bounded queue's put waits for room while the lock is held.
        Invalid('''
            import queue
            import threading

            class VideoEngine:
                def __init__(self):
                    self._work_queue = queue.Queue(maxsize=4)
                    self._state_lock = threading.Lock()

                def _submit(self, job):
                    with self._state_lock:
                        self._work_queue.put(job)

                async def close(self):
                    with self._state_lock:  # expect: INV114
                        self._closed = True
        '''),
        # A coroutine holding an RLock across an await holds it for the loop's thread: threads that need it
        # wait, so that taking is reported; another coroutine's taking re-enters it and is not (mlx-gui).
        Invalid('''
            import asyncio
            import threading

            class ModelManager:
                def __init__(self):
                    self._lock = threading.RLock()
                    self._status = {}

                async def load_model_async(self, name):
                    with self._lock:  # expect: INV114
                        while self._status.get(name) == "loading":
                            await asyncio.sleep(0.1)

                async def generate_text(self, name):
                    with self._lock:
                        if self._status.get(name) != "loaded":
                            raise ValueError(name)
        '''),
    ]
    VALID = [
        Valid('''
            import threading

            class MlxServicer:
                def __init__(self, batch_generator):
                    self.batch_generator = batch_generator
                    self._pending_lock = threading.Lock()
                    self._aborted = set()

                def _generation_loop(self):
                    while True:
                        with self._pending_lock:
                            aborted = self._aborted
                            self._aborted = set()
                        self.batch_generator.remove(list(aborted))
                        self._publish(self.batch_generator.next())

                async def Abort(self, request, context):
                    with self._pending_lock:
                        self._aborted.add(request.request_id)
        '''),
        Valid('''
            from threading import RLock as _RLock

            _STATE_LOCK = _RLock()

            async def snapshot(state):
                if not _STATE_LOCK.acquire(blocking=False):
                    return None
                try:
                    return dict(state)
                finally:
                    _STATE_LOCK.release()
        '''),
        Valid('''
            import asyncio

            class Cache:
                def __init__(self):
                    self._lock = asyncio.Lock()
                    self._entries = {}

                async def fill(self, key, fetch):
                    async with self._lock:
                        self._entries[key] = await fetch(key)
        '''),
        Valid('''
            import asyncio
            import threading

            class MlxServicer:
                def __init__(self, batch_generator):
                    self.batch_generator = batch_generator
                    self._gen_lock = threading.Lock()

                async def Abort(self, request, context):
                    def remove():
                        with self._gen_lock:
                            self.batch_generator.remove([request.uid])

                    await asyncio.to_thread(remove)
        '''),
        Valid('''
            import pickle
            import threading

            class PromptIndex:
                def __init__(self, path):
                    self._path = path
                    self._index_lock = threading.Lock()
                    self._index = None

                def _write_snapshot(self, index):
                    with open(self._path, "wb") as out:
                        pickle.dump(index, out)

                def checkpoint(self):
                    with self._index_lock:
                        index = self._index
                    self._write_snapshot(index)

                def lookup(self, tokens):
                    with self._index_lock:
                        if self._index is None:
                            self._index = TokenIndex(capacity=64)
                        return self._index.longest_prefix(tokens)

                async def drop(self):
                    with self._index_lock:
                        self._index = None
        '''),
        # An unbounded queue takes every item at once: the lock is held for microseconds (Rapid-MLX).
        Valid('''
            import queue
            import threading

            class VideoEngine:
                def __init__(self):
                    self._work_queue = queue.Queue()
                    self._state_lock = threading.Lock()

                def _submit(self, job):
                    with self._state_lock:
                        self._work_queue.put(job)

                async def close(self):
                    with self._state_lock:
                        self._closed = True
                        self._work_queue.put(None)
        '''),
        # The loop polls without holding the lock across the await; a thread's hold
        # across a call only named like a loader (`unload_model` of an engine not in the file) is unknown.
        Valid('''
            import asyncio
            import threading

            class ModelManager:
                def __init__(self, engine):
                    self._engine = engine
                    self._lock = threading.RLock()
                    self._status = {}

                def unload_model(self, name):
                    with self._lock:
                        self._engine.unload_model(name)
                        self._status.pop(name, None)

                async def load_model_async(self, name):
                    while True:
                        with self._lock:
                            if self._status.get(name) != "loading":
                                return self._status.get(name) == "loaded"
                        await asyncio.sleep(0.1)

                async def generate_text(self, name):
                    with self._lock:
                        if self._status.get(name) != "loaded":
                            raise ValueError(name)
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.sections: dict[str, list[_Section]] = {}
        self.takings: list[_Taking] = []

    def visit_With(self, node: cst.With) -> None:
        if node.asynchronous is not None:
            return
        for item in node.items:
            lock = item.item
            key = self.ctx.key(lock) if isinstance(lock, cst.Name | cst.Attribute) else None
            if key is None:
                continue
            self.ctx.pin(lock)
            section = self._section(node.body)
            self.sections.setdefault(key, []).append(section)
            if self.ctx.in_async:
                self.takings.append(_Taking(lock, key, node, f"with {dotted(lock)}:", self.ctx.statement, section))

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "acquire"):
            return
        key = self.ctx.key(func.value)
        if key is None:
            return
        self.ctx.pin(func.value)
        held = _Section(self._where(), self.ctx.in_async,
                        slow=f"from `{dotted(func)}()` to a release this rule does not follow")
        self.sections.setdefault(key, []).append(held)
        if self.ctx.in_async and _blocks(node):
            self.takings.append(_Taking(func.value, key, node, f"{dotted(func)}()", self.ctx.statement, held))

    def end(self) -> None:
        for taking in self.takings:
            built = self._thread_lock(taking.lock)
            if not built:
                continue
            sections = self.sections.get(taking.key, ())
            if built <= {"threading.RLock"}:
                # A coroutine holding a reentrant lock holds it for the loop's own thread: the taking
                # re-enters it at once. Only a thread's hold, or the taking's own, can stall the loop.
                sections = [s for s in sections if s is taking.section or not s.on_loop]
            # A hold slow by its shape (an await, a yield) is named before one slow through a call.
            slow = next(((s.where, s.slow) for s in sections if s.slow), None) or next(
                ((s.where, found) for s in sections if (found := self._slow_call(s))), None)
            if slow is None:
                continue
            message = self.message.format(taking=taking.text, lock=dotted(taking.lock), where=slow[0], slow=slow[1])
            self.ctx.report_at(self.id, taking.node, taking.statement, message)

    def _slow_call(self, section: _Section) -> str | None:
        """The first call in the section that the file shows to be slow, or None."""
        for call, text in section.calls:
            func = call.func
            if isinstance(func, cst.Attribute) and self._is_container(self.ctx.key(func.value)):
                continue
            site = CallSite(call, self.ctx.resolve(func), dotted(func), self.ctx.key(func))
            what = self._takes_long(site)
            if what is None:
                for function in self.ctx.facts.by_key.get(site.key or "", ()):
                    inner = self.ctx.facts.first_reaching(function, self._takes_long)
                    if inner:
                        what = f"which reaches {inner}"
                        break
            if what:
                return f"across `{text}` ({what})"
        return None

    def _takes_long(self, site: CallSite) -> str | None:
        """The call's own slow work: MLX, a sleep or a wait on another thread, or I/O."""
        found = mlx_api.reaches(site, self.ctx)
        if found and not (mlx_api.is_load(site) and not mlx_api.is_mlx_loader(site.qual)):
            return f"MLX: `{found}`"  # a call only named like a loader (`engine.unload_model`) is unknown
        func = site.node.func
        qual = site.qual or ""
        if qual in _BLOCKING_QUALS or qual.startswith(_BLOCKING_PACKAGES):
            return f"`{site.text or qual}`"
        if isinstance(func, cst.Name) and func.value in _BLOCKING_BUILTINS and not qual:
            return f"`{func.value}`"
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            built = _WAITS_ON.get(method)
            if method in _WAITS or (built and self._waits_on(func.value, method, built)):
                return f"`{site.text}`"
        return None

    def _waits_on(self, receiver: cst.BaseExpression, method: str, built: frozenset[str]) -> bool:
        """`receiver` was built as one of `built`; for `put`, as a bounded queue (a `maxsize` other than 0):
        an unbounded queue takes every item at once."""
        assigned = [a for a in self.ctx.facts.assigned.get(self.ctx.key(receiver) or "", ()) if a.call_qual in built]
        if method != "put":
            return bool(assigned)
        return any(_bounded(a.value) for a in assigned)

    def _where(self) -> str:
        function = self.ctx.scope.function()
        if function is None:
            return "module-level code"
        return "a lambda" if function.name == "<lambda>" else f"`{function.name}`"

    def _section(self, body: cst.BaseSuite) -> _Section:
        """What in a `with` body is slow by its shape, and the calls to judge at the end (pinned now:
        receivers' keys need this scope)."""
        section = _Section(self._where(), self.ctx.in_async)
        for node in descendants(body, OWN_BODY_STOP):
            if isinstance(node, cst.Await | cst.Yield):
                section.slow = "across an await" if isinstance(node, cst.Await) else "across a yield"
                return section
            if isinstance(node, cst.For | cst.With) and node.asynchronous is not None:
                section.slow = "across an async loop or context"
                return section
            if not isinstance(node, cst.Call):
                continue
            func = node.func
            if isinstance(func, cst.Name) and func.value in _QUICK_BUILTINS and self.ctx.resolve(func) is None:
                continue
            if self.ctx.resolve(func) in _QUICK_QUALS:
                continue
            if isinstance(func, cst.Attribute):
                method = func.attr.value
                receiver = dotted(func.value) or ""
                if method in _QUICK_METHODS or (method in _LOG_METHODS and "log" in receiver.lower()):
                    continue
            self.ctx.pin(node)
            section.calls.append((node, f"{dotted(func) or '...'}(...)"))
        return section

    def _thread_lock(self, lock: cst.BaseExpression) -> set[str]:
        """The threading lock classes `lock` was built from in this file (empty: not a threading lock)."""
        return self.ctx.facts.constructed_by(self.ctx.key(lock)) & THREAD_LOCKS

    def _is_container(self, key: str | None) -> bool:
        """Every value this file assigns to `key` is a list, dict, set or tuple (or a collections one)."""
        values = self.ctx.facts.assigned.get(key, ()) if key else ()
        return bool(values) and all(_builds_container(a.value, a.call_qual) for a in values)


def _builds_container(value: cst.BaseExpression, qual: str | None) -> bool:
    if isinstance(value, _LITERALS):
        return True
    if isinstance(value, cst.Call):
        return (qual or dotted(value.func) or "") in _CONTAINERS
    return False


def _bounded(value: cst.BaseExpression) -> bool:
    """A queue constructor call given a `maxsize` that is not the literal 0 (`Queue(8)`, `Queue(maxsize=n)`)."""
    if not isinstance(value, cst.Call):
        return True  # built some other way: not known to be unbounded
    size = keyword(value, "maxsize") or positional(value, 0)
    return size is not None and not (isinstance(size, cst.Integer) and size.value == "0")


def _blocks(call: cst.Call) -> bool:
    """`acquire()` with no timeout and blocking left true."""
    if keyword(call, "timeout") is not None or positional(call, 1) is not None:
        return False
    blocking = keyword(call, "blocking") or positional(call, 0)
    return not (isinstance(blocking, cst.Name) and blocking.value == "False"
                or isinstance(blocking, cst.Integer) and blocking.value == "0")
