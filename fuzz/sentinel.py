"""The MLX access sentinel: wraps MLX entry points and records who was inside, when, from where.

CPU MLX does not crash when two threads enter it at once, so on a Linux
runner this record is the only witness of a race that aborts Metal on a Mac.
Each outermost entry on a thread becomes an "mlx" span in a `Trace` (nested
calls on the same thread count once); the oracles decide what is wrong. In
strict mode the sentinel also refuses the second entrant (and an entrant off
the owner thread) by raising `SentinelError` instead of letting it in.

With `observe` (the default; `MLX_INVARIANTS_OBSERVE=0` turns it off) it
also installs the drop-in `Observer` (`fuzz/observe.py`): locks, work handed
to threads and cancellation, recorded into the same trace, so the ownership
oracles judge an engine that marks nothing. With no owner declared, the first
thread to enter MLX (the one that loaded the model) is remembered, and a span
from any other thread carries `off_loader`.

Targets are "module:qualname" strings; the module part may be a glob
("mlx_lm.models.*:Model.__call__"). Modules not imported yet are wrapped when
they are imported, so the same code serves a process started with the
sentinel injected through `sitecustomize` (see `fuzz/inject/`).
"""

from __future__ import annotations

import asyncio.events as asyncio_events
import fnmatch
import functools
import importlib.abc
import inspect
import json
import os
import re
import sys
import threading
import types
from dataclasses import asdict
from typing import Any, Callable, Iterable, Iterator, Optional

from mlx_invariants.fuzz.collect import collecting
from mlx_invariants.fuzz.errors import SentinelError
from mlx_invariants.fuzz.observe import Observer
from mlx_invariants.fuzz.trace import Event, Trace, capture_stack, thread_token
from mlx_invariants.fuzz.worker_switch import WorkerSwitch

DEFAULT_TARGETS: tuple[str, ...] = (
    "mlx.core:eval",
    "mlx.core:async_eval",
    "mlx.core:synchronize",
    "mlx.core:array.item",
    "mlx.core:array.tolist",
    # float(a), int(a), `if a:` evaluate a lazy array as item() does, on the thread that asks
    "mlx.core:array.__float__",
    "mlx.core:array.__int__",
    "mlx.core:array.__bool__",
    "mlx_lm.models.*:Model.__call__",
    "mlx_lm.generate:BatchGenerator.__init__",
    "mlx_lm.generate:BatchGenerator.insert",
    "mlx_lm.generate:BatchGenerator.next",
    "mlx_lm.generate:BatchGenerator.remove",
    "mlx_lm.generate:BatchGenerator.close",
    "mlx_lm.generate:generate_step",
    "mlx_lm.generate:stream_generate",
    "mlx_lm.generate:generate",
)
NO_STREAM = "There is no Stream("
_STREAM_NAME = re.compile(r"Stream\((\w+), (\d+)\)")
_STREAM_INDEX = re.compile(r", (\d+)\)$")
# What makes a stream that belongs to the thread that made it (before 0.31.2 streams were shared).
STREAM_MAKERS = ("new_stream", "new_thread_local_stream")
STICKY = "sticky"
OBSERVE_ENV = "MLX_INVARIANTS_OBSERVE"


class Sentinel:
    """Wraps MLX entry points while installed; records spans into `trace`.

    owner: None (no owner check), "sticky" (the first thread to enter owns
    MLX), or a thread-name glob such as "mlx-owner*". `declare_owner()`
    makes the calling thread the owner by its token instead. With
    `sample_rest` (a sentinel injected into a server), each outermost span
    carries the process's thread count and MLX active memory at its entry
    (`info["rest"]`), from which `fuzz.rest` reads the server's rest state.
    With a `switch`, each outermost entry is counted by it first, so an armed
    worker fault dies or wedges inside that MLX call.
    """

    def __init__(self, targets: Iterable[str] = DEFAULT_TARGETS, *, owner: str | None = None,
                 strict: bool = False, trace: Trace | None = None,
                 emit: Callable[[Event], None] | None = None, observe: bool | None = None,
                 sample_rest: bool = False, switch: WorkerSwitch | None = None):
        self.targets = tuple(targets)
        self.sample_rest = sample_rest
        self.switch = switch  # a launched server's: worker faults the fuzzer arms (fuzz/worker_switch.py)
        self.owner = owner
        self.strict = strict
        self.trace = trace or Trace()
        self._emit = emit
        self._lock = threading.Lock()
        self._inside: dict[int, Event] = {}
        self._owner_token: int | None = None
        self._loader_token: int | None = None  # with no owner declared: the first thread into MLX
        if observe is None:
            observe = os.environ.get(OBSERVE_ENV, "1") != "0"
        self.observer = Observer(self.trace, emit) if observe else None
        self._tls = threading.local()
        self._patches: list[tuple[Any, str, Any, bool, Any]] = []
        self._wrapped: set[tuple[str, str]] = set()
        # Who made each stream, by "device:index" (the name a no-stream error gives): thread name and caller.
        self.streams_made: dict[str, tuple[str, str]] = {}
        self._finder: _PostImportFinder | None = None
        self._active = False

    # -- lifecycle ---------------------------------------------------------
    def install(self) -> "Sentinel":
        if self._finder is not None:
            raise RuntimeError("this sentinel is already installed")
        self._active = True
        if self.observer is not None:
            self.observer.install()
        self._finder = _PostImportFinder(self._on_import, [t.split(":", 1)[0] for t in self.targets])
        sys.meta_path.insert(0, self._finder)
        for name, module in list(sys.modules.items()):
            if module is not None:
                self._on_import(name, module)
        return self

    def uninstall(self) -> None:
        """Restore every wrapped attribute, newest first; safe to call twice."""
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._finder = None
        self._active = False
        if self.observer is not None:
            self.observer.uninstall()
        self._unbind_late_aliases()
        for obj, attr, original, had_own, wrapper in reversed(self._patches):
            if vars(obj).get(attr) is not wrapper:
                continue  # wrapped again by a sentinel still installed: ours now only passes through
            if had_own:
                setattr(obj, attr, original)
            else:
                delattr(obj, attr)
        self._patches.clear()
        self._wrapped.clear()

    def _unbind_late_aliases(self) -> None:
        """`from mlx_lm.generate import stream_generate` run while we were installed bound our wrapper."""
        originals = {id(wrapper): original for obj, _, original, had_own, wrapper in self._patches
                     if had_own and isinstance(obj, types.ModuleType)}
        if not originals:
            return
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            for key, value in list((namespace or {}).items()):
                if id(value) in originals and getattr(value, "__mlx_sentinel__", None) is self:
                    setattr(module, key, originals[id(value)])

    def __enter__(self) -> "Sentinel":
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def attach(self, trace: Trace, forget_owner: bool = True) -> None:
        """Record into a fresh trace (one per scenario) and forget who was inside; a "sticky" owner is
        forgotten too unless the same engine goes on (`forget_owner=False`), and so is the loader."""
        with self._lock:
            self.trace = trace
            self._inside.clear()
            if self.owner == STICKY and forget_owner:
                self._owner_token = None
            if forget_owner:
                self._loader_token = None
        if self.observer is not None:
            self.observer.attach(trace)

    def declare_owner(self) -> None:
        """The calling thread is the only one allowed into MLX from now on."""
        self._owner_token = thread_token()

    # -- what the wrappers call ---------------------------------------------
    def _enter(self, target: str) -> Event | None:
        depth = getattr(self._tls, "depth", 0)
        self._tls.depth = depth + 1
        if depth:
            return None
        token = thread_token()
        name = threading.current_thread().name
        stack = capture_stack(2)
        with self._lock:
            off_owner = not self._is_owner(token, name)
            others = [e for t, e in self._inside.items() if t != token]
            info: dict[str, Any] = {}
            if off_owner:
                info["off_owner"] = True
            if asyncio_events._get_running_loop() is not None:
                info["on_loop"] = True  # this thread runs an asyncio event loop
            if self.owner is None and self._owner_token is None:
                if self._loader_token is None:
                    self._loader_token = token
                elif token != self._loader_token:
                    info["off_loader"] = True
                    info["mlx_version"] = mlx_version()
            if others:
                info["while"] = others[0].seq
            if self.sample_rest:
                info["rest"] = _rest_sample()
            refused = self.strict and (off_owner or bool(others))
            if refused:
                info["refused"] = True
            span = self.trace.record("mlx", target, info=info, stack=stack)
            if not refused:
                self._inside[token] = span
        if refused:
            self._tls.depth = depth
            self.trace.close_span(span)
            self._publish(span)
            why = f"{name} is not the MLX owner" if off_owner else f"{others[0].who} is inside MLX"
            raise SentinelError(f"strict MLX sentinel refused {target}: {why}")
        return span

    def _exit(self, span: Event | None) -> None:
        self._tls.depth -= 1
        if span is None:
            return
        with self._lock:
            self._inside.pop(span.thread, None)
            self.trace.close_span(span)
        self._publish(span)

    def _failed(self, target: str, exc: BaseException) -> None:
        if isinstance(exc, RuntimeError) and NO_STREAM in str(exc):
            info = {"target": target, "message": str(exc)}
            named = _STREAM_NAME.search(str(exc))
            made = self.streams_made.get(f"{named.group(1)}:{named.group(2)}") if named else None
            if made is not None:
                info["made_by"], info["made_at"] = made
            event = self.trace.record("mlx-error", "no-stream", info=info, stack=capture_stack(2))
            self._publish(event)

    def _stream_maker(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """`original` (mx.new_stream and kin), remembering which thread made each stream and where."""
        @functools.wraps(original)
        def make(*args: Any, **kwargs: Any) -> Any:
            stream = original(*args, **kwargs)
            device = getattr(getattr(stream, "device", None), "type", None)
            kind = str(device).rsplit(".", 1)[-1] if device is not None else "?"
            index = getattr(stream, "index", None)  # or the last number of "Stream(Device(cpu, 0), 3)"
            if index is None:
                index = _STREAM_INDEX.search(repr(stream)).group(1) if _STREAM_INDEX.search(repr(stream)) else "?"
            caller = capture_stack(1, limit=1)
            self.streams_made[f"{kind}:{index}"] = (
                threading.current_thread().name, caller[-1] if caller else "")
            return stream
        make.__mlx_sentinel__ = self  # type: ignore[attr-defined]
        return make

    def _is_owner(self, token: int, name: str) -> bool:
        if self._owner_token is not None:
            return token == self._owner_token
        if self.owner == STICKY:
            self._owner_token = token
            return True
        return self.owner is None or fnmatch.fnmatchcase(name, self.owner)

    def _publish(self, event: Event) -> None:
        if self._emit is not None:
            self._emit(event)

    # -- wrapping ------------------------------------------------------------
    def _on_import(self, module_name: str, module: types.ModuleType) -> None:
        if module_name == "mlx.core" and (module_name, "<streams>") not in self._wrapped:
            self._wrapped.add((module_name, "<streams>"))
            for maker in STREAM_MAKERS:
                if callable(getattr(module, maker, None)):
                    self._patch(module, maker, self._stream_maker(getattr(module, maker)))
        for target in self.targets:
            pattern, qualname = target.split(":", 1)
            if fnmatch.fnmatchcase(module_name, pattern) and (module_name, qualname) not in self._wrapped:
                if self._wrap(module, qualname, f"{module_name.rsplit('.', 1)[-1]}.{qualname}"):
                    self._wrapped.add((module_name, qualname))

    def _wrap(self, module: types.ModuleType, qualname: str, label: str) -> bool:
        *path, attr = qualname.split(".")
        owner: Any = module
        for part in path:
            owner = getattr(owner, part, None)
            if owner is None:
                return False
        original = getattr(owner, attr, None)
        if original is None or getattr(original, "__mlx_sentinel__", None) is self:
            return False
        if isinstance(owner, type) and getattr(owner, "__module__", module.__name__) != module.__name__:
            return False  # a class re-exported from elsewhere is wrapped in its own module
        wrapper = self._guarded(original, label)
        self._patch(owner, attr, wrapper)
        if isinstance(owner, types.ModuleType):
            self._rebind_aliases(original, wrapper)
        return True

    def _patch(self, obj: Any, attr: str, value: Any) -> None:
        had_own = attr in vars(obj)
        self._patches.append((obj, attr, vars(obj)[attr] if had_own else None, had_own, value))
        setattr(obj, attr, value)

    def _rebind_aliases(self, original: Any, wrapper: Any) -> None:
        """Modules that did `from mlx.core import eval` before we were installed hold the original."""
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not namespace:
                continue
            for key, value in list(namespace.items()):
                if value is original:
                    self._patch(module, key, wrapper)

    def _guarded(self, fn: Any, label: str) -> Any:
        sentinel = self
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def guarded_generator(*args: Any, **kwargs: Any) -> Iterator[Any]:
                if not sentinel._active:
                    return fn(*args, **kwargs)
                return _GuardedGenerator(sentinel, label, fn(*args, **kwargs))
            guarded_generator.__mlx_sentinel__ = sentinel  # type: ignore[attr-defined]
            return guarded_generator

        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if not sentinel._active or sys._getframe(1).f_code.co_name == "__del__":
                # A finalizer runs on whichever thread drops the last reference; the wrapped
                # call is not an entry itself, but any MLX work it does is still seen inside.
                return fn(*args, **kwargs)
            span = sentinel._enter(label)
            try:
                if span is not None and sentinel.switch is not None:
                    sentinel.switch.on_call(label)
                return fn(*args, **kwargs)
            except BaseException as exc:
                sentinel._failed(label, exc)
                raise
            finally:
                sentinel._exit(span)
        guarded.__mlx_sentinel__ = sentinel  # type: ignore[attr-defined]
        return guarded


class _GuardedGenerator:
    """A generator whose every resume counts as an MLX entry (mlx-lm does its work between yields)."""

    def __init__(self, sentinel: Sentinel, label: str, inner: Any):
        self._sentinel, self._label, self._inner = sentinel, label, inner
        self._born = thread_token()
        self._born_name = threading.current_thread().name
        self._born_in = sentinel.trace  # the scenario it belongs to (`Sentinel.attach` starts another)

    def __iter__(self) -> "_GuardedGenerator":
        return self

    def __del__(self) -> None:
        """Dropped while suspended inside its body: the inner generator's finalizer closes it here, running its
        `with mx.stream(...)` exits and `finally` blocks on this thread. Off the creating thread that is MLX
        state torn down where it does not live (a real server logs "[StreamContext] Destroyed in a
        different thread than it was constructed in")."""
        if not self._sentinel._active or not getattr(self._inner, "gi_suspended", False):
            return
        if thread_token() != self._born:
            # Inside the harness's own collection, the thread and the moment are the harness's (fuzz/collect.py);
            # after its own scenario ended, they are whichever later scenario runs then, on another engine.
            name = "collected-suspended" if collecting() else \
                "outlived-its-scenario" if self._sentinel.trace is not self._born_in else "finalized-off-thread"
            event = self._sentinel.trace.record(
                "mlx-gc", name, info={"target": self._label, "created_by": self._born_name}, stack=capture_stack(1))
            self._sentinel._publish(event)

    def __next__(self) -> Any:
        return self._resume(self._inner.__next__)

    def send(self, value: Any) -> Any:
        return self._resume(self._inner.send, value)

    def throw(self, *exc: Any) -> Any:
        return self._resume(self._inner.throw, *exc)

    def close(self) -> None:
        self._resume(self._inner.close)

    def _resume(self, step: Callable[..., Any], *args: Any) -> Any:
        span = self._sentinel._enter(self._label)
        try:
            if span is not None and self._sentinel.switch is not None:
                self._sentinel.switch.on_call(self._label)
            return step(*args)
        except StopIteration:
            raise
        except BaseException as exc:
            self._sentinel._failed(self._label, exc)
            raise
        finally:
            self._sentinel._exit(span)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Lets the real finders find a module, then calls back once the module has executed."""

    def __init__(self, callback: Callable[[str, types.ModuleType], None], patterns: list[str]):
        self._callback = callback
        self._patterns = patterns
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if getattr(self._busy, "on", False) or not any(fnmatch.fnmatchcase(fullname, p) for p in self._patterns):
            return None
        self._busy.on = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.on = False
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _NotifyingLoader(spec.loader, self._callback)
        return spec


class _NotifyingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, callback: Callable[[str, types.ModuleType], None]):
        self._loader, self._callback = loader, callback

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        self._callback(module.__name__, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def _rest_sample() -> dict[str, Any]:
    """This process's threads and MLX active memory now (`fuzz.rest.RestSample`'s fields)."""
    mx = sys.modules.get("mlx.core")
    active = mx.get_active_memory() if mx is not None and hasattr(mx, "get_active_memory") else None
    return {"threads": threading.active_count(), "mlx_active": active}


# -- records in a file (a sentinel injected into another process) ------------
@functools.lru_cache(maxsize=1)
def mlx_version() -> str:
    """The MLX version this process runs ("" when MLX is not importable), read from its metadata so
    asking never imports MLX."""
    from importlib.metadata import PackageNotFoundError, version

    for name in ("mlx", "mlx-cuda", "mlx-metal"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return ""


def file_emitter(path: str) -> Callable[[Event], None]:
    """Append each finished span or error as one JSON line in one write: a line written in pieces could be cut by
    a kill between them, and a process that forks mid-write would flush its copy of the half line again."""
    lock = threading.Lock()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def emit(event: Event) -> None:
        line = (json.dumps(asdict(event), default=str) + "\n").encode("utf-8")
        with lock:
            while line:
                line = line[os.write(fd, line):]
    return emit


def _parse_record(line: str) -> Optional[dict[str, Any]]:
    """One line's record. A half line a killed writer left runs into the next process's record: that one is
    read from its opening, which an unescaped `{"seq": ` marks (inside a JSON string it reads \\"seq\\")."""
    for start in (0, line.rfind('{"seq": ')):
        if start >= 0:
            try:
                return json.loads(line[start:])
            except ValueError:
                pass
    return None


def read_records(path: str, offset: int = 0) -> tuple[list[Event], int]:
    """Events written by `file_emitter` in the lines that begin at byte `offset` or later, and the offset to
    continue from. `offset` may be any size the file had, taken while a line was being written: that line began
    before it and is skipped."""
    events: list[Event] = []
    start = max(offset - 1, 0)
    try:
        with open(path, "rb") as handle:
            handle.seek(start)
            data = handle.read()
    except FileNotFoundError:
        return events, offset
    if offset > 0:
        first = data.find(b"\n")
        if first < 0:
            return events, offset  # the line in progress at `offset` is not finished yet
        data, start = data[first + 1:], start + first + 1
    complete = data[: data.rfind(b"\n") + 1]
    for raw in complete.decode("utf-8", errors="replace").splitlines():
        fields = _parse_record(raw)
        if fields is None:
            continue
        if "injection_error" in fields:
            events.append(Event(0, "check", "startup-failed", info={"error": fields["injection_error"]}))
            continue
        fields["stack"] = tuple(fields.get("stack", ()))
        events.append(Event(**fields))
    return events, start + len(complete)
