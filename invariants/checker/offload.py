"""Thread handoffs: `asyncio.to_thread`, `loop.run_in_executor`, `executor.submit`,
and which thread each one lands on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from mlx_invariants.checker.facts import CallSite, number
from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.names import dotted, terminal
from mlx_invariants.checker.nodes import children

if TYPE_CHECKING:
    from mlx_invariants.checker.facts import FunctionFacts
    from mlx_invariants.checker.walker import FileContext

TO_THREAD = frozenset({
    "asyncio.to_thread", "asyncio.threads.to_thread", "anyio.to_thread.run_sync", "trio.to_thread.run_sync",
})
THREAD_POOLS = frozenset({"concurrent.futures.ThreadPoolExecutor", "concurrent.futures.thread.ThreadPoolExecutor"})
POOLS = THREAD_POOLS | {"concurrent.futures.ProcessPoolExecutor", "concurrent.futures.process.ProcessPoolExecutor"}
# Cheap first test: a call can only be a handoff if its callee ends in one of these.
HANDOFF_NAMES = frozenset({"to_thread", "run_sync", "run_in_executor", "submit"})
EXECUTOR_NAMES = ["*executor*", "*pool*"]  # a receiver of `.submit` known by name as a pool


@dataclass(frozen=True)
class Handoff:
    """`call` runs `target` on another thread: `executor`'s, or the default pool's when None."""

    call: cst.Call
    how: str
    target: cst.BaseExpression | None
    executor: cst.BaseExpression | None


def positional(call: cst.Call, index: int) -> cst.BaseExpression | None:
    args = [a for a in call.args if a.keyword is None and not a.star]
    return args[index].value if index < len(args) else None


def keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    return None


def handoff(call: cst.Call, ctx: FileContext) -> Handoff | None:
    """The thread handoff `call` makes, or None."""
    name = terminal(call.func)
    if name not in HANDOFF_NAMES:
        return None
    if name == "run_in_executor" and isinstance(call.func, cst.Attribute):
        executor = positional(call, 0)
        if isinstance(executor, cst.Name) and executor.value == "None":
            executor = None
        return Handoff(call, "run_in_executor", positional(call, 1), executor)
    if name == "submit" and isinstance(call.func, cst.Attribute):
        receiver = call.func.value
        key = ctx.key(receiver)
        if ctx.facts.constructed_by(key) & POOLS or matches_name(
            dotted(receiver), EXECUTOR_NAMES + ctx.shared["owner-executors"]
        ):
            return Handoff(call, "submit", positional(call, 0), receiver)
        return None
    qual = ctx.resolve(call.func)
    if qual in TO_THREAD:
        return Handoff(call, qual.rsplit(".", 2)[-2] + "." + qual.rsplit(".", 1)[-1], positional(call, 0), None)
    return None


# Starlette (and FastAPI, and sse-starlette over it) iterates a sync iterator handed to a streaming response
# with `iterate_in_threadpool`: each `next()` runs on whichever thread of anyio's pool is free.
STREAMING_RESPONSES = frozenset({
    "starlette.responses.StreamingResponse", "fastapi.responses.StreamingResponse",
    "sse_starlette.EventSourceResponse", "sse_starlette.sse.EventSourceResponse",
})


def streamed_handoff(call: cst.Call, ctx: FileContext) -> Handoff | None:
    """`StreamingResponse(gen(...))`: Starlette hands each step of `gen(...)` to its thread pool, as
    `asyncio.to_thread` would, when `gen` is a sync generator (`iterated_in_pool` tells, once the file's
    defs are known); an async generator stays on the loop."""
    content = streamed_content(call, ctx)
    if content is None:
        return None
    ctx.pin(content.func)
    return Handoff(call, terminal(call.func) or "StreamingResponse", content.func, None)


def streamed_content(call: cst.Call, ctx: FileContext) -> cst.Call | None:
    """The call that makes what a streaming response (`StreamingResponse(gen(...))`) streams, or None."""
    if terminal(call.func) not in ("StreamingResponse", "EventSourceResponse"):
        return None
    if ctx.resolve(call.func) not in STREAMING_RESPONSES:
        return None
    content = keyword(call, "content") or positional(call, 0)
    return content if isinstance(content, cst.Call) else None


def iterated_in_pool(work: Handoff, ctx: FileContext) -> bool:
    """The generator a `streamed_handoff` streams is a sync generator of this file (every def of that name)."""
    return bool(generator_defs(work.target, ctx))


def generator_defs(func: cst.BaseExpression, ctx: FileContext) -> list[FunctionFacts]:
    """The defs of this file `func` names, when every one of them is a sync generator (a `yield` in its own
    body); else none. Calling one runs none of its body: its code runs where what the call returned is
    iterated (`for`, `next`, `list`), on whichever thread does that."""
    defs = ctx.facts.by_key.get(ctx.key(func) or "", ())
    if not defs:
        return []
    # Asked for most calls of a file, mostly of the same few defs: each def's answer is kept.
    known: dict[int, bool] = ctx.facts.memo.setdefault("sync-generators", {})
    for d in defs:
        answer = known.get(id(d.node))
        if answer is None:
            answer = known[id(d.node)] = sync_generator(d.node)
        if not answer:
            return []
    return list(defs)


def only_makes_generator(target: cst.BaseExpression | None, ctx: FileContext) -> bool:
    """A callable handed to a thread that only makes a generator of this file there: the generator function itself
    (`run_in_executor(None, gen)`), or a lambda calling it (`lambda: gen()`, `lambda: iter(gen())`). The thread
    runs none of its body, which runs where the generator is iterated. littlepush/plllm-mlx iterates
    `await loop.run_in_executor(None, lambda: _sync_stream_generate())` on its inference thread
    (plllm_mlx/subprocess/python/loaders/mlx_loader.py@87a0a93:410, set p: graded false for INV107 and INV121)."""
    if isinstance(target, cst.Lambda):
        body = unwrap_iter(target.body, ctx)
        return isinstance(body, cst.Call) and bool(generator_defs(body.func, ctx))
    return target is not None and bool(generator_defs(target, ctx))


_OWN_SCOPES = frozenset({cst.FunctionDef, cst.Lambda, cst.ClassDef})


def sync_generator(node: cst.CSTNode) -> bool:
    """A plain `def` with a `yield` in its own body (not in a nested def, lambda or class).

    Walked with the walk's own `children`, which reads fields: libcst's `children` property
    rebuilds each node to list them (0.2 s of the 0.9 s the walk and the rules took on vllm-mlx)."""
    if not isinstance(node, cst.FunctionDef) or node.asynchronous is not None:
        return False
    stack: list[cst.CSTNode] = [node.body]
    while stack:
        current = stack.pop()
        kind = type(current)  # exact classes: isinstance against libcst's ABC runs Python code on each miss
        if kind is cst.Yield:
            return True
        if kind not in _OWN_SCOPES:
            stack.extend(children(current))
    return False


def is_owner_executor(executor: cst.BaseExpression | None, ctx: FileContext) -> bool:
    """A configured owner executor, or a pool built in this file with exactly one worker thread:
    assigned to the same name or attribute, or kept under the same key of a mapping
    (`app[MLX] = ThreadPoolExecutor(1)`, used as `request.app[MLX]`)."""
    if executor is None:
        return False
    if matches_name(dotted(executor), ctx.shared["owner-executors"]):
        return True
    return any(_threads(value, ctx) == 1 for value in _stored(executor, ctx))


def shifting_pool(executor: cst.BaseExpression | None, ctx: FileContext) -> str | None:
    """What `executor` is, when this file shows it to be a thread pool of several workers (built
    with a constant `max_workers` above 1, or without one: then the default, at least five), so
    that one call and the next may run on different threads; None when it has one thread or the
    file does not say what it is. An executor handed in, returned by a getter or kept on another
    object is unknown here, and unknown is never a pool of several threads."""
    if executor is None or matches_name(dotted(executor), ctx.shared["owner-executors"]):
        return None
    counts = [_threads(value, ctx) for value in _stored(executor, ctx)]
    if not counts or any(count is None or count == 1 for count in counts):
        return None
    sizes = sorted({count for count in counts if count != DEFAULT_WORKERS})
    if DEFAULT_WORKERS in counts:
        return "a thread pool of the default size, five threads or more"
    return f"a pool of {' or '.join(map(str, sizes))} threads"


# `ThreadPoolExecutor()` with no `max_workers`: min(32, cpu_count + 4) threads, never fewer than five.
DEFAULT_WORKERS = -1


def _stored(executor: cst.BaseExpression, ctx: FileContext) -> list[cst.BaseExpression]:
    """Every value this file gives `executor`: what is assigned to its name or attribute, or what is
    stored under its mapping key."""
    values = [a.value for a in ctx.facts.assigned.get(ctx.key(executor) or "", ())]
    slot = _slot(executor)
    if slot is not None:
        values.extend(_slot_values(ctx).get(slot, ()))
    return values


def _threads(value: cst.BaseExpression, ctx: FileContext) -> int | None:
    """How many threads the `ThreadPoolExecutor(...)` call `value` starts: a constant, DEFAULT_WORKERS
    when it names none, None when it is not such a call or the count is computed."""
    if not isinstance(value, cst.Call) or ctx.resolve(value.func) not in THREAD_POOLS:
        return None
    workers = keyword(value, "max_workers") or positional(value, 0)
    if workers is None or (isinstance(workers, cst.Name) and workers.value == "None"):
        return DEFAULT_WORKERS
    count = number(workers, ctx.facts.constants)
    return int(count) if count is not None and count == int(count) and count >= 1 else None


def _slot(expr: cst.BaseExpression) -> str | None:
    """The key of `mapping[KEY]` when it is a name, an attribute or a string: what names the slot
    whichever object holds the mapping (`app[MLX]` and `request.app[MLX]` are one slot)."""
    if not isinstance(expr, cst.Subscript) or len(expr.slice) != 1:
        return None
    index = expr.slice[0].slice
    if not isinstance(index, cst.Index):
        return None
    if isinstance(index.value, cst.SimpleString):
        return repr(index.value.evaluated_value)  # 'mlx' and "mlx" are one key
    return dotted(index.value)


def _slot_values(ctx: FileContext) -> dict[str, list[cst.BaseExpression]]:
    """What this file stores under each mapping key (`app[MLX] = ...`); computed once per file."""
    found = ctx.facts.memo.get("slot-values")
    if found is None:
        found = {}
        stack: list[cst.CSTNode] = [ctx.module]
        while stack:
            node = stack.pop()
            stack.extend(node.children)
            if isinstance(node, cst.Assign):
                targets = [t.target for t in node.targets]
            elif isinstance(node, cst.AnnAssign) and node.value is not None:
                targets = [node.target]
            else:
                continue
            for slot in map(_slot, targets):
                if slot is not None:
                    found.setdefault(slot, []).append(node.value)
        ctx.facts.memo["slot-values"] = found
    return found


def unwrap_callable(expr: cst.BaseExpression | None, ctx: FileContext) -> cst.BaseExpression | None:
    """`functools.partial(f, ...)` -> `f`; anything else unchanged."""
    while isinstance(expr, cst.Call) and ctx.resolve(expr.func) in ("functools.partial", "contextvars.copy_context"):
        expr = positional(expr, 0)
    return expr


def unwrap_iter(expr: cst.BaseExpression, ctx: FileContext) -> cst.BaseExpression:
    """`iter(x)` -> `x` (the builtin, not a name of the file's, given one argument); anything else unchanged."""
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "iter" \
            and ctx.resolve(expr.func) is None and len(expr.args) == 1:
        return expr.args[0].value
    return expr


def forwarders(ctx: FileContext) -> dict[str, int]:
    """Defs of this file that hand one of their parameters to a worker thread, by key -> argument index.

    `async def _run_blocking_serialized(self, func, *args)` that runs `func` through
    `asyncio.to_thread` (directly, through `functools.partial`, or inside a nested def or
    lambda it hands over) is itself a handoff: `await self._run_blocking_serialized(work)`
    runs `work` on a worker thread. The index counts call arguments, so `self` is left out.
    Computed once per file, from the calls the walk recorded.
    """
    found = ctx.facts.memo.get("forwarders")
    if found is not None:
        return found
    found = {}
    facts = ctx.facts
    candidates = []
    for function in facts.functions.values():
        node = function.node
        if not isinstance(node, cst.FunctionDef) or not function.key:
            continue
        params = [p.name.value for p in (*node.params.posonly_params, *node.params.params)]
        if function.key.count(".") == 1 and params[:1] in (["self"], ["cls"]):
            params = params[1:]
        if params:
            candidates.append((function, params))
    changed = True
    while changed:  # a helper that forwards to a forwarder forwards too
        changed = False
        for function, params in candidates:
            if function.key in found:
                continue
            for site in function.calls:
                if terminal(site.node.func) in HANDOFF_NAMES:
                    work = handoff(site.node, ctx)
                else:
                    index = found.get(ctx.key(site.node.func) or "")
                    work = None if index is None else Handoff(site.node, "", positional(site.node, index), None)
                target = unwrap_callable(work.target, ctx) if work is not None else None
                name = _forwarded(target, params, ctx)
                if name is not None:
                    found[function.key] = params.index(name)
                    changed = True
                    break
    ctx.facts.memo["forwarders"] = found
    return found


def _forwarded(target: cst.BaseExpression | None, params: list[str], ctx: FileContext) -> str | None:
    """The parameter `target` is, or calls (a lambda, or a nested def handed over by name)."""
    if isinstance(target, cst.Name) and target.value in params:
        return target.value
    bodies = []
    if isinstance(target, cst.Lambda):
        bodies = [ctx.function_facts(target)]
    elif isinstance(target, cst.Name):
        bodies = list(ctx.facts.by_key.get(target.value, ()))
    for body in bodies:
        for site in body.calls if body is not None else ():
            if isinstance(site.node.func, cst.Name) and site.node.func.value in params:
                return site.node.func.value
    return None


def forwarded_handoff(call: cst.Call, ctx: FileContext) -> Handoff | None:
    """`helper(work, ...)` where `helper` is one of this file's forwarders: a handoff of `work`."""
    index = forwarders(ctx).get(ctx.key(call.func) or "")
    if index is None:
        return None
    return Handoff(call, dotted(call.func) or "a helper", positional(call, index), None)


THREAD_CLASSES = frozenset({"threading.Thread"})


def handed_target(site: CallSite, ctx: FileContext) -> cst.BaseExpression | None:
    """The callable a call hands to another thread: an executor's or `to_thread`'s work, a `Thread`'s target, or
    the callable a project helper forwards to one of those; None for any other call.

    Ask it from a rule's `end()`, never during the walk: the forwarders are computed once per file from the
    calls the walk recorded (`forwarders`), so asking mid-walk memoises a partial map for every rule."""
    if terminal(site.node.func) in HANDOFF_NAMES:
        work = handoff(site.node, ctx)
    elif site.qual in THREAD_CLASSES:
        return keyword(site.node, "target")
    else:
        work = forwarded_handoff(site.node, ctx)
    return unwrap_callable(work.target, ctx) if work is not None else None
