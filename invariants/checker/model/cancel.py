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
a plain `await f(...)` in a coroutine with no deadline of its own. Anything else keeps it
cancellable: a call handed on (`create_task(f())`, `wait_for(f(), ...)`, `gather(f())`), a
generator on the way, a coroutine nothing in the package awaits (code outside calls it), or any
mention of its name the model cannot account for. The last is a wide net, as in
unreferenced.py: every whole-word occurrence of the name in the package's files, other than its
`def` line, must be on a line where a call of that name resolves, either to the coroutine itself
or to an unrelated function of the same name (a method of a class outside its class's family);
a callback registration, a `getattr`, a comment or a call the model cannot resolve is unknown.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable

from mlx_invariants.checker.model.graph import Key, Package
from mlx_invariants.checker.model.summary import AWAITED, Call, Function

_DEFINES = re.compile(r"(?:def|class)\s+$")
# Frameworks whose handlers are cancelled when their client goes away (aiohttp before 3.9 and with
# `handler_cancellation=True`; grpc.aio cancels the servicer's task on a client cancel or deadline).
_CANCELLING_FRAMEWORKS = ("aiohttp", "grpc")


class Cancellers:
    """Answers, per coroutine of a package, whether only the server's shutdown can cancel it."""

    def __init__(self, package: Package, text: Callable[[str], str | None]) -> None:
        self.package = package
        self.text = text  # a module's text, None when it cannot be read
        self._known: dict[Key, bool] = {}
        self._indexes: dict[str, _Index | None] = {}

    def shutdown_only(self, module: str, line: int) -> bool:
        """The innermost coroutine of `module` around `line` is cancelled only by the server's shutdown,
        or `line` itself runs at start-up."""
        index = self._index(module)
        name = index.innermost(line) if index is not None else None
        if name is None:
            return False
        fn = self.package.summary(module).functions[name]  # type: ignore[union-attr]
        if not fn.is_async:
            return False
        return fn.before_serving(line) or self._shutdown_only((module, name), frozenset())

    def _shutdown_only(self, key: Key, visiting: frozenset[Key]) -> bool:
        found = self._known.get(key)
        if found is not None:
            return found
        fn = self.package.function(key)
        if fn is None or not fn.is_async or fn.is_generator or fn.deadline or fn.own_loop or key in visiting:
            return False  # a cycle proves nothing: kept cancellable, and not remembered as such
        if self._plain_route(key, fn) or (fn.startup is not None and fn.startup == (fn.line, fn.end)):
            found = True
        else:
            sites = self._awaits_of(key)
            found = bool(sites) and all(
                call.use == AWAITED and (caller_fn := self.package.function(caller)) is not None
                and not caller_fn.deadline
                and (caller_fn.before_serving(call.place.line) or self._shutdown_only(caller, visiting | {key}))
                for caller, call in sites or ())
        self._known[key] = found
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
            mentions = index.mentions.get(leaf, {})
            if mentions and index.calls is None:
                return None  # named in a module the model could not read (a syntax of a newer Python)
            calls = index.calls.get(leaf, {}) if index.calls is not None else {}
            for line, count in mentions.items():
                here = calls.get(line, [])
                if len(here) < count:
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
            text, summary = self.text(module), self.package.summary(module)
            self._indexes[module] = _Index(text, summary.functions if summary is not None else None) \
                if text is not None else None
        return self._indexes[module]

    def _related(self, one: Key, other: Key) -> bool:
        """Methods of two classes one of which derives from the other: a call of one may run the other."""
        first, second = one[1].rpartition(".")[0], other[1].rpartition(".")[0]
        if not first or not second:
            return False
        return (other[0], second) in set(self.package.mro(one[0], first)) or \
            (one[0], first) in set(self.package.mro(other[0], second))


_WORD = re.compile(r"\b[A-Za-z_]\w*\b")


class _Index:
    """One module's whole-word mentions by name (line -> count, `def`/`class` lines left out), the calls
    its functions make by the callee's last name (line -> calls; None without a summary), and its
    functions' spans."""

    def __init__(self, text: str, functions: dict[str, Function] | None) -> None:
        self.mentions: dict[str, dict[int, int]] = {}
        line, last = 1, 0
        for match in _WORD.finditer(text):
            start = match.start()
            line += text.count("\n", last, start)
            last = start
            if not _DEFINES.search(text, max(0, start - 12), start):
                lines = self.mentions.setdefault(match.group(), {})
                lines[line] = lines.get(line, 0) + 1
        self.calls: dict[str, dict[int, list[tuple[str, Call]]]] | None = None if functions is None else {}
        functions = functions or {}
        for name, fn in functions.items():
            for call in fn.calls:
                leaf = call.text.replace("()", "").rpartition(".")[2]
                self.calls.setdefault(leaf, {}).setdefault(call.place.line, []).append((name, call))
        self._spans = sorted((fn.line, fn.end, name) for name, fn in functions.items())
        self._starts = [span[0] for span in self._spans]

    def innermost(self, line: int) -> str | None:
        """The function whose body holds `line` and starts last (the innermost of nested ones)."""
        for start, end, name in reversed(self._spans[:bisect.bisect_right(self._starts, line)]):
            if start <= line <= end:
                return name
        return None
