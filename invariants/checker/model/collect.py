"""Summarize one file (`summary.FileSummary`) from CPython's `ast`: several times cheaper than
libcst, and a summary needs names and calls only.

Two steps. `scan.Scanner` walks each def's own body once (nested defs, lambdas and classes are
defs of their own) and keeps what it binds, assigns to `self.x`, calls, iterates, returns and
awaits. `_Resolver` then names each call through the scopes: a def's locals, the defs around
it, the module (imports, defs, classes, module-level instances); `self` is an instance of the
method's class and its attributes hold what the class's methods assign them. A name with two
different values, or one the summary cannot name, is unknown: never MLX.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from mlx_invariants.checker import mlx_api, mlx_facts, source
from mlx_invariants.checker.cancellers import DEADLINES, ROUTE_DECORATORS
from mlx_invariants.checker.globs import matcher, matches_name
from mlx_invariants.checker.model import blocking, classify, raises, streams, waits
from mlx_invariants.checker.model.scan import SCOPES, UNKNOWN, Def, Scanner, child_name, dotted, imported
from mlx_invariants.checker.model.scan import own_nodes as _own_nodes
from mlx_invariants.checker.model.summary import (
    AWAITED, BIND, BLOCK, DEFAULT_POOL, DETACHED, EXECUTOR, GEN, ITERATED, LOAD, MODEL, ONE_THREAD, OWNER, PLAIN, RETURNED, RETURNS, THREAD,
    WEB_APPS, Call, Class, FileSummary, Function, Offload, Place, Touch,
)
from mlx_invariants.checker.startup import LIFESPAN, SERVES, STARTUP, startup_kind

_LINES = re.compile(r"\r\n|\r|\n")
# A def declared to run on the MLX owner thread, by a comment on its `def` line (docs/checker.md "Declared roles").
_OWNER_MARK = re.compile(r"#\s*invariants:\s*owner-thread\b")
# A lock declared to guard MLX, by a comment on the line that assigns it: `self._lock = Lock()  # invariants: mlx-lock`.
_LOCK_MARK = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(?::[^=#]*)?=[^=].*#\s*invariants:\s*mlx-lock\b")
# Decorators that leave "calling it runs its body" true.
_PLAIN_DECORATORS = frozenset({
    "staticmethod", "classmethod", "functools.wraps", "functools.lru_cache", "functools.cache", "lru_cache", "cache",
    "abc.abstractmethod", "abstractmethod", "typing.overload", "typing.override", "override", "mlx.core.compile",
    "torch.no_grad", "torch.inference_mode", "wraps",
})
_UNWRAP = frozenset({"functools.partial", "partial"})
_LAZY_IMPORTS = frozenset({"importlib.import_module", "__import__"})  # a call that names a module by a string
# What makes a task of a coroutine on the running loop; a TaskGroup's `create_task` is not here (the group cancels
# its tasks when one fails, so a task dropped there is still cancelled by its siblings).
_TASK_MAKERS = frozenset({"asyncio.create_task", "asyncio.ensure_future", "asyncio.get_running_loop().create_task",
                          "asyncio.get_event_loop().create_task"})
# What a class body may hold for its attributes to be known from the summary (Class.names).
_CLOSED_BODY = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign, ast.Expr, ast.Pass)
_COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.FunctionDef,
             ast.AsyncFunctionDef, ast.ClassDef, ast.ExceptHandler) + ((ast.Match,) if hasattr(ast, "Match") else ())
def summarize(text: str, shared: dict[str, Any], holds: frozenset[str] = frozenset()) -> FileSummary:
    """The summary of one file's text; raises SyntaxError (or ValueError) when it does not parse. `holds`: the
    facts of mlx_facts.ANALYSIS_FACTS true for its project."""
    tree = source.python_tree(text)
    resolver = _Resolver(text, shared, mlx_facts.rejected_keywords(holds))
    try:
        return resolver.summary(tree)
    finally:
        # The resolver and its scanner name each other: a cycle that held the resolver's defs, and through
        # them the whole ast tree, until the cyclic collector ran. Broken, all of it is freed on return, and
        # the package-wide steps need no collector (runner._cyclic_gc_paused).
        resolver.scanner = None  # type: ignore[assignment]


class _Resolver:
    def __init__(self, text: str, shared: dict[str, Any], rejected: frozenset[str] = frozenset()) -> None:
        self.lines = _LINES.split(text)
        self.shared = shared
        self.rejected = rejected  # generation keywords that raise on the project's mlx-lm
        self.imports_mlx = False
        self.module = Def(None, "", None)  # type: ignore[arg-type]
        self.defs: list[Def] = []
        self.classes: dict[str, dict[str, Any]] = {}  # local name -> {"bases": [...], "attrs": {name: [values]}, "defs": owner}
        self.scanner = Scanner(self)
        self._resolving: set[tuple[int, str]] = set()
        self._inner: dict[tuple[int, str], Def] = {}  # (id of a def, name) -> a def nested in it
        self._values: dict[tuple[int, str], str | None] = {}
        self.declared_locks = tuple(dict.fromkeys(
            m.group(1) for line in self.lines if "mlx-lock" in line and (m := _LOCK_MARK.match(line))))
        self.lock_names = matcher([*shared["lock-names"], *shared["mlx-locks"], *self.declared_locks])
        self.binders = matcher(shared["stream-binders"])

    # --- structure ---------------------------------------------------------------------------
    def summary(self, tree: ast.Module) -> FileSummary:
        self._module_body(tree.body)
        self._by_name = {fn.name: fn for fn in self.defs}
        made = streams.made(self)
        self._stream_names = streams.candidates(self, made)
        self._library_streams = any("generation_stream" in line for line in self.lines)
        self._star = any("import *" in line for line in self.lines)
        self._tree = tree
        self._bound: frozenset[str] | None = None  # every name the file binds (raises.bound_anywhere), when asked
        functions: dict[str, Function] = {}
        for fn in self.defs:
            functions[fn.name] = self._function(fn)
        classes = {name: self._class(name) for name in self.classes}
        names = {}
        for name in self.module.bindings:
            ref = self.lookup(name, self.module)
            if ref is not None and not ref.startswith("$") and ref != f":{name}":
                names[name] = ref
        return FileSummary(self.imports_mlx, names, functions, classes, self.declared_locks,
                           {name: self._place(call, None) for name, call in made.items()},
                           frozenset(self.module.bindings), self._star, self._app_state())

    def _app_state(self) -> dict[str, str]:
        """What this file stores on a Starlette/FastAPI app's state (`app.state.engine = Engine()`, in a lifespan
        or at import), by attribute: the one value every such store agrees on. A route reads it back as
        `request.app.state.engine` (graph.py, `_member`); a store of None (a shutdown's) says nothing."""
        found: dict[str, set[str | None]] = {}
        for scope in (self.module, *self.defs):
            where = None if scope is self.module else scope
            for attr, base, value in scope.state_attrs:
                if _is_none(value) or not _app_object(base, self.ref(base, where)):
                    continue
                ref = self.ref(value, where)
                found.setdefault(attr, set()).add(None if ref is None or ref.startswith("$") else ref)
        return {attr: refs.pop() for attr, refs in found.items() if len(refs) == 1 and None not in refs}

    def _module_body(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, SCOPES):
                self.nested(stmt, None)
                self.module.bindings.setdefault(stmt.name, []).append(":" + stmt.name)
            elif isinstance(stmt, ast.Import | ast.ImportFrom):
                for local, ref in imported(stmt):
                    self.module.bindings.setdefault(local, []).append(ref)
                    self.note_import(ref)
            elif isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    self._module_assign(target, stmt.value)
            elif isinstance(stmt, ast.AnnAssign):
                self._module_assign(stmt.target, stmt.value, stmt.annotation)
            elif isinstance(stmt, ast.If | ast.Try | ast.With):
                for part in ("body", "orelse", "finalbody"):
                    self._module_body(getattr(stmt, part, []))
                for handler in getattr(stmt, "handlers", []):
                    self._module_body(handler.body)
            elif hasattr(ast, "TryStar") and isinstance(stmt, ast.TryStar):
                self._module_body(stmt.body)

    def _module_assign(self, target: ast.AST, value: ast.AST | None, annotation: ast.AST | None = None) -> None:
        if not isinstance(target, ast.Name):
            if isinstance(target, ast.Attribute) and value is not None:
                self.scanner.assign(self.module, target, value)
            else:
                self.scanner.bind_target(self.module, target)
            return
        if annotation is not None:
            self.module.bindings.setdefault(target.id, []).append(("annotation", annotation))
        elif value is not None:
            self.module.bindings.setdefault(target.id, []).append(value)

    def nested(self, node: ast.AST, parent: Def | None) -> None:
        """Register a def, lambda or class found in `parent`'s body (None: the module's)."""
        name = child_name(parent, node)
        scope = parent.parent if parent is not None and isinstance(parent.node, ast.ClassDef) else parent
        if isinstance(node, ast.ClassDef):
            info = self.classes.setdefault(name, {"bases": [], "attrs": {}, "scope": scope})
            info["bases"] = list(node.bases)
            info["closed"] = not node.decorator_list and not node.keywords and all(
                isinstance(stmt, _CLOSED_BODY) for stmt in node.body)
            holder = Def(node, name, scope)
            for stmt in node.body:
                if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                    self._def(stmt, f"{name}.{stmt.name}", scope, cls=name)
                elif isinstance(stmt, ast.ClassDef):
                    self.nested(stmt, holder)
                elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                    info["attrs"].setdefault(stmt.targets[0].id, []).append((scope, stmt.value))
                elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    info["attrs"].setdefault(stmt.target.id, []).append((scope, ("annotation", stmt.annotation)))
            return
        self._def(node, name, scope)

    def local_ref(self, node: ast.AST, parent: Def | None) -> str:
        return ":" + child_name(parent, node)

    def _def(self, node: ast.AST, name: str, parent: Def | None, cls: str | None = None) -> None:
        fn = Def(node, name, parent, cls)
        args = node.args  # type: ignore[attr-defined]
        params = [a.arg for a in (*args.posonlyargs, *args.args)]
        decorators = [_decorator_name(d) for d in getattr(node, "decorator_list", ())]
        bound = cls is not None and "staticmethod" not in decorators
        if bound and params:
            first = params.pop(0)
            fn.bindings[first] = [f":{cls}" if "classmethod" in decorators else f":{cls}()"]
        fn.params = params + [a.arg for a in args.kwonlyargs]
        for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs):
            if arg.arg in fn.bindings:
                continue
            fn.bindings[arg.arg] = [("annotation", arg.annotation) if arg.annotation is not None else f"${arg.arg}"]
        for arg in (args.vararg, args.kwarg):
            if arg is not None:
                fn.bindings[arg.arg] = [UNKNOWN]
        fn.opaque = any(d not in _PLAIN_DECORATORS for d in decorators)
        self.defs.append(fn)
        if parent is not None and cls is None and not isinstance(node, ast.Lambda):
            self._inner[(id(parent), node.name)] = fn  # type: ignore[attr-defined]
        body = [node.body] if isinstance(node, ast.Lambda) else node.body  # type: ignore[attr-defined]
        self.scanner.scan(fn, body)
        if cls is not None:
            for attr, value in fn.self_attrs:
                self.classes[cls]["attrs"].setdefault(attr, []).append((fn, value))

    def note_import(self, ref: str) -> None:
        if ref.split(".", 1)[0] in ("mlx", "mlx_lm", "mlx_vlm"):
            self.imports_mlx = True

    # --- names -------------------------------------------------------------------------------
    def lookup(self, name: str, fn: Def | None) -> str | None:
        """What `name` holds in `fn`'s scope: its locals, the defs around it, then the module."""
        scope = fn
        while scope is not None:
            if name in scope.bindings and name not in scope.nonlocal_names:
                return self._value_of(scope, name)
            scope = scope.parent
        if name in self.module.bindings:
            return self._value_of(self.module, name)
        return None

    def _value_of(self, scope: Def, name: str) -> str | None:
        key = (id(scope), name)
        if key in self._values:
            return self._values[key]
        if key in self._resolving:
            return None
        self._resolving.add(key)
        try:
            refs = {self._value_ref(v, scope) for v in scope.bindings[name] if not _is_none(v)}
        finally:
            self._resolving.discard(key)
        found = refs.pop() if len(refs) == 1 else None
        if not self._resolving:  # a value found inside a cycle may be partial: keep only outermost answers
            self._values[key] = found
        return found

    def _value_ref(self, value: Any, scope: Def) -> str | None:
        if isinstance(value, str):
            return None if value == UNKNOWN else value
        if isinstance(value, tuple):  # ("annotation", node): an instance of the annotated class
            cls = _annotation(value[1])
            ref = self.ref(cls, None if scope is self.module else scope) if cls is not None else None
            return f"{ref}()" if ref and not ref.startswith("$") else None
        if isinstance(value, ast.Await):  # `gen = await asyncio.to_thread(engine.stream, prompt)`: what the call made
            value = self._handed_call(value.value, scope)
        return self.ref(value, scope)

    def _handed_call(self, call: ast.AST, fn: Def) -> ast.Call | None:
        """`f(*args)` for a handoff of `f` to another thread (`asyncio.to_thread(f, ...)`,
        `loop.run_in_executor(pool, f, ...)`): awaiting it gives what that call returns."""
        if not isinstance(call, ast.Call):
            return None
        if isinstance(call.func, ast.Attribute) and call.func.attr == "run_in_executor":
            target = _positional(call, 1)
        elif self.ref(call.func, fn) in classify.TO_THREAD:
            target = _positional(call, 0)
        else:
            return None
        target = self._unwrap(target, fn)
        return ast.Call(func=target, args=[], keywords=[]) if isinstance(target, ast.Name | ast.Attribute) else None

    def ref(self, expr: ast.AST | None, fn: Def | None) -> str | None:
        """The reference string of a name, attribute chain or call result, else None."""
        if isinstance(expr, ast.Name):
            return self.lookup(expr.id, fn)
        if isinstance(expr, ast.Attribute):
            base = self.ref(expr.value, fn)
            if base is None or base.startswith("$"):
                return None
            return f"{base}.{expr.attr}"
        if isinstance(expr, ast.Call):
            named = self._named_by_call(expr, fn)
            if named is not None:
                return named
            base = self.ref(expr.func, fn)
            if base is None or base.startswith("$") or base.endswith("()"):
                return None
            return f"{base}()"
        if isinstance(expr, ast.Lambda):
            return self.local_ref(expr, fn)
        return None

    def _named_by_call(self, call: ast.Call, fn: Def | None) -> str | None:
        """What a call only names, running nothing: a lazy import (`importlib.import_module("mlx_lm")`, the
        module), `getattr(mlx_lm, "stream_generate")` (the attribute), `typing.cast(T, value)` and `iter(gen)`
        (the value), and
        a def of this file whose every `return` is one of these (`_require_mlx_lm()`). Engines with optional
        backends reach MLX this way: avalan-ai/avalan's `MlxLmModel` called `getattr(_require_mlx_lm(),
        "stream_generate")` (src/avalan/model/nlp/text/mlxlm.py@861b268:150)."""
        func = dotted(call.func)
        if func is None:
            return None
        first, second = _positional(call, 0), _positional(call, 1)
        if func == "iter" and len(call.args) == 1 and not call.keywords and self.lookup("iter", fn) is None:
            return self.ref(first, fn)  # an iterator's (a generator's) own iterator is itself
        if func == "getattr" and _text(second) is not None and not call.keywords:
            base = self.ref(first, fn)
            return f"{base}.{_text(second)}" if base is not None and not base.startswith("$") else None
        head = func.split(".", 1)[0]
        target = self.lookup(head, fn)
        qual = f"{target}{func[len(head):]}" if target is not None else func if func == "__import__" else None
        if qual in _LAZY_IMPORTS and (module := _text(first)) is not None and not module.startswith("."):
            return module if qual == "importlib.import_module" else module.split(".", 1)[0]
        if qual == "typing.cast" and second is not None:
            return self.ref(second, fn)
        helper = getattr(self, "_by_name", {}).get(qual[1:]) if qual is not None and qual.startswith(":") and not call.args else None
        if helper is None or (id(helper), "<return>") in self._resolving:
            return None
        self._resolving.add((id(helper), "<return>"))
        try:
            returned = {self.ref(node.value, helper) for node in _own_nodes(helper.node)
                        if isinstance(node, ast.Return) and isinstance(node.value, ast.Call)}
        finally:
            self._resolving.discard((id(helper), "<return>"))
        found = returned.pop() if len(returned) == 1 else None
        return found if found is not None and not found.startswith((":", "$")) and "()" not in found else None

    # --- per def -------------------------------------------------------------------------------
    def _function(self, fn: Def) -> Function:
        node = fn.node
        iterated_at: dict[int, tuple[ast.AST, ast.stmt | None]] = {}  # a call assigned to a local iterated later
        for name, site, stmt in fn.name_iterations:
            for call, _use, _site, _stmt in fn.calls:
                if fn.assigned_calls.get(id(call)) == name and id(call) not in iterated_at:  # the first loop over it
                    iterated_at[id(call)] = (site, stmt)
        calls: list[Call] = []
        offloads: list[Offload] = []
        touches: list[Touch] = []
        blocked: list[Touch] = []
        deadline = False
        detached: set[int] = set()  # the coroutine calls handed to a task nobody keeps
        for call, use, site, stmt in fn.calls:
            deadline = deadline or (dotted(call.func) or "").rpartition(".")[2] in DEADLINES
            iter_place = None
            if use == ITERATED or id(call) in iterated_at:
                where_site, where_stmt = (site, stmt) if use == ITERATED else iterated_at[id(call)]
                iter_place = self._place(where_site or call, where_stmt)
                use = ITERATED
            elif use == RETURNED and fn.generator:
                use = PLAIN
            work = self._offload(call, fn, stmt)
            if work is not None:
                offloads.append(work)
                continue
            target = self.ref(call.func, fn)
            if target in _TASK_MAKERS and isinstance(stmt, ast.Expr) and stmt.value is call and call.args \
                    and isinstance(call.args[0], ast.Call):
                detached.add(id(call.args[0]))  # the task is dropped: nothing can cancel it but the loop's end
            elif id(call) in detached:
                use = DETACHED
            if mlx_api.rejected_generation(target, (k.arg for k in call.keywords), self.rejected):
                target = None  # it raises before any MLX runs
            text = dotted(call.func) or (target or "")
            if use != "await" and waits.named(call) and waits.blocks(self._typed(call.func, target, fn), call) \
                    and not waits.checked_out(call, (c for c, *_ in fn.calls)):
                blocked.append(Touch(waits.THREAD, text, call.lineno, self._place(call, stmt)))
                continue
            if use != "await" and blocking.named(call) and (held := blocking.kind(self._typed(call.func, target, fn))):
                blocked.append(Touch(held, text, call.lineno, self._place(call, stmt)))
                continue
            if target in classify.STREAM_BINDING or self.binders(text):
                touches.append(Touch(BIND, text, call.lineno))
            if mlx_api.no_op(target, len(call.args) + len(call.keywords)):
                continue  # `mx.eval()`: nothing runs, nothing to follow
            kind = self._mlx(call, target, text, fn, use)
            if kind is None and use != AWAITED and blocking.guessed(
                    call, stmt, lambda: _own_nodes(node), isinstance(node, ast.AsyncFunctionDef)):
                blocked.append(Touch(blocking.GUESSED, ast.unparse(call.func), call.lineno, self._place(call, stmt)))
            if kind is not None:
                touches.append(Touch(kind[0], kind[1], call.lineno, self._place(call, stmt)))
                # A call by name is still the call the package model follows, and so is a coroutine named like a
                # loader and awaited (`await engine.load_model(path)`): model/cancel.py follows its awaiters.
                if kind[0] != MODEL and not (kind[0] == LOAD and use == AWAITED):
                    continue
            if target is None or (use == "await" and target.startswith("$")):
                continue
            calls.append(Call(target, text, self._place(call, stmt), use if use in (ITERATED, RETURNED, AWAITED, DETACHED) else PLAIN,
                              iter_place, self._args(call, fn)))
        line = getattr(node, "lineno", 0)
        owner = not isinstance(node, ast.Lambda | ast.ClassDef) and bool(
            _OWNER_MARK.search(self.lines[line - 1] if 0 < line <= len(self.lines) else ""))
        guards = tuple(fn.locked)
        fallbacks = _fallbacks(node, set(fn.params), [o.place.line for o in offloads]) if offloads else ()
        is_async = isinstance(node, ast.AsyncFunctionDef)
        own = _own_nodes(node)
        return Function(fn.name, line, is_async, fn.generator,
                        tuple(fn.params), fn.opaque, tuple(calls), tuple(offloads), tuple(touches), owner, guards,
                        fallbacks, is_async and _loops(own), _startup(node, own, self._serves(fn)) if is_async else None,
                        tuple(blocked), is_async and any(_runs_on_thread(d) for d in node.decorator_list),
                        getattr(node, "end_lineno", None) or line, is_async and any(map(_route, node.decorator_list)),
                        deadline, self._returns(fn), _is_property(node), self._streams(fn, own),
                        fn.cls is not None and _is_stub(node), self._raises(fn), _lazy_setup(own, fn.nonlocal_names))

    def _raises(self, fn: Def) -> tuple[tuple[int, int, str], ...]:
        """The calls of `fn` that may raise each time their statement runs, with the lines they would keep from
        running (model/raises.py): "" for a call whose first name the file binds nowhere (NameError)."""
        found: list[tuple[int, int, str]] = []
        blocks: raises.Blocks | None = None
        seen: set[int] = set()
        for _call, _use, _site, stmt in fn.calls:
            if stmt is None or id(stmt) in seen:
                continue
            seen.add(id(stmt))
            refs = []
            for node in raises.evaluated(stmt):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and not self._star \
                        and self._unbound(node.id, fn):
                    refs = [""]  # NameError, whatever else the statement calls
                    break
                if isinstance(node, ast.Call):
                    target = self.ref(node.func, fn)
                    if target is not None and "." in target and not target.startswith(("$", ":")) \
                            and target.partition(".")[0] not in raises.NOT_THE_PACKAGE:
                        refs.append(target)
            if not refs:
                continue
            blocks = blocks or raises.Blocks(fn.node)
            after = blocks.after(stmt)
            if after is not None:
                found.extend((*after, ref) for ref in refs)
        return tuple(found)

    def _unbound(self, name: str, fn: Def) -> bool:
        """`name`, read in `fn`, is bound nowhere in the file: reading it raises NameError. A builtin, or a name
        a scope around `fn` binds (every binding a def or the module keeps is one the file makes), is bound;
        only another name needs the walk over every node of the file (raises.bound_anywhere), made once."""
        if name in raises.BUILTINS:
            return False
        scope: Def | None = fn
        while scope is not None:
            if name in scope.bindings:
                return False
            scope = scope.parent
        if name in self.module.bindings:
            return False
        if self._bound is None:
            self._bound = raises.bound_anywhere(self._tree)
        return name not in self._bound

    def _streams(self, fn: Def, own: list[ast.AST]) -> tuple[tuple[str, Place], ...]:
        """The module-level streams `fn`'s own body (its nodes: `own`) reads, where first (model/streams.py)."""
        if not self._stream_names and not self._library_streams:
            return ()
        first: dict[str, Place] = {}
        for ref, node in streams.read(self, fn, own, self._stream_names, self._library_streams):
            place = self._place(node, None)
            if ref not in first or (place.line, place.col) < (first[ref].line, first[ref].col):
                first[ref] = place
        return tuple(first.items())

    def _serves(self, fn: Def) -> int | None:
        """The first line of the first statement of `fn`'s own body that calls its server's serve call
        (startup.SERVES: `server.serve()` on a `uvicorn.Server` named here or kept on `self`), else None."""
        lines = []
        for call, _use, _site, stmt in fn.calls:
            func = call.func
            ref = self.ref(func, fn)
            if ref not in SERVES and isinstance(func, ast.Attribute):
                ref = f"{self._deref(self.ref(func.value, fn))}.{func.attr}"
            if ref in SERVES:
                lines.append(stmt.lineno if stmt is not None else call.lineno)
        return min(lines, default=None)

    def _returns(self, fn: Def) -> str | None:
        """An instance of the class the def's return annotation names, looked up where the def is (a getter
        `def get_engine() -> Engine:` hands out an `Engine`); None for a generator, an `async def` (its call
        gives a coroutine) or an annotation the summary cannot name."""
        node = fn.node
        if not isinstance(node, ast.FunctionDef) or node.returns is None or fn.generator:
            return None
        return self._value_ref(("annotation", node.returns), fn.parent or self.module)

    def _mlx(self, call: ast.Call, target: str | None, text: str, fn: Def, use: str) -> tuple[str, str] | None:
        """(kind, text) when `call` is itself MLX work: by its imported name, or, in a file that
        imports MLX, by the names engines give their wrappers (a receiver this file types as one
        of the package's own classes is left to the package model instead)."""
        if target is not None and not target.startswith((":", ".", "$")):
            if classify.is_generator(target):
                if use == ITERATED:
                    return GEN, f"iterating {text}"
                return (RETURNS, text) if use == RETURNED else None
            kind = classify.by_name(target)
            if kind is not None:
                return kind, text
        if mlx_api.is_load_name(text, target) and not self._own_def(target):
            return LOAD, text
        if not self.imports_mlx:
            return None
        func = call.func
        if isinstance(func, ast.Name) and func.id == "next" and call.args:
            return (GEN, "next() on an MLX generator") if self._is_mlx_generator(call.args[0], fn) else None
        if target is not None and target.startswith((":", ".")):
            if self._followed(target):
                return None
            kind = self._by_names(call, text, fn, use)
            return (MODEL, kind[1]) if kind is not None and kind[0] in (BLOCK, GEN) else None
        return self._by_names(call, text, fn, use)

    def _by_names(self, call: ast.Call, text: str, fn: Def, use: str) -> tuple[str, str] | None:
        """The kind the names engines give their MLX wrappers say a call is (a model-named receiver's
        generate, a batch generator's step, a forward pass)."""
        func = call.func
        if isinstance(func, ast.Attribute):
            receiver = dotted(func.value) or ""
            built = self._built_as_batch_generator(func.value, fn)
            kind = classify.by_receiver(text, func.attr, receiver, self.shared, built)
            if kind is not None:
                return kind, text
            if func.attr in classify.MODEL_STREAMS and classify.is_forward_pass(receiver, self.shared):
                if use == ITERATED:
                    return GEN, f"iterating {text}"
                return (RETURNS, text) if use == RETURNED else None
        if isinstance(func, ast.Name | ast.Attribute) and classify.is_forward_pass(text, self.shared):
            return BLOCK, f"{text}(...)"
        return None

    def _own_def(self, target: str | None) -> bool:
        """`target` is a def of the package the model follows: what it does is read from its body, not
        guessed from its name. A project's `_load_model` that only records a model's name loads nothing
        (issue 23, set c: two findings on smart-home's Whisper front end, graded false blind)."""
        return target is not None and target.startswith((":", ".")) and self._followed(target)

    def _followed(self, target: str) -> bool:
        """`target` (a reference of this file or package) names what the package model follows: not
        an attribute of a class of this file that holds an MLX object or a value the file does not
        name (`self.model = load(path)`, `self.model = model`), whose calls the names decide."""
        if not target.startswith(":") or "()." not in target:
            return True
        cls, _, rest = target[1:].partition("().")
        attr = rest.split(".", 1)[0]
        if cls not in self.classes or f"{cls}.{attr}" in self._by_name:
            return True
        value = self._class_attr(cls, attr)
        return value is not None and not value.startswith(("mlx.", "mlx_lm.", "mlx_vlm."))

    def _typed(self, func: ast.AST, target: str | None, fn: Def) -> str | None:
        """The callee's name with its receiver typed: `self._cond.wait` -> `threading.Condition().wait`
        when the class assigns `self._cond = threading.Condition()`."""
        if isinstance(func, ast.Attribute):
            receiver = self._deref(self.ref(func.value, fn))
            if receiver is not None and not receiver.startswith("$"):
                return f"{receiver}.{func.attr}"
        return target

    def _is_mlx_generator(self, expr: ast.AST, fn: Def) -> bool:
        ref = self.ref(expr, fn)
        ref = self._deref(ref)
        return bool(ref) and ref.endswith("()") and classify.is_generator(ref[:-2])  # type: ignore[union-attr]

    def _built_as_batch_generator(self, expr: ast.AST, fn: Def) -> bool:
        ref = self._deref(self.ref(expr, fn))
        return bool(ref) and ref.endswith("()") and ref[:-2].rsplit(".", 1)[-1].endswith("BatchGenerator")  # type: ignore[union-attr]

    def _deref(self, ref: str | None) -> str | None:
        """`:Engine().gen` -> what `Engine`'s methods assign to `self.gen`, when this file knows it."""
        if ref is None or not ref.startswith(":") or "()." not in ref:
            return ref
        head, _, attr = ref[1:].rpartition("().")
        if head in self.classes and "." not in attr:
            return self._class_attr(head, attr)
        return ref

    def _offload(self, call: ast.Call, fn: Def, stmt: ast.stmt | None) -> Offload | None:
        func = call.func
        target_expr: ast.AST | None = None
        pool = ""
        after: int | None = None  # the position of the first argument the callable is given, where known
        how = dotted(func) or (func.attr if isinstance(func, ast.Attribute) else "a thread handoff")
        if isinstance(func, ast.Attribute) and func.attr == "run_in_executor":
            executor = _positional(call, 0)
            pool = DEFAULT_POOL if isinstance(executor, ast.Constant) and executor.value is None else (
                OWNER if matches_name(dotted(executor), self.shared["owner-executors"]) else
                ONE_THREAD if self._one_thread(executor, fn) else EXECUTOR)
            target_expr, after = _positional(call, 1), 2
        elif isinstance(func, ast.Attribute) and func.attr == "submit":
            receiver = self._deref(self.ref(func.value, fn)) or ""
            if not (receiver.endswith("()") and receiver[:-2] in classify.POOLS) and not matches_name(
                dotted(func.value), classify.EXECUTOR_NAMES + self.shared["owner-executors"]
            ):
                return None
            owner = matches_name(dotted(func.value), self.shared["owner-executors"])
            pool = OWNER if owner else ONE_THREAD if self._one_thread(func.value, fn) else EXECUTOR
            target_expr, after = _positional(call, 0), 1
        else:
            qual = self.ref(func, fn)
            if qual in classify.TO_THREAD:
                pool, target_expr = DEFAULT_POOL, _positional(call, 0)
                after = 1
            elif qual in ("threading.Thread",):
                pool = THREAD
                target_expr = next((k.value for k in call.keywords if k.arg == "target"), None)
            else:
                return None
        target_expr = self._unwrap(target_expr, fn)
        target = self.ref(target_expr, fn) if target_expr is not None else None
        param = self._forwarded(target_expr, fn)
        if target is not None and target.startswith("$"):
            target = None
        serialized = self._serialized(call.lineno, fn)
        stepped = self._stepped(target_expr, _positional(call, after) if after is not None else None, fn)
        body = target_expr.body if isinstance(target_expr, ast.Lambda) else None
        return Offload(how, pool, target, param, self._place(call, stmt), dotted(target_expr) or "lambda"
                       if target_expr is not None else "callable", serialized, stepped,
                       dotted(body.func) if isinstance(body, ast.Call) else None)

    def _stepped(self, target: ast.AST | None, first: ast.AST | None, fn: Def) -> str | None:
        """The generator a handed-over callable steps, named as `fn` holds it: the builtin `next` handed over
        with it (`run_in_executor(None, next, gen)`), or a lambda or a nested def of `fn` that calls `next` on a
        name of `fn`'s or loops over it (`def get_next(): return next(gen)`). `$name` for a parameter; the
        reference of the call that made it for a local (`engine.stream()`); None for anything else. Each
        `next()` then runs the generator's body up to its next `yield` on the pool's thread of that call
        (heylookitsanllm's stream wrapper, src/heylook_llm/streaming_utils.py@4ce23f9:56)."""
        name: str | None = None
        if isinstance(target, ast.Name) and target.id == "next" and self.lookup("next", fn) is None:
            if not isinstance(first, ast.Name):
                return self._constructor_parameter(first, fn)
            name = first.id
        else:
            inner = self._inner.get((id(fn), target.id)) if isinstance(target, ast.Name) else None
            body = target.body if isinstance(target, ast.Lambda) else inner.node if inner is not None else None
            name = _stepped_name(body) if body is not None else None
        ref = self.lookup(name, fn) if name is not None else None
        return ref if ref is not None and (ref == f"${name}" or ref.endswith("()")) else None

    def _constructor_parameter(self, expr: ast.AST | None, fn: Def) -> str | None:
        """`self.attr` where the class's one store into it is `self.attr = param` in its `__init__`, as
        `$Class.__init__:param`: the generator an async adapter is built around and steps on a pool, one
        `to_thread(next, self._iterator)` per item (avalan-ai/avalan's `MlxLmStream`,
        src/avalan/model/nlp/text/mlxlm.py@861b268:99, built as `MlxLmStream(iter(stream_generate(...)))`)."""
        if not (isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self"):
            return None
        method = fn
        while method is not None and method.cls is None:
            method = method.parent
        info = self.classes.get(method.cls) if method is not None and method.cls is not None else None
        values = info["attrs"].get(expr.attr, []) if info is not None else []
        if len(values) != 1:
            return None
        scope, value = values[0]
        init = f"{method.cls}.__init__"  # type: ignore[union-attr]
        if (scope is None or scope.name != init or not isinstance(value, ast.Name) or value.id not in scope.params
                or len(scope.bindings.get(value.id, ())) > 1):  # the parameter as passed, annotated or not
            return None
        return f"${init}:{value.id}"

    def _one_thread(self, executor: ast.AST | None, fn: Def) -> bool:
        """`executor` is a thread pool this file builds with one worker (`ThreadPoolExecutor(max_workers=1)`),
        every value it is given agreeing: its one thread serializes what it runs (offload.is_owner_executor)."""
        values: list[tuple[Def | None, Any]] = []
        if isinstance(executor, ast.Attribute) and isinstance(executor.value, ast.Name) and executor.value.id == "self":
            method = fn
            while method is not None and method.cls is None:
                method = method.parent
            info = self.classes.get(method.cls) if method is not None and method.cls is not None else None
            values = list(info["attrs"].get(executor.attr, ())) if info is not None else []
        elif isinstance(executor, ast.Name):
            scope: Def | None = fn
            while scope is not None and executor.id not in scope.bindings:
                scope = scope.parent
            holder = scope if scope is not None else self.module
            values = [(holder, v) for v in holder.bindings.get(executor.id, ())]
        values = [(scope, v) for scope, v in values if not _is_none(v)]
        return bool(values) and all(
            isinstance(v, ast.Call) and self.ref(v.func, scope if scope is not self.module else None) in classify.THREAD_POOLS
            and _workers(v) == 1 for scope, v in values)

    def _serialized(self, line: int, fn: Def) -> bool:
        """Line `line` of `fn` runs under a lock: in `with <lock>:`, or in `with helper(...):` where
        `helper` is a def of this file that takes a lock (an admission slot around the lock)."""
        if any(first <= line <= last for first, last, _ in fn.locked):
            return True
        for (first, last), func in fn.entered:
            if first <= line <= last:
                ref = self.ref(func, fn) or ""
                helper = self._by_name.get(ref[1:].replace("()", "")) if ref.startswith(":") else None
                if helper is not None and self._takes_lock(helper):
                    return True
        return False

    def _takes_lock(self, fn: Def) -> bool:
        return bool(fn.locked) or any(
            isinstance(call.func, ast.Attribute) and call.func.attr == "acquire"
            and self.lock_names(dotted(call.func.value)) for call, *_ in fn.calls)

    def _unwrap(self, expr: ast.AST | None, fn: Def) -> ast.AST | None:
        while isinstance(expr, ast.Call) and (self.ref(expr.func, fn) in _UNWRAP or dotted(expr.func) in _UNWRAP):
            expr = _positional(expr, 0)
        return expr

    def _forwarded(self, expr: ast.AST | None, fn: Def) -> str | None:
        """The parameter of `fn` that `expr` is, or calls (a lambda, or a nested def named here)."""
        params = set(fn.params)
        if isinstance(expr, ast.Name) and expr.id in params and self.lookup(expr.id, fn) == f"${expr.id}":
            return expr.id
        body: ast.AST | None = None
        if isinstance(expr, ast.Lambda):
            body = expr.body
        elif isinstance(expr, ast.Name):
            inner = self._inner.get((id(fn), expr.id))
            body = inner.node if inner is not None else None
        if body is None:
            return None
        for node in ast.walk(body):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in params:
                return node.func.id
        return None

    def _args(self, call: ast.Call, fn: Def) -> tuple[tuple[int | str, str], ...]:
        found: list[tuple[int | str, str]] = []
        for index, arg in enumerate(call.args):
            if isinstance(arg, ast.Starred):
                break
            ref = self._arg_ref(arg, fn)
            if ref is not None:
                found.append((index, ref))
        for keyword in call.keywords:
            if keyword.arg is not None:
                ref = self._arg_ref(keyword.value, fn)
                if ref is not None:
                    found.append((keyword.arg, ref))
        return tuple(found)

    def _arg_ref(self, expr: ast.AST, fn: Def) -> str | None:
        """What an argument names: `$param`, a function or lambda, or a call's result (`engine.stream()`, or
        a local bound to one), which a helper may step (`Offload.stepped`)."""
        expr = self._unwrap(expr, fn)  # type: ignore[assignment]
        if not isinstance(expr, ast.Name | ast.Attribute | ast.Lambda | ast.Call):
            return None
        param = self._forwarded(expr, fn) if not isinstance(expr, ast.Call) else None
        if param is not None:
            return f"${param}"
        return self.ref(expr, fn)

    def _class(self, name: str) -> Class:
        info = self.classes[name]
        scope = info["scope"]
        bases = tuple(r for b in info["bases"] if (r := self.ref(b, scope)) is not None and not r.startswith("$"))
        attrs = {}
        for attr in info["attrs"]:
            ref = self._class_attr(name, attr)
            if ref is not None:
                attrs[attr] = ref
        names = None
        if info.get("closed") and len(bases) == len(info["bases"]):
            prefix = f"{name}."
            names = frozenset(info["attrs"]) | {n[len(prefix):].partition(".")[0] for n in self._by_name
                                                 if n.startswith(prefix)} | {
                n[len(prefix):].partition(".")[0] for n in self.classes if n.startswith(prefix)}
        return Class(name, bases, attrs, names)

    def _class_attr(self, cls: str, attr: str) -> str | None:
        values = self.classes[cls]["attrs"].get(attr)
        if not values:
            return None
        key = (id(values), attr)
        if key in self._resolving:
            return None
        self._resolving.add(key)
        try:
            refs = {self._value_ref(value, scope) if scope is not None else self._value_ref(value, self.module)
                    for scope, value in values if not _is_none(value)}
        finally:
            self._resolving.discard(key)
        if len(refs) != 1:
            return None
        ref = refs.pop()
        return None if ref is None or ref.startswith("$") else ref

    def _place(self, node: ast.AST, stmt: ast.stmt | None) -> Place:
        line = node.lineno  # type: ignore[attr-defined]
        text = self.lines[line - 1] if line - 1 < len(self.lines) else ""
        offset = node.col_offset  # type: ignore[attr-defined]
        col = offset if text.isascii() else len(text.encode("utf-8")[:offset].decode("utf-8", "replace"))
        if stmt is None:
            first, last = line, node.end_lineno or line  # type: ignore[attr-defined]
        elif isinstance(stmt, _COMPOUND):  # a finding in a compound statement's header: the header's lines
            end = stmt.iter.end_lineno if node is stmt and isinstance(stmt, ast.For) else (
                stmt.lineno if node is stmt else node.end_lineno)  # type: ignore[attr-defined]
            first, last = stmt.lineno, max(stmt.lineno, end or line)
        else:
            first, last = stmt.lineno, stmt.end_lineno or stmt.lineno
        above = first
        while above > 1 and self.lines[above - 2].lstrip().startswith("#"):
            above -= 1
        return Place(line, col + 1, first, last, above)


# Decorators that make a method an attribute: reading `obj.name` runs it and gives what it returns.
_PROPERTIES = frozenset({"property", "functools.cached_property", "cached_property"})


def _is_stub(node: ast.AST) -> bool:
    """A def with no body of its own: only a docstring, `...`, `pass` or `raise NotImplementedError`, or one
    decorated `@abstractmethod`."""
    if any(_decorator_name(d).rpartition(".")[2] == "abstractmethod" for d in getattr(node, "decorator_list", ())):
        return True
    body = getattr(node, "body", None)
    if not isinstance(body, list):
        return False
    for stmt in body:
        if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                                         and (stmt.value.value is ... or isinstance(stmt.value.value, str))):
            continue
        raised = stmt.exc.func if isinstance(stmt, ast.Raise) and isinstance(stmt.exc, ast.Call) else (
            stmt.exc if isinstance(stmt, ast.Raise) else None)
        if isinstance(raised, ast.Name) and raised.id == "NotImplementedError":
            continue
        return False
    return True


def _is_property(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef) and any(_decorator_name(d) in _PROPERTIES for d in node.decorator_list)


def _route(decorator: ast.AST) -> bool:
    """`@app.post(...)`, `@router.get(...)`: an HTTP route, as cancellers.plain_route recognises one."""
    return isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute) \
        and decorator.func.attr in ROUTE_DECORATORS


def _runs_on_thread(decorator: ast.AST) -> bool:
    """A decorator that runs the coroutine function on a thread of its own, with a loop of its own:
    one called with `thread=True` (Textual's `@work(thread=True)` worker, run by `asyncio.run` on a
    worker thread; issue 23, set h: mlx-chat's agent and speech workers, graded false blind as on the loop)."""
    return isinstance(decorator, ast.Call) and any(
        k.arg == "thread" and isinstance(k.value, ast.Constant) and k.value.value is True for k in decorator.keywords)


def _loops(own: list[ast.AST]) -> bool:
    """A def's own body (its nodes: `own`) has a `while` (nested defs and classes are theirs)."""
    return any(isinstance(n, ast.While) for n in own)


def _lazy_setup(own: list[ast.AST], declared: set[str]) -> tuple[tuple[int, int], ...]:
    """The bodies of `if X is None:` / `if not X:` branches of the def's own body that set X up once: X is a
    `global` the def declares (a module singleton: `if _engine is None: load_engine()`), or the branch
    assigns it (`if self._model is None: self._model = load(...)`). wadyatalkinabewt/koe's handlers call
    `get_engine()`, which loads and warms the engine only while `_engine` is None, and the server loads it
    before serving (src/server.py@db357b7:306, four INV108 findings graded false blind, set k). `own`: the
    def's own nodes."""
    found: list[tuple[int, int]] = []
    for branch in own:
        if not isinstance(branch, ast.If) or not branch.body:
            continue
        test = branch.test
        subject = (test.left if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Is)
                   and _is_none(test.comparators[0]) else
                   test.operand if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) else None)
        name = dotted(subject) if isinstance(subject, ast.Name | ast.Attribute) else None
        if name is None:
            continue
        assigned = {dotted(t) for n in branch.body for s in ast.walk(n) if isinstance(s, ast.Assign | ast.AnnAssign)
                    for t in (s.targets if isinstance(s, ast.Assign) else [s.target])}
        if name in assigned or (isinstance(subject, ast.Name) and name in declared):
            found.append((branch.body[0].lineno, branch.body[-1].end_lineno or branch.body[-1].lineno))
    return tuple(found)


def _fallbacks(node: ast.AST, params: set[str], handoffs: list[int]) -> tuple[tuple[int, int], ...]:
    """The lines of each arm of a mode `if` (outside loops, testing no parameter: checker/branches.py)
    whose other arm holds a hand-off to a thread: the mode without that worker."""
    found: list[tuple[int, int]] = []
    stack = [(child, False) for child in ast.iter_child_nodes(node)]
    while stack:
        current, looped = stack.pop()
        if isinstance(current, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        if isinstance(current, ast.If) and not looped and current.orelse and not any(
                isinstance(n, ast.Name) and n.id in params for n in ast.walk(current.test)):
            arms = [(a[0].lineno, a[-1].end_lineno or a[-1].lineno) for a in (current.body, current.orelse)]
            for mine, other in (arms, arms[::-1]):
                if any(other[0] <= line <= other[1] for line in handoffs):
                    found.append(mine)
        inside = looped or isinstance(current, ast.For | ast.AsyncFor | ast.While)
        stack.extend((child, inside) for child in ast.iter_child_nodes(current))
    return tuple(found)


def _startup(node: ast.AsyncFunctionDef, own: list[ast.AST], serves: int | None) -> tuple[int, int] | None:
    """The lines a start-up coroutine (checker/startup.py) runs before serving: a lifespan's up to its first
    `yield`, a start-up hook's whole body, and a coroutine's up to the statement on line `serves` that starts
    its server (above the outermost loop around it: a restart loop's top runs again after serving). `own`: the
    coroutine's own nodes."""
    decorators = []
    for decorator in node.decorator_list:
        first = decorator.args[0] if isinstance(decorator, ast.Call) and decorator.args else None
        text = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None
        decorators.append((_decorator_name(decorator), text))
    kind = startup_kind(node.name, decorators)
    end = node.end_lineno or node.lineno
    if kind == STARTUP:
        return node.lineno, end
    if kind != LIFESPAN:
        if serves is None:
            return None
        loops = [n.lineno for n in own if isinstance(n, ast.For | ast.AsyncFor | ast.While)
                 and n.lineno <= serves <= (n.end_lineno or n.lineno)]
        last = min([serves, *loops]) - 1
        return (node.lineno, last) if last > node.lineno else None
    yields = [n.lineno for n in own if isinstance(n, ast.Yield | ast.YieldFrom)]
    return (node.lineno, min(yields) - 1) if yields else None


def _decorator_name(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    return dotted(node) or "?"


def _app_object(base: ast.AST, ref: str | None) -> bool:
    """`base` (what `.state` is read from) is an app of a web framework: typed so, or named `app` (a lifespan's
    untyped `app` parameter, `request.app`)."""
    if ref is not None and ref.startswith(WEB_APPS):
        return True
    return (dotted(base) or "").rpartition(".")[2] == "app"


def _stepped_name(body: ast.AST) -> str | None:
    """The one name `body` calls `next` on or loops over (`for chunk in gen`), else None."""
    names = set()
    for node in ast.walk(body):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "next" and node.args:
            first = node.args[0]
        elif isinstance(node, ast.For):
            first = node.iter
        else:
            continue
        if isinstance(first, ast.Name):
            names.add(first.id)
    return names.pop() if len(names) == 1 else None


def _text(node: ast.AST | None) -> str | None:
    """The value of a constant string."""
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _positional(call: ast.Call, index: int) -> ast.AST | None:
    args = []
    for arg in call.args:
        if isinstance(arg, ast.Starred):
            break
        args.append(arg)
    return args[index] if index < len(args) else None


def _workers(call: ast.Call) -> int | None:
    """The constant worker count a `ThreadPoolExecutor(...)` call names, else None."""
    value = next((k.value for k in call.keywords if k.arg == "max_workers"), None) or _positional(call, 0)
    return value.value if isinstance(value, ast.Constant) and isinstance(value.value, int) else None


def _annotation(node: ast.AST) -> ast.AST | None:
    """The class an annotation names: `Engine`, `Engine | None`, `Optional[Engine]`, `"Engine"`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [s for s in (node.left, node.right) if not _is_none(s)]
        return _annotation(sides[0]) if len(sides) == 1 else None
    if isinstance(node, ast.Subscript) and (dotted(node.value) or "").rsplit(".", 1)[-1] == "Optional":
        return _annotation(node.slice)
    if isinstance(node, ast.Name | ast.Attribute):
        return node
    return None


def _is_none(value: Any) -> bool:
    return isinstance(value, ast.Constant) and value.value is None
