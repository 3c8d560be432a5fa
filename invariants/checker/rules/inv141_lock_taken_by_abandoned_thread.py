from __future__ import annotations

import libcst as cst

from mlx_invariants.checker.cancellers import DEADLINES, catches_cancellation, catches_timeout, shutdown_only
from mlx_invariants.checker.names import dotted, terminal
from mlx_invariants.checker.offload import Handoff, handoff, keyword, positional, unwrap_callable
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.walker import descendants

_OWN_SCOPE = (cst.FunctionDef, cst.Lambda, cst.ClassDef)  # their bodies run elsewhere, later, or never


class LockTakenByAbandonedThread(Rule):
    """A coroutine waits for a lock without blocking its loop by handing the lock's `acquire` to a worker
    thread (`await asyncio.to_thread(lock.acquire)`, `run_in_executor(None, lock.acquire)`, or a def of the
    file that acquires and returns holding it). Cancelling that await, by a deadline around it (`wait_for`,
    `asyncio.timeout`), a client that disconnects from a stream, or a task cancelled, stops the waiting
    coroutine but not the thread: `acquire` cannot be interrupted, so the thread takes the lock whenever it
    is freed, and nobody owns it then. The release the coroutine would have made never runs, and every later
    acquirer waits forever: the server's writes, swaps or generations stand still until it restarts.
    nodetool-core bounded its SQLite write lock this way
    (`await asyncio.wait_for(asyncio.to_thread(lock.acquire), timeout=...)`, src/nodetool/runtime/db_sqlite.py@0ce3abe:104): a timed-out writer left a
    thread behind that took the lock with no owner, and every writer after it stalled; its fix dropped the
    `wait_for` but still hands the acquire over, so a cancelled job leaves the same thread behind (:106 and
    `write_lock_context` :311 at 228710b). unslothai/unsloth's studio polls its process-wide swap gate instead,
    with a comment saying why: a cancelled `to_thread(acquire)` took the gate and deadlocked later swaps
    (studio/backend/routes/inference.py, `_acquire_swap_gate`).

    Not reported: `acquire(blocking=False)` (it returns at once); a future made before a `try` and awaited in
    it, whose handler for the cancellation (or the deadline's `TimeoutError`) names a `release`, as a coroutine
    does that gives the lock back once the thread has taken it (Rapid-MLX's process-wide audio lanes,
    vllm_mlx/routes/audio.py, `_CrossLoopAsyncLock`); a def that releases what it acquires (a critical
    section run on the thread, not a hand-off); a lock the coroutine makes for itself (a local bound only to a
    constructor's call, or to a def of the file returning one: no one else waits on it, and a file lock is let
    go when its object is dropped: unsloth's per-call `FileLock` in openai_codex_auth.py, graded false blind);
    a coroutine only the server's shutdown cancels (a plain route handler, start-up code, and with the package
    model whatever only they await) with no deadline of its own.
    """

    id = "INV141"
    catches = ("a lock's blocking `acquire` handed to a worker thread from a coroutine: a cancelled or timed-out "
               "await leaves the thread to take the lock, and nothing releases it")
    message = (
        "`{how}` hands `{lock}.acquire` to a worker thread: when this await is cancelled{deadline}, the thread "
        "still takes `{lock}` once it is free, and nothing releases it, so every later acquirer waits forever; "
        "poll `{lock}.acquire(blocking=False)` between short `await asyncio.sleep(...)`s, or on cancellation "
        "wait for the thread and release the lock before re-raising"
    )
    known_problems = (
        "The lock is known by the `acquire` handed over, whatever its type (a `threading.Lock`, a semaphore, a "
        "`filelock.FileLock`): all of them are taken by a thread that cannot be stopped. A def of another module "
        "that acquires is not followed, nor a helper named for acquiring (`acquire_for(owner)`). A handler that "
        "gives the lock back by other means than a `release` (a flag the next holder reads) is not recognised."
    )
    # Opt-in: away from the repository it was written from (nodetool-core, whose two corpus cases it detects), none
    # of its findings was graded true blind: unsloth's per-call FileLock false (now left out), MinerU's predictor
    # guard arguable (one request at a time on macOS, its parsing tasks cancelled only at shutdown; set n). Whether
    # anything cancels the await while another acquirer waits is more than the code around it says.
    default_enabled = False
    triggers = (("acquire",), ("to_thread", "run_in_executor", "run_sync"))

    INVALID = [
        Invalid('''
            import asyncio
            import threading

            WRITE_LOCK = threading.Lock()


            class Writer:
                async def begin(self):
                    await asyncio.wait_for(asyncio.to_thread(WRITE_LOCK.acquire), timeout=30)  # expect: INV141
                    self.holding = True

                def end(self):
                    if self.holding:
                        WRITE_LOCK.release()
        '''),
        Invalid('''
            import asyncio
            from contextlib import asynccontextmanager

            from filelock import FileLock


            CREDENTIALS = FileLock("/var/lib/app/credentials.lock", timeout=30)


            @asynccontextmanager
            async def credentials_guard():
                await asyncio.to_thread(CREDENTIALS.acquire)  # expect: INV141
                try:
                    yield
                finally:
                    await asyncio.to_thread(CREDENTIALS.release)
        '''),
        Invalid('''
            import asyncio
            import threading


            class Lane:
                def __init__(self):
                    self._lock = threading.Lock()

                def _take(self):
                    self._lock.acquire()

                async def __aenter__(self):
                    loop = asyncio.get_running_loop()
                    await loop.run_in_executor(None, self._take)  # expect: INV141
                    return self

                async def __aexit__(self, *exc):
                    self._lock.release()
        '''),
        Invalid('''
            import asyncio
            import threading

            from fastapi import FastAPI

            app = FastAPI()
            SAVE = threading.Lock()


            @app.post("/save")
            async def save(state: dict):
                await asyncio.wait_for(asyncio.to_thread(SAVE.acquire), timeout=5)  # expect: INV141
                try:
                    await asyncio.to_thread(write, state)
                finally:
                    SAVE.release()
        '''),
        Invalid('''
            import asyncio
            import threading

            SLOTS = threading.BoundedSemaphore(2)


            async def generate(engine, prompt):
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(None, lambda: SLOTS.acquire(timeout=60))  # expect: INV141
                try:
                    return await loop.run_in_executor(None, engine.generate, prompt)
                finally:
                    SLOTS.release()
        '''),
    ]
    VALID = [
        Valid('''
            import asyncio
            from contextlib import asynccontextmanager

            from filelock import FileLock


            def _lock_for(name):
                return FileLock(f"/tmp/{name}.lock", timeout=30)


            @asynccontextmanager
            async def credentials_guard(name):
                lock = _lock_for(name)
                await asyncio.to_thread(lock.acquire)
                try:
                    yield
                finally:
                    await asyncio.to_thread(lock.release)
        '''),
        Valid('''
            import asyncio
            import threading


            class Lane:
                def __init__(self):
                    self._lock = threading.Lock()

                async def __aenter__(self):
                    taken = asyncio.ensure_future(asyncio.to_thread(self._lock.acquire))
                    try:
                        await asyncio.shield(taken)
                    except asyncio.CancelledError:
                        taken.add_done_callback(lambda _: self._lock.release())
                        raise
                    return self

                async def __aexit__(self, *exc):
                    self._lock.release()
        '''),
        Valid('''
            import asyncio
            import threading

            SWAP = threading.Lock()


            async def swap(load):
                while not SWAP.acquire(blocking=False):
                    await asyncio.sleep(0.02)
                try:
                    await asyncio.to_thread(load)
                finally:
                    SWAP.release()
        '''),
        Valid('''
            import asyncio
            import threading

            SAVE = threading.Lock()


            def _save(state, path):
                SAVE.acquire()
                try:
                    state.write(path)
                finally:
                    SAVE.release()


            async def checkpoint(state, path):
                await asyncio.wait_for(asyncio.to_thread(_save, state, path), timeout=60)
        '''),
        Valid('''
            import asyncio
            import threading

            from fastapi import FastAPI

            from app.store import write

            app = FastAPI()
            SAVE = threading.Lock()


            async def _take():
                await asyncio.to_thread(SAVE.acquire)


            @app.post("/save")
            async def save(state: dict):
                await _take()
                try:
                    await asyncio.to_thread(write, state)
                finally:
                    SAVE.release()
        ''', files={"app/store.py": "def write(state):\n    print(state)\n"}),
        Valid('''
            import asyncio
            import threading

            from fastapi import FastAPI

            app = FastAPI()
            SAVE = threading.Lock()


            @app.post("/save")
            async def save(state: dict):
                await asyncio.to_thread(SAVE.acquire)
                try:
                    await asyncio.to_thread(state.write)
                finally:
                    SAVE.release()
        '''),
        Valid('''
            import asyncio
            import threading

            GATE = threading.Lock()


            async def try_gate():
                return await asyncio.to_thread(GATE.acquire, False)
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.found: list[tuple[cst.FunctionDef, cst.Call, cst.CSTNode, str, bool]] = []

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.asynchronous is None:
            return
        if shutdown_only(node):
            return  # a plain route handler (one with no deadline of its own) or start-up code
        guarded = _guarded(node, self.ctx)
        for statement in descendants(node.body, _OWN_SCOPE):
            if type(statement) is not cst.SimpleStatementLine or _binds(statement) & guarded:
                continue  # `taken = ensure_future(to_thread(lock.acquire))`, awaited in a guarded `try`
            calls = [c for c in descendants(statement, _OWN_SCOPE) if type(c) is cst.Call]
            for call in calls:
                work = handoff(call, self.ctx)
                lock = _acquired(work, self.ctx) if work is not None else None
                if lock is not None:
                    timed = any(terminal(c.func) in DEADLINES for c in calls)
                    self.found.append((node, call, statement, lock, timed))

    def end(self) -> None:
        # Decided once the walk has seen the locals each coroutine assigns after its `def` line.
        for function, call, statement, lock, timed in self.found:
            if not _made_here(lock, function, self.ctx):
                self.ctx.report_at(self.id, call, statement, self.message.format(
                    how=dotted(call.func) or "to_thread", lock=lock, deadline=" or times out" if timed else ""))


def _acquired(work: Handoff, ctx) -> str | None:
    """The lock whose blocking `acquire` the thread of `work` runs and keeps, as written; else None."""
    target = unwrap_callable(work.target, ctx)
    if isinstance(target, cst.Attribute) and target.attr.value == "acquire":
        first = positional(work.call, 2 if work.how == "run_in_executor" else 1)
        given = keyword(work.target, "blocking") if isinstance(work.target, cst.Call) else None
        if _false(first) or _false(given) or (isinstance(work.target, cst.Call) and _false(positional(work.target, 1))):
            return None
        return dotted(target.value)
    if isinstance(target, cst.Lambda):
        return _blocking_acquire(target.body)
    if isinstance(target, cst.Name | cst.Attribute):
        locks = set()
        for function in ctx.facts.by_key.get(ctx.key(target) or "", ()):
            node = function.node
            if not isinstance(node, cst.FunctionDef) or node.asynchronous is not None:
                return None
            calls = [c for c in descendants(node.body, _OWN_SCOPE) if type(c) is cst.Call]
            taken = {lock for c in calls if (lock := _blocking_acquire(c)) is not None}
            released = {dotted(c.func.value) for c in calls
                        if isinstance(c.func, cst.Attribute) and c.func.attr.value == "release"}
            if not taken or taken & released:
                return None
            locks |= taken
        return min(locks) if locks else None
    return None


def _made_here(lock: str, function: cst.FunctionDef, ctx) -> bool:
    """`lock` is a local `function` binds only to objects made for this call: a constructor's (`FileLock(path)`)
    or a def of the file that returns one. Nothing else can wait on such a lock, and a file lock is let go
    when its object is dropped (unsloth's studio builds one per call, openai_codex_auth.py `_provider_file_lock`,
    graded false blind)."""
    made = [a.value for a in ctx.facts.assigned.get(lock, ()) if a.scope == id(function)]
    return bool(made) and all(isinstance(v, cst.Call) and _constructs(v, ctx) for v in made)


def _constructs(call: cst.Call, ctx) -> bool:
    """A class's call (its name capitalized), or a call of defs of the file that each return only such calls."""
    name = terminal(call.func) or ""
    if name[:1].isupper():
        return True
    defs = [f.node for f in ctx.facts.by_key.get(ctx.key(call.func) or "", ())]
    returns = [n.value for d in defs for n in descendants(d.body, _OWN_SCOPE) if type(n) is cst.Return]
    return bool(defs) and bool(returns) and all(
        isinstance(v, cst.Call) and (terminal(v.func) or "")[:1].isupper() for v in returns)


def _blocking_acquire(expr: cst.BaseExpression) -> str | None:
    """`X.acquire()` that may block (not `acquire(False)`, not `blocking=False`): X as written."""
    if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "acquire"):
        return None
    if _false(positional(expr, 0)) or _false(keyword(expr, "blocking")):
        return None
    return dotted(expr.func.value)


def _false(expr: cst.BaseExpression | None) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "False"


def _guarded(function: cst.FunctionDef, ctx) -> set[str]:
    """The names awaited in the body of a `try` of `function` whose handler for a cancellation or a timeout
    names a `release`: a future made before the `try` and awaited in it, whose lock the handler gives back
    once the thread has taken it. A hand-off inside such a `try` is still reported: its handler has no
    future to wait on, and a `release` before the thread has taken the lock gives back nothing."""
    names: set[str] = set()
    for attempt in descendants(function.body, _OWN_SCOPE):
        if type(attempt) is not cst.Try:
            continue
        if any((catches_cancellation(h, ctx) or catches_timeout(h, ctx))
               and any(type(n) is cst.Name and n.value == "release" for n in descendants(h.body))
               for h in attempt.handlers):
            names.update(n.value for wait in descendants(attempt.body, _OWN_SCOPE) if type(wait) is cst.Await
                         for n in descendants(wait, _OWN_SCOPE) if type(n) is cst.Name)
    return names


def _binds(statement: cst.SimpleStatementLine) -> set[str]:
    """The plain names a simple statement assigns (`x = ...`, `x: T = ...`)."""
    names: set[str] = set()
    for small in statement.body:
        if type(small) is cst.Assign:
            names.update(t.target.value for t in small.targets if type(t.target) is cst.Name)
        elif type(small) is cst.AnnAssign and type(small.target) is cst.Name:
            names.add(small.target.value)
    return names
