"""Findings the package model gives: rules asked of `graph.Package`, one function per rule.

Each yields `ModelFinding`s for one module of the package; `phase.py` places them in their
files, applies suppressions and drops what the per-file rules already reported at the same
place. No libcst here: a re-run of a changed tree answers these without importing it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from mlx_invariants.checker.model.graph import ANY_MLX, BLOCKING, GENERATION, ITER, RUN, UNGUARDED, Package
from mlx_invariants.checker.model.summary import DEFAULT_POOL, ITERATED, OWNER, Call, Place

# The rules' own messages: the classes of INV107 and INV108 use them.
ON_LOOP_MESSAGE = "{what} runs MLX on the event loop thread: hand it to the owner thread and await the result"
OFF_OWNER_MESSAGE = (
    "`{target}` reaches MLX ({what}) on {where}: before MLX 0.31.2 those threads share one stream, so two "
    "calls can be inside Metal at once; from 0.31.2 a lazy array or an `mx.new_stream` stream from another "
    "thread (mlx-lm's generation stream before 0.31.3) raises \"There is no Stream(...) in current thread\" "
    "there; run it on the owner thread (a "
    "dedicated thread, or an executor with one worker)"
)


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
            if fn.in_fallback(call.place.line):
                continue  # the mode without the worker the other arm hands the work to
            if fn.before_serving(call.place.line):
                continue  # start-up, before the server serves anyone (checker/startup.py)
            target, _ = package.callee(module, call.target)
            callee = package.function(target) if target is not None else None
            if callee is None or callee.is_async or callee.opaque:
                continue
            modes = (RUN, ITER) if call.use == ITERATED else (RUN,)
            node = next(((target, m) for m in modes if package.chain(BLOCKING, (target, m))), None)  # type: ignore[arg-type]
            if node is None:
                continue
            chain = package.chain(BLOCKING, node) or []
            path = " -> ".join([name, *chain])
            if node[1] == ITER and call.iterated_at is not None:  # only iterating the result runs MLX
                what, place = f"iterating `{call.text}()` ({path})", call.iterated_at
            else:
                what, place = f"`{call.text}()` ({path})", call.place
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


def mlx_handed_to_default_pool(package: Package, module: str) -> Iterator[ModelFinding]:
    """INV107: a callable that reaches MLX (through any module) handed to the default thread pool,
    by `asyncio.to_thread` / `run_in_executor(None, ...)` or by a package helper that forwards its
    parameter there (`await self.run_blocking(self.engine.generate)`)."""
    summary = package.summary(module)
    if summary is None:
        return
    for fn in summary.functions.values():
        for call in fn.calls:
            helper, _ = package.callee(module, call.target)
            forwards = package.forwards.get(helper) if helper is not None else None
            if not forwards:
                continue
            for arg, ref in call.args:
                param = package.parameter(helper, arg, call) if not ref.startswith("$") else None  # type: ignore[arg-type]
                forward = forwards.get(param or "")
                work, _ = package.callee(module, ref) if forward is not None else (None, None)
                chain = package.chain(ANY_MLX, (work, RUN)) if work is not None else None
                if chain:
                    where = f"the default thread pool via `{call.text}`, which hands it to `{forward.how}` (a different thread each call)"  # type: ignore[union-attr]
                    yield ModelFinding("INV107", call.place, OFF_OWNER_MESSAGE.format(
                        target=chain[0], what=" -> ".join(chain[1:]), where=where),
                        requires(package.chain(GENERATION, (work, RUN)) is not None))  # type: ignore[arg-type]
        for work in fn.offloads:
            if work.pool != DEFAULT_POOL or work.target is None:
                continue
            found, _ = package.callee(module, work.target)
            chain = package.chain(ANY_MLX, (found, RUN)) if found is not None else None
            if chain:
                where = f"the default thread pool via {work.how} (a different thread each call)"
                yield ModelFinding("INV107", work.place, OFF_OWNER_MESSAGE.format(
                    target=work.text, what=" -> ".join(chain[1:]), where=where),
                    requires(package.chain(GENERATION, (found, RUN)) is not None))


UNGUARDED_MESSAGE = (
    "{what} from `{handler}`, on the event loop, without holding {locks}, declared to guard "
    "MLX: take the lock around it, or hand the work to the owner thread"
)


def mlx_outside_declared_lock(package: Package, module: str) -> Iterator[ModelFinding]:
    """INV125, lockset completeness: where the project declares the locks that guard MLX
    (mlx-locks, or `# invariants: mlx-lock` where a lock is assigned), every call of a request
    handler (an `async def` on the event loop) that reaches MLX holds one. A handler's family
    is its class (or its module's top level); only a family that takes a declared lock
    somewhere is asked, so another class's handlers are not judged by a lock that is not
    theirs. Reported where a handler leaves the lock out: its own MLX call, its call of a sync
    def that reaches MLX with no declared lock taken on the way, and a handoff to a thread
    (other than the declared owner's) of work that does. A function every caller enters with
    the lock held is judged at its callers. Silent where no lock is declared."""
    summary = package.summary(module)
    if summary is None or not package.mlx_locks:
        return
    locks = " or ".join(f"`{name}`" for name in package.mlx_locks)
    for name, fn in summary.functions.items():
        key = (module, name)
        if not package.on_loop(key) or key in package.held or not package.asks_locks(key):
            continue
        handler = package.display(key)
        if fn.is_async:
            for touch in fn.mlx:
                if touch.kind in UNGUARDED and touch.place is not None and not fn.guarded(touch.line, package.is_mlx_lock):
                    yield ModelFinding("INV125", touch.place, UNGUARDED_MESSAGE.format(
                        what=f"`{touch.text}` runs MLX", handler=handler, locks=locks))
            for call in fn.calls:
                if fn.guarded(call.place.line, package.is_mlx_lock):
                    continue
                target, _ = package.callee(module, call.target)
                callee = package.function(target) if target is not None else None
                if callee is None or callee.is_async or callee.opaque or package.declared_owner(target):  # type: ignore[arg-type]
                    continue
                modes = (RUN, ITER) if call.use == ITERATED else (RUN,)
                node = next(((target, m) for m in modes if package.chain(UNGUARDED, (target, m))), None)  # type: ignore[arg-type]
                if node is not None:
                    chain = package.chain(UNGUARDED, node) or []
                    yield ModelFinding("INV125", call.place, UNGUARDED_MESSAGE.format(
                        what=f"`{call.text}()` reaches MLX ({' -> '.join(chain)})", handler=handler, locks=locks))
        for work in fn.offloads:
            if work.pool == OWNER or work.target is None or fn.guarded(work.place.line, package.is_mlx_lock):
                continue
            found, _ = package.callee(module, work.target)
            if found is None or package.declared_owner(found):
                continue
            chain = package.chain(UNGUARDED, (found, RUN))
            if chain:
                yield ModelFinding("INV125", work.place, UNGUARDED_MESSAGE.format(
                    what=f"`{work.text}`, handed to {work.how}, reaches MLX ({' -> '.join(chain)})", handler=handler,
                    locks=locks))


QUERIES: dict[str, Callable[[Package, str], Iterator[ModelFinding]]] = {
    "INV107": mlx_handed_to_default_pool,
    "INV108": blocking_mlx_on_loop,
    "INV125": mlx_outside_declared_lock,
}
