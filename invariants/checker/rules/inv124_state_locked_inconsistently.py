from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from mlx_invariants.checker.blocks import Blocks
from mlx_invariants.checker.locks import is_lock
from mlx_invariants.checker.names import dotted, terminal
from mlx_invariants.checker.offload import HANDOFF_NAMES, THREAD_CLASSES, handoff, keyword, unwrap_callable
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.scopes import Kind

# Methods that change a dict, set or list in place.
_MUTATORS = frozenset({
    "pop", "popitem", "clear", "update", "add", "discard", "remove", "append", "extend", "insert", "setdefault",
})
_THREADING = ("threading.", "concurrent.futures.")
# What builds a dict, set or list: the only state this rule judges (an object of another class
# may lock itself, and the file does not say).
_CONTAINER_LITERALS = (cst.Dict, cst.List, cst.Set, cst.DictComp, cst.ListComp, cst.SetComp)
_CONTAINER_BUILTINS = frozenset({"dict", "list", "set"})
_CONTAINER_CLASSES = frozenset({
    "collections.OrderedDict", "collections.defaultdict", "collections.deque", "collections.Counter",
    "typing.OrderedDict", "typing.DefaultDict", "typing.Deque", "typing.Counter",
})
# Methods that build the object; what they and their private helpers do happens before it is shared.
_CONSTRUCTORS = frozenset({"__init__", "__post_init__"})
# The thread role of code an `async def` runs (directly or through the sync methods it calls).
_LOOP = "the event loop"


@dataclass
class _Write:
    node: cst.CSTNode
    statement: cst.CSTNode | None
    function: str
    locks: frozenset[str]


class StateLockedInconsistently(Rule):
    """State that two threads change needs one lock for every change. When a
    class changes a dict or set under a lock in one method (the generation thread
    maps a request to its batch uid under `_gen_lock`) and without any lock in
    another (an `Abort` handler on the event loop pops the same mapping), the two
    interleave: an abort that reads the map between the thread's steps finds
    nothing and is lost, or removes an entry the thread is about to use. smg's
    MLX servicer did this with `_request_uid_map` (servicer.py@fbe2497:760),
    fixed in a41aa6c by leaving every change to the generation thread and having
    `Abort` only record the id under the lock.

    A lock around one change is only evidence; the race needs two threads. So the
    rule reports only when the file shows the two changes run on different threads:
    one on the event loop (an `async def`, or a method one calls) and one on a
    thread the file starts or hands work to (`Thread(target=)`, `to_thread`,
    `run_in_executor`, `submit`, and the methods those call), or on two such
    threads. A lock that guards something else and happens to enclose a change
    the same thread makes elsewhere unlocked (a counter's lock in `add_request`,
    the scheduler thread's own pops) is no race."""

    id = "INV124"
    # Opt-in: even with both threads shown, reviewers graded 1 of 5 sampled findings on ten MLX servers not studied
    # here true; whether the unlocked change can meet the locked one (a key only the locked side published) needs
    # an ordering the file does not show.
    default_enabled = False
    catches = "a container attribute changed under a lock in one method and with no lock in another"
    message = (
        "`{attr}` is changed here, on {here}, with no lock, but under `{lock}` in `{other}`, on {there}: the two "
        "can interleave (a lost update, an entry used after it was removed); take `{lock}` here too, or leave "
        "`{attr}` to one thread"
    )
    known_problems = (
        "Judges in-place changes (`x[k] = v`, `del x[k]`, `x.pop()`, `x.add()`, ...) of `self` attributes the "
        "file assigns a dict, set or list (a literal, a comprehension, `dict()`, `collections.OrderedDict()`, "
        "...), in files that use threads; an attribute holding another object (which may lock itself) or "
        "assigned only elsewhere is not judged, and reads are not judged. Construction is not judged: "
        "`__init__`, and a private method every call of which in this file is made from `__init__` (also "
        "through other such methods) and which is never handed on as a callable; a call made after `__init__` "
        "started a thread counts as construction too, and a private method also called from another file is "
        "not seen. A lock counts when a `with` of a lock (by construction or lock-names) encloses the change "
        "in the same def, or every call of that def in this file holds one (a private helper of locked "
        "methods); a lock taken by a caller in another file, or a change made only from one thread by design "
        "(both writers on the event loop), is not seen. Only changes whose threads the file shows are judged: "
        "a method that no `async def` of the file calls and no thread of the file runs (a public method called "
        "from another module) has no known thread, and its changes are not reported."
    )
    triggers = (("threading", "Thread", "Executor"), ("with ",))

    INVALID = [
        Invalid('''
            import threading

            class MlxServicer:
                def __init__(self):
                    self._gen_lock = threading.Lock()
                    self._request_uid_map = {}
                    self._thread = threading.Thread(target=self._generation_loop, daemon=True)

                def _generation_loop(self):
                    while True:
                        with self._gen_lock:
                            for request_id, uid in self._insert_pending():
                                self._request_uid_map[request_id] = uid

                async def Abort(self, request, context):
                    uid = self._request_uid_map.pop(request.request_id, None)  # expect: INV124
                    if uid is not None:
                        self._aborted.put(uid)
        '''),
        Invalid('''
            import threading

            class BlockStore:
                def __init__(self, folder):
                    self._lock = threading.Lock()
                    self._blocks = {}
                    self._scan(folder)
                    self._writer = threading.Thread(target=self._write_loop, daemon=True)
                    self._writer.start()

                def _scan(self, folder):
                    for path in folder.iterdir():
                        self._blocks[path.stem] = path  # expect: INV124

                async def rescan(self, folder):
                    self._scan(folder)

                def _write_loop(self):
                    for name, path in iter(self._queue.get, None):
                        with self._lock:
                            self._blocks[name] = path
        '''),
        Invalid('''
            import asyncio
            import threading

            class Cache:
                def __init__(self):
                    self._lock = threading.RLock()
                    self._index = {}
                    self._writer = threading.Thread(target=self._write_loop, daemon=True)

                def _write_loop(self):
                    for key in iter(self._queue.get, None):
                        with self._lock:
                            self._index.pop(key, None)

                def load(self, key, path):
                    if not path.exists():
                        self._index.pop(key, None)  # expect: INV124
                        return None
                    return path.read_bytes()

                async def read(self, key, path):
                    return await asyncio.to_thread(self.load, key, path)
        '''),
    ]
    VALID = [
        Valid('''
            import threading

            class MlxServicer:
                def __init__(self):
                    self._gen_lock = threading.Lock()
                    self._pending_lock = threading.Lock()
                    self._request_uid_map = {}
                    self._aborted_request_ids = set()
                    self._thread = threading.Thread(target=self._generation_loop, daemon=True)

                def _generation_loop(self):
                    while True:
                        with self._pending_lock:
                            aborted, self._aborted_request_ids = self._aborted_request_ids, set()
                        for request_id in aborted:
                            self._request_uid_map.pop(request_id, None)
                        for request_id, uid in self._insert_pending():
                            self._request_uid_map[request_id] = uid

                async def Abort(self, request, context):
                    with self._pending_lock:
                        self._aborted_request_ids.add(request.request_id)
        '''),
        Valid('''
            import threading

            class PagedCache:
                def __init__(self):
                    self._lock = threading.RLock()
                    self._by_hash = {}

                def cache_block(self, block):
                    with self._lock:
                        self._by_hash[block.hash] = block.id

                def forget(self, block_hash):
                    with self._lock:
                        self._by_hash.pop(block_hash, None)

                def allocate(self, count):
                    with self._lock:
                        for block in self._free_blocks(count):
                            self._evict(block)

                def _evict(self, block):
                    self._by_hash.pop(block.hash, None)
        '''),
        Valid('''
            import threading

            class BlockStore:
                def __init__(self, folder):
                    self._lock = threading.Lock()
                    self._blocks = {}
                    self._scan(folder)
                    self._writer = threading.Thread(target=self._write_loop, daemon=True)
                    self._writer.start()

                def _scan(self, folder):
                    for path in folder.iterdir():
                        self._blocks[path.stem] = path

                def _write_loop(self):
                    for name, path in iter(self._queue.get, None):
                        with self._lock:
                            self._blocks[name] = path
        '''),
        Valid('''
            import threading

            class Index:
                def __init__(self):
                    self._lock = threading.Lock()
                    self._entries = {}

                def remove(self, key):
                    with self._lock:
                        return self._entries.pop(key, None)

            class Cache:
                def __init__(self):
                    self._lock = threading.RLock()
                    self._index = Index()
                    self._writer = threading.Thread(target=self._write_loop, daemon=True)

                def _write_loop(self):
                    for key in iter(self._queue.get, None):
                        with self._lock:
                            self._index.remove(key)

                def load(self, key, path):
                    if not path.exists():
                        self._index.remove(key)  # Index takes its own lock
                        return None
                    return path.read_bytes()
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.blocks = Blocks(ctx)
        self.writes: dict[str, list[_Write]] = {}
        self.threaded = False
        # Calls of this file's methods: callee key -> [(caller key, holds a lock there)].
        self.callers: dict[str, list[tuple[str, bool]]] = {}
        # Keys of names and attributes passed as arguments (a method handed to a thread or a callback).
        self.handed: set[str] = set()
        # The thread each def starts on, where the file says: async defs on the loop, thread entries their own.
        self.seeds: dict[str, set[str]] = {}

    def visit_With(self, node: cst.With) -> None:
        self.blocks.enter_with(node)

    def leave_With(self, node: cst.With) -> None:
        self.blocks.leave_with(node)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        qual = self.ctx.resolve(func)
        if qual and qual.startswith(_THREADING):
            self.threaded = True
        if isinstance(func, cst.Attribute) and func.attr.value in _MUTATORS:
            self._write(func.value, node)
        key = self.ctx.key(func)
        here = self._function_key()
        if key and here:
            self.callers.setdefault(key, []).append((here, bool(self._locks())))
        entry = self._thread_entry(node, qual)
        if entry:
            self.seeds.setdefault(entry, set()).add(f"the thread running `{entry.rsplit('.', 1)[-1]}`")
        for arg in node.args:  # `Thread(target=self._scan)`: runs it later, on some thread
            handed = self.ctx.key(arg.value) if isinstance(arg.value, cst.Name | cst.Attribute) else None
            if handed:
                self.handed.add(handed)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        if isinstance(node.target, cst.Subscript):
            self._write(node.target.value, node.target)

    def visit_Del(self, node: cst.Del) -> None:
        if isinstance(node.target, cst.Subscript):
            self._write(node.target.value, node.target)

    def _write(self, container: cst.BaseExpression, node: cst.CSTNode) -> None:
        text = dotted(container)
        frame = self.ctx.scope.function()
        if not text or not text.startswith("self.") or text.count(".") != 1 or frame is None:
            return
        if frame.name == "__init__":
            return
        key = self.ctx.key(container)
        function = self._function_key() or frame.name
        if frame.kind is Kind.ASYNC:
            self.seeds.setdefault(function, set()).add(_LOOP)
        write = _Write(node, self.ctx.statement, function, self._locks())
        self.writes.setdefault(key or text, []).append(write)

    def _locks(self) -> frozenset[str]:
        return frozenset(
            dotted(w.expr) or "lock" for w in self.blocks.withs if not w.is_async and is_lock(w.expr, self.ctx)
        )

    def _function_key(self) -> str | None:
        frame = self.ctx.scope.function()
        if frame is None:
            return None
        owner = self.ctx.scope.method_class()
        key = f"{owner}.{frame.name}" if owner else frame.name
        if frame.kind is Kind.ASYNC:
            self.seeds.setdefault(key, set()).add(_LOOP)
        return key

    def _thread_entry(self, call: cst.Call, qual: str | None) -> str | None:
        """The key of the callable `call` runs on another thread (a `Thread`'s target, an executor's or
        `to_thread`'s work), or None."""
        if terminal(call.func) in HANDOFF_NAMES:
            work = handoff(call, self.ctx)
            target = work.target if work is not None else None
        elif qual in THREAD_CLASSES:
            target = keyword(call, "target")
        else:
            return None
        target = unwrap_callable(target, self.ctx)
        return self.ctx.key(target) if isinstance(target, cst.Name | cst.Attribute) else None

    def _threads(self) -> dict[str, set[str]]:
        """The threads each def of the file runs on, where the file shows them: its own (an async def's loop,
        a thread entry's thread) and those of every def that calls it directly."""
        threads = {key: set(roles) for key, roles in self.seeds.items()}
        changed = True
        while changed:
            changed = False
            for callee, sites in self.callers.items():
                inherited = set().union(*(threads.get(caller, ()) for caller, _ in sites))
                if not inherited <= threads.setdefault(callee, set()):
                    threads[callee] |= inherited
                    changed = True
        return threads

    def _always_locked(self) -> set[str]:
        """Methods every call of which, in this file, holds a lock (directly or through such a caller)."""
        found: set[str] = set()
        changed = True
        while changed:
            changed = False
            for callee, sites in self.callers.items():
                if callee not in found and all(locked or caller in found for caller, locked in sites):
                    found.add(callee)
                    changed = True
        return found

    def _construction_only(self) -> set[str]:
        """Private methods (`_load`) whose every call in this file is made by a constructor or by
        another such method, and which are never handed on: they run while the object is built,
        before another thread can hold it."""
        found: set[str] = set()
        changed = True
        while changed:
            changed = False
            for callee, sites in self.callers.items():
                name = callee.rsplit(".", 1)[-1]
                if callee in found or callee in self.handed or not name.startswith("_") or name.startswith("__"):
                    continue
                if all(caller.rsplit(".", 1)[-1] in _CONSTRUCTORS or caller in found for caller, _ in sites):
                    found.add(callee)
                    changed = True
        return found

    def _is_container(self, key: str) -> bool:
        """The file assigns this attribute a dict, set or list (a literal, a comprehension, `dict()`,
        `collections.OrderedDict()`, ...)."""
        for assignment in self.ctx.facts.assigned.get(key, ()):
            value = assignment.value
            if isinstance(value, _CONTAINER_LITERALS):
                return True
            if isinstance(value, cst.Call) and (
                assignment.call_qual in _CONTAINER_CLASSES
                or (isinstance(value.func, cst.Name) and value.func.value in _CONTAINER_BUILTINS
                    and assignment.call_qual is None)
            ):
                return True
        return False

    def end(self) -> None:
        if not self.threaded:
            return
        covered = self._always_locked() | self._construction_only()
        threads = self._threads()
        for key, writes in self.writes.items():
            if not self._is_container(key):
                continue
            writes = [w for w in writes if w.function not in covered]
            locked = [w for w in self.writes[key] if w.locks]
            if not locked:
                continue
            attr = key.rsplit(".", 1)[-1]
            for write in writes:
                if write.locks:
                    continue
                pair = next(((w, a, b) for w in locked if w.function != write.function
                             for a in sorted(threads.get(write.function, ())) for b in sorted(threads.get(w.function, ()))
                             if a != b), None)
                if pair is None:
                    continue
                other, here, there = pair
                message = self.message.format(attr=f"self.{attr}", lock=sorted(other.locks)[0], other=other.function,
                                              here=here, there=there)
                self.ctx.report_at(self.id, write.node, write.statement, message)
