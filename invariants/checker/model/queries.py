"""Findings the package model gives: rules asked of `graph.Package`, one function per rule.

Each yields `ModelFinding`s for one module of the package; `phase.py` places them in their
files, applies suppressions and drops what the per-file rules already reported at the same
place. No libcst here: a re-run of a changed tree answers these without importing it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from mlx_invariants.checker.model.graph import (
    ANY_MLX, BLOCKING, GENERATION, HTTP_CALLS, INFERENCE, ITER, RUN, UNGUARDED, WAITING, Key, Package, made_by,
)
from mlx_invariants.checker.model.handed import handed, serves_no_one
from mlx_invariants.checker.model.summary import (
    DEFAULT_POOL, ITERATED, METAL, ONE_THREAD, OWNER, PLAIN, RETURNED, THREAD, Call, Function, Offload, Place,
)

# The rules' own messages: the classes of INV107 and INV108 use them.
ON_LOOP_MESSAGE = "{what} runs MLX on the event loop thread: hand it to the owner thread and await the result"
OFF_OWNER_MESSAGE = (
    "`{target}` reaches MLX ({what}) on {where}: before MLX 0.31.2 those threads share one stream, so two "
    "calls can be inside Metal at once; from 0.31.2 a lazy array or an `mx.new_stream` stream from another "
    "thread (mlx-lm's generation stream before 0.31.3) raises \"There is no Stream(...) in current thread\" "
    "there; run it on the owner thread (a "
    "dedicated thread, or an executor with one worker)"
)


LOCKED_GENERATION_MESSAGE = (
    "`{target}` runs a generation ({what}) on {where}, one at a time under a lock, but from MLX 0.31.2 the "
    "library's generation stream (mlx-lm's before 0.31.3, mlx-vlm's before 0.5.0) belongs to the thread that "
    "imported it and raises \"There is no Stream(gpu, N) in current thread\" on any other; run it on the owner "
    "thread (a dedicated thread, or an executor with one worker), or use mlx-lm 0.31.3 or later"
)
# A generation handed over one at a time is untrue where the project runs only MLX before 0.31.2 (one shared
# stream, and the lock keeps a second thread out of it) and where the library's stream is per thread.
LOCKED_GENERATION_REQUIRES = ("from:thread-local-streams", "thread-local-generation-stream")


def requires(generates: bool) -> tuple[str, ...]:
    """The facts under which MLX work on a thread that changes per call is fine (INV107): each thread's
    own streams, and, for a generation, the library's thread-local generation stream (mlx_facts.py)."""
    return ("thread-local-streams", "thread-local-generation-stream") if generates else ("thread-local-streams",)


@dataclass(frozen=True)
class ModelFinding:
    rule: str
    place: Place
    message: str
    requires: tuple[str, ...] = ()  # the MLX facts under which it is not true (mlx_facts.py)


def blocking_mlx_on_loop(package: Package, module: str) -> Iterator[ModelFinding]:
    """INV108: an `async def` that calls a sync function of the package reaching blocking MLX
    (through plain calls, not through a thread handoff), or iterates a generator that does.

    As in the per-file rule, a call in the arm of a mode `if` whose other arm hands work to a
    thread is the server's mode without that worker, and the MLX of an engine loop that owns MLX
    on the loop's thread (`Package.owns_on_loop`) is that owner's: neither is reported. An object the loop steps itself (`self.step()` reaching
    `self.batch_generator.next()` in this module) belongs to the loop: the steps are reported,
    not its other calls there (its `close()` at shutdown)."""
    summary = package.summary(module)
    if summary is None:
        return
    found: list[tuple[Call, ModelFinding, bool]] = []  # a call, its finding, and whether an MLX-owning loop makes it
    owned: set[str] = set()
    for name, fn in summary.functions.items():
        if not fn.is_async or not package.on_loop((module, name)):  # declared to run on the owner thread
            continue
        owner = package.owns_on_loop((module, name))
        for call in fn.calls:
            if (fn.in_fallback(call.place.line) or package.preloaded((module, name), call.place.line)
                    or not package.can_run((module, name), call.place.line)):
                continue  # the mode without the worker the other arm hands the work to, set-up done once, dead code
            if fn.before_serving(call.place.line):
                continue  # start-up, before the server serves anyone (checker/startup.py)
            node = _sync_reach(package, module, call, BLOCKING)
            if node is None:
                continue
            what, place = _described(call, node, " -> ".join([name, *(package.chain(BLOCKING, node) or [])]))
            found.append((call, ModelFinding("INV108", place, ON_LOOP_MESSAGE.format(what=what)), owner))
            for (mod, _), text in [((module, name), call.text), *package.links(BLOCKING, node)]:
                receiver, _, method = text.rpartition(".")
                if mod == module and method in _STEPS and receiver not in ("", "self", "cls"):
                    owned.add(receiver)
    for call, finding, owners in found:
        receiver, _, method = call.text.rpartition(".")
        if (receiver in owned and method not in _STEPS) or owners:
            continue
        yield finding


_STEPS = frozenset({"next", "next_generated", "step"})


def _any_lock(text: str) -> bool:
    """Every guard a summary keeps counts: they are the `with` blocks of lock-names and declared MLX locks."""
    return True


def mlx_handed_to_default_pool(package: Package, module: str) -> Iterator[ModelFinding]:
    """INV107: a callable that reaches MLX (through any module) handed to the default thread pool,
    by `asyncio.to_thread` / `run_in_executor(None, ...)` or by a package helper that forwards its
    parameter there (`await self.run_blocking(self.engine.generate)`); and a generator that reaches MLX
    stepped there (`run_in_executor(None, next, gen)`, a lambda or nested def calling `next(gen)` or looping
    over it), made in the same def or handed in by the package's callers: heylookitsanllm's stream wrapper
    stepped every provider's generation on the default pool, one `next()` per chunk
    (src/heylook_llm/streaming_utils.py@4ce23f9:56), fixed in its next commits by one single-worker executor
    per stream; reported at that handoff, where the fix goes. Left out: a handoff at
    start-up (a lifespan before its `yield`, a start-up hook), as `_outside_inferred` leaves it out:
    nothing is served yet, so no request's MLX can be inside Metal beside it (the hazard before
    MLX 0.31.2; `requires` drops the finding from 0.31.2 on). Issue 23, set c: smart-home's lifespan
    preloading three models one after another (belle/main.py@4e65c3a:48-51), graded arguable blind. Nor a
    handoff made under a lock (`async with self._gen_lock: await asyncio.to_thread(...)`): one call at a time
    while it is held; a cancel that frees the lock early is INV105's (set f: whisper-server's `asr_lock`,
    src/cmd/http.py@5c61b0a:309, 318, and mlx-tts-studio's `_gen_lock`, app/app.py@b76e1b8:676, graded
    false blind). A generation handed over so is reported only where it can fail all the same: from MLX 0.31.2,
    with a generation library whose stream is made at import on one thread (mlx-lm before 0.31.3), not where
    the project runs only MLX before 0.31.2 (set o: hrhrng/tts-router's `_gen_lock` with a lock file pinning
    MLX 0.31.0, server.py@e01153b:295, 413, 850, graded arguable and false blind)."""
    summary = package.summary(module)
    if summary is None:
        return
    for name, fn in summary.functions.items():
        for call in fn.calls:
            if fn.before_serving(call.place.line) or not package.can_run((module, name), call.place.line):
                continue
            helper, _ = package.callee(module, call.target)
            for ref, forward in package.forwarded(helper, call):
                work, _ = package.callee(module, ref)
                chain = package.chain(ANY_MLX, (work, RUN)) if work is not None else None
                locked = fn.guarded(call.place.line, _any_lock)
                if chain:
                    where = f"the default thread pool via `{call.text}`, which hands it to `{forward.how}` (a different thread each call)"
                    finding = _off_owner(call.place, chain[0], " -> ".join(chain[1:]), where,
                                         package.chain(GENERATION, (work, RUN)) is not None,  # type: ignore[arg-type]
                                         _one_at_a_time(package, work, locked))  # type: ignore[arg-type]
                    if finding is not None:
                        yield finding
        for work in fn.offloads:
            if (work.pool != DEFAULT_POOL or fn.before_serving(work.place.line)
                    or not package.can_run((module, name), work.place.line)):
                continue
            for found, mode, target, source in _offloaded(package, (module, name), work):
                if isinstance(found, str):  # a library's MLX generator, made by the caller and stepped here
                    chain, generates, alone = [found], True, work.serialized
                else:
                    chain = package.chain(ANY_MLX, (found, mode))
                    generates = package.chain(GENERATION, (found, mode)) is not None
                    alone = bool(chain) and _one_at_a_time(package, found, work.serialized)
                if chain:
                    where = f"the default thread pool via {work.how} (a different thread each call)"
                    what = " -> ".join(chain[1:]) if source is None else f"the generator {source} hands it: {' -> '.join(chain)}"
                    finding = _off_owner(work.place, target, what, where, generates, alone)
                    if finding is not None:
                        yield finding
                        break


def _offloaded(package: Package, key: Key, work: Offload) -> Iterator[tuple[Key | str, str, str, str | None]]:
    """What a handoff runs, how, how to name it and where it came from: the callable it hands over, run;
    else the generator the callable steps, iterated: one a call of this function made (`next(gen)` of
    `gen = engine.stream()`), or each the package's callers hand to the parameter it steps, or that its
    class's constructor was handed (`$Class.__init__:param`); a library's MLX generator
    (`mlx_lm.stream_generate`) a caller made is named by its library name instead of a function of the package."""
    found, _ = package.callee(key[0], work.target) if work.target is not None else (None, None)
    if found is not None and package.chain(ANY_MLX, (found, RUN)):
        yield found, RUN, work.text, None
        return
    stepped = work.stepped
    if stepped is None:
        return
    if not stepped.startswith("$"):
        made, _ = package.callee(key[0], made_by(stepped))
        if made is not None:
            yield made, ITER, f"next({stepped})", None
        return
    # `$param` of this function, or `$Class.__init__:param` for what a constructor stored on `self`
    owner, _, param = stepped[1:].rpartition(":")
    for module, ref, caller in package.handed_generators((key[0], owner) if owner else key, param):
        made, symbol = package.callee(module, made_by(ref))
        if made is not None:
            yield made, ITER, param, caller
        elif symbol is not None and symbol.kind == "external" and _library_generator(symbol.module):
            yield symbol.module, ITER, param, caller


def _library_generator(qual: str) -> bool:
    """`qual` names a library's MLX generator (`mlx_lm.stream_generate`). Asked only while the model answers
    queries: `classify` pulls in libcst, which a re-run of an unchanged tree never imports."""
    from mlx_invariants.checker.model import classify

    return classify.is_generator(qual)


def off_owner_wording(target: str, what: str, where: str, generates: bool, alone: bool
                      ) -> tuple[str, tuple[str, ...]] | None:
    """INV107's message and `requires` for MLX handed to a thread that changes per call, for the per-file rule
    and the package model alike: none where the handoffs run one at a time (`alone`) and make no generation;
    one true only from MLX 0.31.2, with a generation library's stream made on the importing thread, where they
    run one at a time and generate (the lock keeps a second thread out of Metal, not the stream on the wrong
    thread); else the hazards of both eras."""
    if alone and not generates:
        return None
    if alone:
        return LOCKED_GENERATION_MESSAGE.format(target=target, what=what, where=where), LOCKED_GENERATION_REQUIRES
    return OFF_OWNER_MESSAGE.format(target=target, what=what, where=where), requires(generates)


def _off_owner(place: Place, target: str, what: str, where: str, generates: bool, alone: bool) -> ModelFinding | None:
    worded = off_owner_wording(target, what, where, generates, alone)
    return ModelFinding("INV107", place, *worded) if worded is not None else None


def _one_at_a_time(package: Package, work: Key, locked: bool) -> bool:
    """Two threads running `work` cannot be in Metal at once (the hazard INV107 names before MLX 0.31.2): it
    is handed over under a lock (`locked`), takes one lock of the process around all its MLX, or runs all its
    MLX under the package's MLX lock."""
    return locked or _self_serialized(package, work) or _serialized(package, work)


def _self_serialized(package: Package, work: Key) -> bool:
    """`work` takes one lock of the process (a `with` on a name that is not an object's attribute:
    `with _load_lock:`, `with MLX_LOCK:`) around every MLX call it makes and every call of it that reaches
    MLX: two threads running it are never in Metal together. Issue 23, set f: a lazy load under the module's
    `_load_lock` (qwen-text-server/server.py@58617bd:152, 494, 537, graded arguable blind)."""
    fn = package.function(work)
    if fn is None or not fn.guards:
        return False
    shared = [(first, last) for first, last, text in fn.guards if not text.startswith(("self.", "cls."))]
    covered = lambda line: any(first <= line <= last for first, last in shared)  # noqa: E731
    if any(not covered(touch.line) for touch in fn.mlx):
        return False
    for call in fn.calls:
        target, _ = package.callee(work[0], call.target)
        if target is not None and package.chain(ANY_MLX, (target, RUN)) and not covered(call.place.line):
            return False
    return True


def _serialized(package: Package, work: Key) -> bool:
    """All the MLX `work` reaches runs under the package's MLX lock (declared, or inferred: locks.py): two
    pool threads running it cannot be inside Metal at once, the hazard INV107 names before MLX 0.31.2;
    MLX it reaches outside the lock is INV125's to report. A load is judged all the same (the lock's
    reach leaves loads out). Issue 23, set c: smart-home hands its transcription to the pool, and the
    transcription takes the process-wide `mlx_lock` its LLM and TTS take too (belle/stt.py@4e65c3a:301,
    graded false blind)."""
    return UNGUARDED in package.reach and work not in package.loaders and package.chain(UNGUARDED, (work, RUN)) is None


UNGUARDED_MESSAGE = (
    "{what} from `{handler}`, on the event loop, without holding {locks}, declared to guard "
    "MLX: take the lock around it, or hand the work to the owner thread"
)
INFERRED_MESSAGE = (
    "{what} without holding {lock}, which {holders} hold around their MLX (a lock the package shares for MLX, "
    "inferred: no mlx-locks declared): two threads can be inside Metal at once; take the lock around it too, or "
    "hand the work to the owner thread"
)


def mlx_outside_mlx_lock(package: Package, module: str) -> Iterator[ModelFinding]:
    """INV125, lockset completeness: every MLX-reaching path holds the lock that guards MLX. The
    locks are those the project declares (mlx-locks, or `# invariants: mlx-lock` where a lock is
    assigned), else those the package shows it shares for MLX (model/locks.py); with neither, silent."""
    if package.mlx_locks:
        yield from _outside_declared(package, module)
    elif package.inferred_locks:
        yield from _outside_inferred(package, module)


def _outside_declared(package: Package, module: str) -> Iterator[ModelFinding]:
    """A request handler (an `async def` on the event loop) of a family that takes a declared
    lock somewhere: its class (or its module's top level), so another class's handlers are not
    judged by a lock that is not theirs. Reported where a handler leaves the lock out: its own
    MLX call, its call of a sync def that reaches MLX with no declared lock taken on the way, and
    a handoff to a thread (other than the declared owner's) of work that does. A function every
    caller enters with the lock held is judged at its callers."""
    summary = package.summary(module)
    if summary is None:
        return
    locks = " or ".join(f"`{name}`" for name in package.mlx_locks)
    for name, fn in summary.functions.items():
        key = (module, name)
        if not package.on_loop(key) or key in package.held or not package.asks_locks(key):
            continue
        handler = package.display(key)
        if fn.is_async:
            for touch in fn.mlx:
                if touch.kind in UNGUARDED and touch.place is not None and not package.mlx_guarded(key, touch.line):
                    yield ModelFinding("INV125", touch.place, UNGUARDED_MESSAGE.format(
                        what=f"`{touch.text}` runs MLX", handler=handler, locks=locks))
            for call, chain in _unguarded_calls(package, key, fn):
                yield ModelFinding("INV125", call.place, UNGUARDED_MESSAGE.format(
                    what=f"`{call.text}()` reaches MLX ({' -> '.join(chain)})", handler=handler, locks=locks))
        for work, _, chain in _unguarded_handoffs(package, key, fn):
            yield ModelFinding("INV125", work.place, UNGUARDED_MESSAGE.format(
                what=f"`{work.text}`, handed to {work.how}, reaches MLX ({' -> '.join(chain)})", handler=handler,
                locks=locks))


def _outside_inferred(package: Package, module: str) -> Iterator[ModelFinding]:
    """Where the package shares an inferred MLX lock: a request handler on the event loop whose MLX
    runs in Metal without it (its own call, or a sync def it calls), and a handoff, from any
    function, of work that does to a thread other than an owner (a `Thread`, an executor, the
    default pool). Left out: a family that serializes its MLX on an owner of its own (a declared
    owner function or executor, an engine loop owning MLX on the event loop, an executor built with
    one worker: `Package.owned_family`), start-up (MLX run or handed to a pool by a lifespan before its
    `yield` or a start-up hook, loading weights; not a `Thread` started there, which serves), and a
    function every caller enters with the lock held (judged at its callers)."""
    summary = package.summary(module)
    if summary is None:
        return
    for name, fn in summary.functions.items():
        key = (module, name)
        if key in package.held or package.declared_owner(key) or package.owned_family(key):
            continue
        handler = package.display(key)
        if fn.is_async and package.on_loop(key) and key not in package.loaders and not package.owns_on_loop(key):
            for touch in fn.mlx:
                if (touch.kind in METAL and touch.place is not None and not fn.before_serving(touch.line)
                        and not package.mlx_guarded(key, touch.line)):
                    yield _inferred(package, touch.place, f"`{touch.text}` runs MLX in `{handler}`, on the event loop,")
            for call, chain in _unguarded_calls(package, key, fn):
                if not fn.before_serving(call.place.line):
                    yield _inferred(package, call.place, f"`{call.text}()` reaches MLX ({' -> '.join(chain)}) from "
                                                         f"`{handler}`, on the event loop,")
        for work, found, chain in _unguarded_handoffs(package, key, fn):
            # Work handed over at start-up runs before serving; a thread started there serves for the server's life.
            startup = work.pool != THREAD and fn.before_serving(work.place.line)
            if work.pool == ONE_THREAD or startup or package.owned_family(found):
                continue
            yield _inferred(package, work.place, f"`{work.text}`, handed to {work.how} by `{handler}`, reaches MLX "
                                                 f"({' -> '.join(chain)})")


def _inferred(package: Package, place: Place, what: str) -> ModelFinding:
    """A finding against the package's inferred MLX locks, naming them and the functions that hold them."""
    locks = sorted(package.inferred_locks.values())
    holders = sorted({key for _, keys in locks for key in keys})
    names = ", ".join(f"`{package.display(k)}`" for k in holders[:3]) + (", ..." if len(holders) > 3 else "")
    return ModelFinding("INV125", place, INFERRED_MESSAGE.format(
        what=what, lock=" or ".join(f"`{text}`" for text, _ in locks),
        holders=f"{names} ({len({k[0] for k in holders})} modules)"))


def _unguarded_calls(package: Package, key: Key, fn: Function) -> Iterator[tuple[Call, list[str]]]:
    """The calls of `fn` outside every MLX lock of a sync def that reaches MLX outside them too."""
    for call in fn.calls:
        if package.mlx_guarded(key, call.place.line):
            continue
        target, _ = package.callee(key[0], call.target)
        callee = package.function(target) if target is not None else None
        if callee is None or callee.is_async or callee.opaque or package.declared_owner(target):  # type: ignore[arg-type]
            continue
        modes = (RUN, ITER) if call.use == ITERATED else (RUN,)
        node = next(((target, m) for m in modes if package.chain(UNGUARDED, (target, m))), None)  # type: ignore[arg-type]
        if node is not None:
            yield call, package.chain(UNGUARDED, node) or []


def _unguarded_handoffs(package: Package, key: Key, fn: Function) -> Iterator[tuple[Offload, Key, list[str]]]:
    """The handoffs of `fn` outside every MLX lock, to a thread other than the declared owner's, of work
    that reaches MLX outside them: each with the function handed over and the chain to MLX."""
    for work in fn.offloads:
        if work.pool == OWNER or work.target is None or package.mlx_guarded(key, work.place.line):
            continue
        found, _ = package.callee(key[0], work.target)
        if found is None or package.declared_owner(found):
            continue
        chain = package.chain(UNGUARDED, (found, RUN))
        if chain:
            yield work, found, chain


WAIT_ON_LOOP_MESSAGE = (
    "{what} blocks the event loop thread on a wait on another thread (`{wait}`): every request and stream this "
    "loop serves stands still until it returns; hand it to a thread (`await asyncio.to_thread(...)`) or wait the "
    "asyncio way"
)
# Coroutines that run while nothing is served yet or any more: an engine's start-up and teardown, by the names
# engines give them (`start`, `_get_or_start_scheduler`, `shutdown`, `__aexit__`, xinference's `__pre_destroy__`).
_SET_UP_OR_DOWN = re.compile(r"(^|_)(start|startup|warmup|init|initialize|load|shutdown|stop|close|aclose|cleanup|teardown|"
                             r"terminate|dispose|destroy|aexit|exit|del)(_|$)")


def blocking_wait_on_loop(package: Package, module: str) -> Iterator[ModelFinding]:
    """INV130: an `async def` that waits on another thread (model/waits.py), itself or
    through the sync defs of the package it calls. Left out: start-up and teardown coroutines (a
    lifespan, a start-up hook, a def named for starting or shutting down), where nothing is being served; the
    arm of a mode `if` whose other arm hands the same work to a thread (the mode without that
    worker, as INV108 leaves it); modules that serve no one (tests, benchmarks, scripts, a CLI)."""
    yield from _held_on_loop(package, module, "INV130", WAITING, WAIT_ON_LOOP_MESSAGE)


HTTP_ON_LOOP_MESSAGE = (
    "{what} blocks the event loop thread on a sync HTTP call (`{wait}`): every request and stream this loop "
    "serves stands still until the other end answers; use an async client (`httpx.AsyncClient`, awaited) or "
    "hand the call to a thread (`await asyncio.to_thread(...)`)"
)


def blocking_http_on_loop(package: Package, module: str) -> Iterator[ModelFinding]:
    """INV137: an `async def` that makes a sync HTTP call (model/blocking.py), itself or through the sync defs of
    the package it calls; left out as INV130 leaves its waits."""
    yield from _held_on_loop(package, module, "INV137", HTTP_CALLS, HTTP_ON_LOOP_MESSAGE)


INFERENCE_ON_LOOP_MESSAGE = (
    "{what} runs a model's inference on the event loop thread (`{wait}`): every request and stream this loop "
    "serves stands still until it finishes; hand it to a thread (`await asyncio.to_thread(...)`), or to the "
    "worker that owns the model"
)


def blocking_inference_on_loop(package: Package, module: str) -> Iterator[ModelFinding]:
    """INV138: an `async def` that runs a model library's inference (model/blocking.py: an embedding model's
    `encode`, a Whisper transcription, an ONNX session's `run`), itself or through the sync defs of the
    package it calls; left out as INV130 leaves its waits."""
    yield from _held_on_loop(package, module, "INV138", INFERENCE, INFERENCE_ON_LOOP_MESSAGE)


def _held_on_loop(package: Package, module: str, rule: str, level: frozenset[str],
                  message: str) -> Iterator[ModelFinding]:
    """A serving coroutine's sync calls of `level` (the summary's `Function.waits` of that kind), its own or
    reached through the package's sync defs, each worded by `message` (`{what}` the call, `{wait}` the call
    that holds the thread); not a call whose result the coroutine steps on a thread (`to_thread(next, gen)` of
    `gen = stream()`), where that generator's body runs."""
    summary = package.summary(module)
    if summary is None or serves_no_one(module):
        return
    for name, fn in summary.functions.items():
        if not _serving_coroutine(package, module, name, fn):
            continue
        for wait in package.waits((module, name), fn):
            if wait.kind in level and not fn.in_fallback(wait.line):
                yield ModelFinding(rule, wait.place, message.format(  # type: ignore[arg-type]
                    what=f"`{wait.text}()`", wait=wait.text))
        stepped = {work.stepped for work in fn.offloads if work.stepped}  # generators made here, stepped on a thread
        for call in fn.calls:
            node = _sync_reach(package, module, call, level) if not (
                fn.in_fallback(call.place.line) or package.preloaded((module, name), call.place.line)
                or f"{call.target}()" in stepped) else None
            if node is None:
                continue
            _, text = package.links(level, node)[-1]
            what, place = _described(call, node, " -> ".join([name, *(package.chain(level, node) or [])]))
            yield ModelFinding(rule, place, message.format(what=what, wait=text))


def _serving_coroutine(package: Package, module: str, name: str, fn: Function) -> bool:
    """`fn` is a coroutine the server's event loop runs while it serves: not one on a loop of its own, not
    start-up or teardown (a lifespan, a start-up hook, a def named for starting or shutting down), not a test."""
    leaf = name.rsplit(".", 1)[-1]
    return (fn.is_async and package.on_loop((module, name)) and fn.startup is None
            and not _SET_UP_OR_DOWN.search(leaf.lower().strip("_")) and not leaf.startswith("test")
            and not name.startswith("Test"))


def _run_at_startup_only(package: Package, key: Key) -> bool:
    """Every call of `key` the package makes is start-up work: on a line a start-up coroutine runs before serving,
    or in a def named for starting (`init_db`) or itself run at start-up only, and there is one. tumma72/mlx-manager
    scans its model cache in `sync_models_from_cache`, which only `init_db` awaits, from its lifespan
    (backend/mlx_manager/services/model_registry.py@cffa5f2:23, database.py:312)."""
    callers = package.memo.get("callers")
    if callers is None:
        callers = package.memo["callers"] = {}
        for caller, edges in package.edges.items():
            for call, _use, target, _ in edges:
                if target is not None and call is not None:
                    callers.setdefault(target, []).append((caller, call.place.line))
    seen: set[Key] = set()

    def startup(key: Key) -> bool:
        if key in seen:
            return True  # a cycle adds no caller that serves
        seen.add(key)
        sites = callers.get(key, [])
        return bool(sites) and all(
            package.function(caller).before_serving(line)  # type: ignore[union-attr]
            or _STARTS.search(caller[1].rsplit(".", 1)[-1].lower().strip("_")) or startup(caller)
            for caller, line in sites)

    return startup(key)


_STARTS = re.compile(r"(^|_)(start|startup|warmup|init|initialize|setup|bootstrap|prewarm)(_|$)")


OFFLOADED_ON_LOOP_MESSAGE = (
    "`{call}()` runs on the event loop thread, but this package hands the same call to a thread at {where} "
    "(`{how}`): work its own code keeps off the loop stalls every request of it here; hand it over here too"
)


def offloaded_call_on_loop(package: Package, module: str) -> Iterator[ModelFinding]:
    """INV134: a sync call in a serving coroutine of what another function of the package hands to the default
    pool (model/handed.py): its own handoff says the call blocks. Only the coroutine's own calls: followed into
    a sync helper, the evidence met calls the helper makes only on a branch that never runs in service
    (unslothai/unsloth's `_peek_inference_backend` calls the getter the package offloads only when a test has
    patched it, studio/backend/routes/inference.py@015bdef:4819, and sixteen coroutines reached it). Left out as
    INV130 leaves them: start-up and teardown coroutines, the arm of a mode `if` whose other arm hands work to a
    thread, set-up done once, lines that cannot run, modules that serve no one; a coroutine only start-up code
    awaits; and a call INV108 or INV138 reports (it blocks with MLX, or a model's inference)."""
    summary = package.summary(module)
    if summary is None or serves_no_one(module):
        return
    for name, fn in summary.functions.items():
        key = (module, name)
        if not _serving_coroutine(package, module, name, fn):
            continue
        for call in fn.calls:
            line = call.place.line
            if (call.use not in (PLAIN, RETURNED, ITERATED) or fn.in_fallback(line) or fn.in_lazy_setup(line)
                    or package.preloaded(key, line) or not package.can_run(key, line)):
                continue
            target, _ = package.callee(module, call.target)
            callee = package.function(target) if target is not None else None
            if callee is not None and (callee.is_async or callee.opaque):
                continue
            modes = [ITER] if call.use == ITERATED else []
            if callee is None or not callee.is_generator:
                modes.append(RUN)
            found = next(((m, h) for m in modes if (h := handed(package, key, call, m)) is not None), None)
            if (found is None or _sync_reach(package, module, call, BLOCKING) is not None
                    or _sync_reach(package, module, call, INFERENCE) is not None or _run_at_startup_only(package, key)):
                continue
            mode, handoff = found
            place = call.iterated_at if mode == ITER and call.iterated_at is not None else call.place
            yield ModelFinding("INV134", place, OFFLOADED_ON_LOOP_MESSAGE.format(
                call=call.text, where=f"{handoff.module}:{handoff.place.line}", how=handoff.how))


def _sync_reach(package: Package, module: str, call: Call, level: frozenset[str]) -> tuple[Key, str] | None:
    """The node a plain call of a sync def of the package reaches `level` by: the def run, or, for a
    result iterated there, iterated. None when the call names no such def, or it reaches nothing."""
    target, _ = package.callee(module, call.target)
    callee = package.function(target) if target is not None else None
    if callee is None or callee.is_async or callee.opaque:
        return None
    modes = (RUN, ITER) if call.use == ITERATED else (RUN,)
    return next(((target, m) for m in modes if package.chain(level, (target, m))), None)  # type: ignore[arg-type]


def _described(call: Call, node: tuple[Key, str], path: str) -> tuple[str, Place]:
    """How a finding names the call and where it points: at the iteration, when only iterating the
    result runs what the chain reaches."""
    if node[1] == ITER and call.iterated_at is not None:
        return f"iterating `{call.text}()` ({path})", call.iterated_at
    return f"`{call.text}()` ({path})", call.place


STREAM_MESSAGE = (
    "`{name}` is a stream made with `mx.new_stream` when {module} is imported, so it belongs to the importing "
    "thread; {users}: from MLX 0.31.2 a stream exists only on the thread that made it, and there it raises \"There "
    "is no Stream(gpu, N) in current thread\"; make it with `mx.new_thread_local_stream` (every thread gets its "
    "own), or make it on the thread that uses it"
)
LIBRARY_STREAM_MESSAGE = (
    "`{name}` is {library}'s generation stream, made with `mx.new_stream` when {module} is first imported (before "
    "{library} {release}); `{user}` reads it on {roles}: from MLX 0.31.2 a stream exists only on the thread that "
    "made it, and there it raises \"There is no Stream(gpu, N) in current thread\"; use {library} {release} or "
    "later (a thread-local stream), or a stream made on this thread"
)
_LIBRARIES = {"mlx_lm": ("mlx-lm", "0.31.3"), "mlx_vlm": ("mlx-vlm", "0.5.0")}


def stream_off_its_thread(package: Package, module: str) -> Iterator[ModelFinding]:
    """INV131: a stream made at import (`STREAM = mx.new_stream(...)` at module level), read by a function
    the package runs on another thread: reported once, where it is made, naming the readers; and a
    generation library's own `generation_stream` read on another thread, where it is read."""
    summary = package.summary(module)
    if summary is None:
        return
    readers: dict[str, list[str]] = {}
    for use in package.stream_uses():
        if use.made is not None and use.made[0] == module:
            roles = " and ".join(sorted(use.roles))
            readers.setdefault(use.made[1], []).append(
                f"`{package.display(use.user)}` reads it on {roles} (line {use.place.line})"
                if use.user[0] == module else f"`{package.display(use.user)}` reads it on {roles}")
        elif use.library is not None and use.user[0] == module:
            root, _, name = use.library.partition(".")
            library, release = _LIBRARIES[root]
            yield ModelFinding("INV131", use.place, LIBRARY_STREAM_MESSAGE.format(
                name=use.library.rpartition(".")[2], library=library, release=release,
                module=use.library.rpartition(".")[0], user=package.display(use.user),
                roles=" and ".join(sorted(use.roles))), ("from:thread-local-streams", "thread-local-generation-stream"))
    for name, users in readers.items():
        shown = "; ".join(users[:3]) + (f"; and {len(users) - 3} more" if len(users) > 3 else "")
        yield ModelFinding("INV131", summary.streams[name], STREAM_MESSAGE.format(
            name=name, module=module, users=shown), ("from:thread-local-streams",))


QUERIES: dict[str, Callable[[Package, str], Iterator[ModelFinding]]] = {
    "INV107": mlx_handed_to_default_pool,
    "INV108": blocking_mlx_on_loop,
    "INV125": mlx_outside_mlx_lock,
    "INV130": blocking_wait_on_loop,
    "INV131": stream_off_its_thread,
    "INV134": offloaded_call_on_loop,
    "INV137": blocking_http_on_loop,
    "INV138": blocking_inference_on_loop,
}
# Queries asked of modules besides the entry modules (phase.py): INV131 reports where a stream is made,
# which may be a module with no async def and no handoff of its own; INV107 at a helper that steps the
# generators it is handed, whose module may name no MLX.
BEYOND_ENTRIES: dict[str, Callable[[Package], set[str]]] = {"INV131": Package.stream_modules,
                                                             "INV107": Package.stepping_modules}
