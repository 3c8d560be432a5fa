"""Who can cancel a coroutine while the server serves: the awaiters of the package, followed up.

A cancelled `await` is a hazard only where something cancels it: a task the package makes and
cancels, a deadline (`asyncio.timeout`, `wait_for`), a streaming response's generator, a
websocket or an aiohttp/gRPC handler (both cancel on disconnect), or code outside the package.
An HTTP route handler that answers with one response is not cancelled when its client
disconnects (uvicorn, hypercorn, Starlette/FastAPI: cancellers.plain_route), and start-up code
(a lifespan before its `yield`, a start-up hook: checker/startup.py) runs before anyone is
served: only the server's shutdown cancels either, and so anything they await in turn.

`Cancellers.shutdown_only(module, line)` answers for the coroutine whose body holds `line`: True
only when every chain of awaiters from it ends in such handlers or such start-up code, each link
a plain `await f(...)` in a coroutine with no deadline of its own. A task nobody keeps
(`asyncio.create_task(f())` as a statement, its result dropped) ends a chain there too: no one holds
it to cancel it, so only the loop's end does (a TaskGroup's task is not such a task: the group cancels
it when a sibling fails). Anything else keeps it
cancellable: a call handed on (a task kept, `wait_for(f(), ...)`, `gather(f())`), a
generator on the way, a coroutine nothing in the package awaits (code outside calls it), or any
mention of its name the model cannot account for. The last is a wide net, as in
unreferenced.py: every whole-word occurrence of the name in the package's files, other than its
`def` line and a `from ... import` of it under its own name (an alias would hide its calls), must
be on a line where a call of that name resolves, either to the coroutine itself or to an unrelated
function of the same name (a method of a class outside its class's family); a callback
registration, a `getattr`, a comment or a call the model cannot resolve is unknown.

`Cancellers.at_startup(module, line)` asks the same chains the other way: `line` runs before the
server serves anyone, in start-up code (checker/startup.py) or in a coroutine every chain of
awaiters of which ends in start-up code, each link a plain `await f(...)` (a deadline on the way
changes nothing: it is still start-up). A task, a `gather`, a coroutine awaited from a route
too, or a mention unaccounted for keeps it serving time. Issue 23's blind review graded the
handoffs of `preload_models`, awaited only by a coroutine before its `uvicorn.Server.serve()`,
arguable (flowtailor-de/live-translation src/main.py@472081f:165-178).
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

from mlx_invariants.checker.model.graph import Key, Package
from mlx_invariants.checker.model.summary import AWAITED, DETACHED, Call, Function, Offload

_DEFINES = re.compile(r"(?:def|class)\s+$")
# Frameworks whose handlers are cancelled when their client goes away (aiohttp before 3.9 and with
# `handler_cancellation=True`; grpc.aio cancels the servicer's task on a client cancel or deadline).
_CANCELLING_FRAMEWORKS = ("aiohttp", "grpc")


@dataclass(frozen=True)
class _Ends:
    """Where a chain of awaiters may end for a question to hold. `shutdown`: in plain routes and start-up code,
    no link under a deadline (what only the server's shutdown cancels); without it, in start-up code alone.
    `detached`: in a task nobody keeps too (no one can cancel it, but no one waits for it either)."""

    shutdown: bool
    detached: bool


_SHUTDOWN = _Ends(shutdown=True, detached=True)   # `shutdown_only`: cancelled by the server's shutdown alone
_WAITED = _Ends(shutdown=True, detached=False)    # ... and awaited to its end (`handed_by_shutdown_only`)
_STARTUP = _Ends(shutdown=False, detached=False)  # `at_startup`: run before serving


class Cancellers:
    """Answers, per coroutine of a package, whether only the server's shutdown can cancel it."""

    def __init__(self, package: Package, text: Callable[[str], str | None]) -> None:
        self.package = package
        self.text = text  # a module's text, None when it cannot be read
        self._known: dict[_Ends, dict[Key, bool]] = {ends: {} for ends in (_SHUTDOWN, _WAITED, _STARTUP)}
        self._indexes: dict[str, _Index | None] = {}

    def shutdown_only(self, module: str, line: int) -> bool:
        """The innermost coroutine of `module` around `line` is cancelled only by the server's shutdown,
        or `line` itself runs at start-up."""
        return self._chains_end(module, line, _SHUTDOWN)

    def at_startup(self, module: str, line: int) -> bool:
        """`line` of `module` runs before the server serves anyone: in start-up code, or in a coroutine that
        only start-up code awaits (through plain awaits only)."""
        return self._chains_end(module, line, _STARTUP)

    def handed_by_shutdown_only(self, module: str, line: int) -> bool:
        """The sync def of `module` around `line` is handed to a thread by coroutines of the package alone, each
        of them cancelled only by the server's shutdown (`shutdown_only` at the hand-off) and awaited to its end by
        its callers: nobody stops waiting for what it computes before it ends, so its loop need not check for a
        cancellation. A task nobody keeps is no such caller: whoever reads what it makes (a stream's queue) can
        leave while it runs on (TDevViper/MLX-Serve scheduler/worker.py@326aae3:108, graded true). False when the
        def is a coroutine, or nothing in the package hands it over by name."""
        around = self._around(module, line)
        if around is None or around[1].is_async:
            return False
        sites = self._handoffs.get((module, around[0]), [])
        return bool(sites) and all(self._chains_end(caller, work.place.line, _WAITED) for caller, work in sites)

    def _chains_end(self, module: str, line: int, ends: _Ends) -> bool:
        """`line` runs at start-up, or every chain of plain awaits from the innermost coroutine around it ends
        where `ends` says."""
        around = self._around(module, line)
        if around is None:
            return False
        name, fn = around
        return fn.is_async and (fn.before_serving(line) or self._awaited_only((module, name), frozenset(), ends))

    def _around(self, module: str, line: int) -> tuple[str, Function] | None:
        """The innermost function of `module` whose body holds `line`, by name, with its summary."""
        index = self._index(module)
        name = index.innermost(line) if index is not None else None
        fn = self.package.function((module, name)) if name is not None else None
        return (name, fn) if name is not None and fn is not None else None

    @functools.cached_property
    def _handoffs(self) -> dict[Key, list[tuple[str, Offload]]]:
        """Every hand-off to a thread in the package, by the def it hands over (those it names), with the module
        making it: built once, not per finding."""
        handoffs: dict[Key, list[tuple[str, Offload]]] = {}
        for caller in self.package.modules:
            for work in _offloads(self.package, caller):
                if work.target is not None and (target := self.package.callee(caller, work.target)[0]) is not None:
                    handoffs.setdefault(target, []).append((caller, work))
        return handoffs

    def _awaited_only(self, key: Key, visiting: frozenset[Key], ends: _Ends) -> bool:
        known, shutdown = self._known[ends], ends.shutdown
        found = known.get(key)
        if found is not None:
            return found
        fn = self.package.function(key)
        if fn is None or not fn.is_async or fn.is_generator or fn.own_loop or key in visiting \
                or (shutdown and fn.deadline):
            return False  # a cycle proves nothing, and is not remembered
        if shutdown and (self._plain_route(key, fn) or (fn.startup is not None and fn.startup == (fn.line, fn.end))):
            found = True
        else:
            sites = self._awaits_of(key)
            found = bool(sites) and all(
                (ends.detached and call.use == DETACHED)  # a task nobody keeps: only the loop's end cancels it
                or (call.use == AWAITED and (caller_fn := self.package.function(caller)) is not None
                    and not (shutdown and caller_fn.deadline)
                    and (caller_fn.before_serving(call.place.line)
                         or self._awaited_only(caller, visiting | {key}, ends)))
                for caller, call in sites or ())
        known[key] = found
        return found

    def _plain_route(self, key: Key, fn: Function) -> bool:
        """A route handler that answers with one response, in a module importing no framework that cancels
        handlers on disconnect."""
        if not fn.route:
            return False
        summary = self.package.summary(key[0])
        refs = summary.names.values() if summary is not None else ()
        return not any(ref.split(".", 1)[0] in _CANCELLING_FRAMEWORKS for ref in refs)

    def _awaits_of(self, key: Key) -> list[tuple[Key, Call]] | None:
        """Every call of `key` in the package, with the function that makes it; None when some mention of
        its name is not such a call, nor a call of an unrelated function of the same name."""
        leaf = key[1].rpartition(".")[2]
        sites: list[tuple[Key, Call]] = []
        for module in self.package.modules:
            index = self._index(module)
            if index is None:
                return None
            mentions = index.mentions.get(leaf)
            if not mentions:
                continue  # its summary is not needed
            if index.calls is None:
                return None  # named in a module the model could not read (a syntax of a newer Python)
            calls = index.calls.get(leaf, {})
            for line, count in mentions.items():
                here = calls.get(line, [])
                if len(here) < count - (line in index.imported.get(leaf, ())):
                    return None
                for name, call in here:
                    target, _ = self.package.callee(module, call.target)
                    if target == key:
                        sites.append(((module, name), call))
                    elif target is None or self._related(target, key):
                        return None
        return sites

    def _index(self, module: str) -> _Index | None:
        """`module`'s mentions, calls and def spans, read once: asked per finding, a scan of the text per
        name made a module of 12 000 handlers, each with a finding, quadratic (minutes). None when its text
        cannot be read; a module with no summary has its mentions but no calls."""
        if module not in self._indexes:
            text = self.text(module)
            self._indexes[module] = _Index(text, functools.partial(_functions, self.package, module)) if text is not None else None
        return self._indexes[module]

    def _related(self, one: Key, other: Key) -> bool:
        """Methods of two classes one of which derives from the other: a call of one may run the other."""
        first, second = one[1].rpartition(".")[0], other[1].rpartition(".")[0]
        if not first or not second:
            return False
        return (other[0], second) in set(self.package.mro(one[0], first)) or \
            (one[0], first) in set(self.package.mro(other[0], second))


def _offloads(package: Package, module: str) -> list[Offload]:
    """Every hand-off to a thread that `module`'s functions make."""
    summary = package.summary(module)
    return [work for fn in summary.functions.values() for work in fn.offloads] if summary is not None else []


def _functions(package: Package, module: str) -> dict[str, Function] | None:
    """`module`'s functions, from its summary (a partial of this, not a closure over the Cancellers: the
    package-wide steps must leave no cycle, test_collector)."""
    summary = package.summary(module)
    return summary.functions if summary is not None else None


_WORD = re.compile(r"\b[A-Za-z_]\w*\b")
# `from x import a, b as c` and its parenthesized form over several lines: the names it imports.
_FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+[\w.]+[ \t]+import[ \t]*(\([^)]*\)|[^\n#;]*)", re.M)
_IMPORTED = re.compile(r"([A-Za-z_]\w*)(?:[ \t]+as[ \t]+\w+)?")


class _Index:
    """One module's whole-word mentions by name (line -> count, `def`/`class` lines left out), the calls
    its functions make by the callee's last name (line -> calls; None without a summary), its functions'
    spans (both from the summary, read only when asked: a module that never names the coroutine is not
    summarized for it), and the lines that import a name under its own name (`from .stt import preload`): a
    mention there binds the name, and its calls are counted where they are."""

    def __init__(self, text: str, functions: Callable[[], dict[str, Function] | None]) -> None:
        self.mentions: dict[str, dict[int, int]] = {}
        self.imported: dict[str, set[int]] = {}
        for statement in _FROM_IMPORT.finditer(text):
            first = text.count("\n", 0, statement.start(1)) + 1
            names = re.sub(r"#[^\n]*", lambda comment: " " * len(comment.group()), statement.group(1))
            for name in _IMPORTED.finditer(names):
                if name.group(0) == name.group(1):  # not `name as alias`
                    line = first + names.count("\n", 0, name.start())
                    self.imported.setdefault(name.group(1), set()).add(line)
        line, last = 1, 0
        for match in _WORD.finditer(text):
            start = match.start()
            line += text.count("\n", last, start)
            last = start
            if not _DEFINES.search(text, max(0, start - 12), start):
                lines = self.mentions.setdefault(match.group(), {})
                lines[line] = lines.get(line, 0) + 1
        self._functions = functions

    @functools.cached_property
    def calls(self) -> dict[str, dict[int, list[tuple[str, Call]]]] | None:
        functions = self._functions()
        if functions is None:
            return None
        calls: dict[str, dict[int, list[tuple[str, Call]]]] = {}
        for name, fn in functions.items():
            for call in fn.calls:
                leaf = call.text.replace("()", "").rpartition(".")[2]
                calls.setdefault(leaf, {}).setdefault(call.place.line, []).append((name, call))
        return calls

    @functools.cached_property
    def _spans(self) -> list[tuple[int, int, str]]:
        return sorted((fn.line, fn.end, name) for name, fn in (self._functions() or {}).items())

    @functools.cached_property
    def _starts(self) -> list[int]:
        return [span[0] for span in self._spans]

    def innermost(self, line: int) -> str | None:
        """The function whose body holds `line` and starts last (the innermost of nested ones)."""
        for start, end, name in reversed(self._spans[:bisect.bisect_right(self._starts, line)]):
            if start <= line <= end:
                return name
        return None
