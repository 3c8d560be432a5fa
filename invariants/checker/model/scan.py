"""One pass over a def's own body (`Scanner`), for the summary (`collect.py`).

Nested defs, lambdas and classes are defs of their own, registered with the resolver when
met; the rest of the body is walked once, in source order, keeping what a def binds, assigns
to `self.x`, calls, iterates, returns and awaits, and which of its lines run under a lock.
Nothing is resolved here: names are looked up once every def of the file is known.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from mlx_invariants.checker.iteration import CONSUMERS as _CONSUMERS
from mlx_invariants.checker.iteration import LAZY as _LAZY
from mlx_invariants.checker.model.blocking import CLIENT_CLASSES
from mlx_invariants.checker.model.summary import ITERATED, PLAIN, RETURNED

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
UNKNOWN = "?"  # a binding whose value cannot be named: the name is unknown
_STATEMENTS = frozenset(c for c in vars(ast).values() if isinstance(c, type) and issubclass(c, ast.stmt))
# Nodes the scan handles itself; the rest only lead to their children.
_SPECIAL: dict[type, str] = {
    **{c: "scope" for c in SCOPES},
    **{c: "visit" for c in (ast.Call, ast.For, ast.comprehension, ast.YieldFrom, ast.Yield, ast.Return, ast.Await,
                            ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr, ast.withitem, ast.ExceptHandler,
                            ast.With, ast.AsyncWith,
                            ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal)},
}
# Nodes with nothing below them that a summary needs (names are read where they are used).
_LEAVES = frozenset({ast.Name, ast.Constant, ast.Load, ast.Store, ast.Del, ast.Pass, ast.Break, ast.Continue,
                     str, int, float, complex, bytes, bool, type(None), type(...)})
_SKIPPED_FIELDS = frozenset({"ctx", "op", "ops", "annotation", "returns", "type_comment", "type_params",
                             "decorator_list", "kind"})
_FIELDS: dict[type, tuple[str, ...]] = {}
# Fields that hold only markers of how a node works (expression contexts, operators): leaves, never a name,
# a call or a statement, that no walk of the summary looks for (`child_nodes`).
_MARKER_FIELDS = frozenset({"ctx", "op", "ops"})
_NODE_FIELDS: dict[type, tuple[str, ...]] = {}


def _children(kind: type) -> tuple[str, ...]:
    names = _FIELDS.get(kind)
    if names is None:
        names = _FIELDS[kind] = tuple(f for f in kind._fields if f not in _SKIPPED_FIELDS)  # type: ignore[attr-defined]
    return names  # a binding whose value cannot be named: the name is unknown


@dataclass
class Def:
    """What one def (or lambda, or class body) holds before its names are resolved."""

    node: ast.AST
    name: str                     # local qualified name: `Engine.run`, `f.<locals>.g`
    parent: Def | None           # the def around it (its closure), None at module level
    cls: str | None = None        # for a method: its class's local name
    params: list[str] = field(default_factory=list)
    bindings: dict[str, list[Any]] = field(default_factory=dict)  # name -> values (ast nodes or refs)
    self_attrs: list[tuple[str, ast.AST]] = field(default_factory=list)
    calls: list[tuple[ast.Call, str, ast.AST | None, ast.stmt | None]] = field(default_factory=list)
    name_iterations: list[tuple[str, ast.AST, ast.stmt | None]] = field(default_factory=list)
    assigned_calls: dict[int, str] = field(default_factory=dict)  # id(call) -> the local it is assigned to
    generator: bool = False
    opaque: bool = False
    locked: list[tuple[int, int, str]] = field(default_factory=list)  # lines of `with <lock>:` blocks, the lock
    entered: list[tuple[tuple[int, int], ast.AST]] = field(default_factory=list)  # `with f(...):` blocks, by f
    nonlocal_names: set[str] = field(default_factory=set)
    # `app.state.engine = Engine()`: (attr, the object before `.state`, value), for Starlette's app state
    state_attrs: list[tuple[str, ast.AST, ast.AST]] = field(default_factory=list)


class Scanner:
    """One pass over a def's own body, in source order. `resolver` registers the defs met
    (`nested`, `local_ref`), notes imports (`note_import`) and knows the lock names (`lock_names`)."""

    def __init__(self, resolver: Any) -> None:
        self.resolver = resolver

    def scan(self, fn: Def, body: list[ast.AST]) -> None:
        # (node, use, iteration site, statement): use is PLAIN, ITERATED, RETURNED or "await".
        stack: list[tuple[ast.AST, str, ast.AST | None, ast.stmt | None]] = [
            (node, PLAIN, None, None) for node in reversed(body)
        ]
        pop, push = stack.pop, stack.append
        while stack:
            node, use, site, stmt = pop()
            kind = type(node)
            if kind in _STATEMENTS:
                stmt = node  # type: ignore[assignment]
            special = _SPECIAL.get(kind)
            if special is None:  # most nodes: only their children matter
                children = []
                for name in _children(kind):
                    value = getattr(node, name)
                    if type(value) is list:
                        children.extend(v for v in value if type(v) not in _LEAVES)
                    elif value is not None and type(value) not in _LEAVES:
                        children.append(value)
                for child in reversed(children):
                    push((child, PLAIN, None, stmt))
                continue
            if special == "scope":
                self.resolver.nested(node, fn)
                if kind is not ast.Lambda:
                    fn.bindings.setdefault(node.name, []).append(self.resolver.local_ref(node, fn))  # type: ignore[attr-defined]
                continue
            for child in reversed(self._visit(fn, node, use, site, stmt)):
                push(child)

    def _visit(self, fn: Def, node: ast.AST, use: str, site: ast.AST | None, stmt: ast.stmt | None) -> list:
        out: list[tuple[ast.AST, str, ast.AST | None, ast.stmt | None]] = []
        plain = lambda child: out.append((child, PLAIN, None, stmt))  # noqa: E731
        if isinstance(node, ast.Call):
            fn.calls.append((node, use, site, stmt))
            plain(node.func)
            name = node.func.id if isinstance(node.func, ast.Name) else None
            iterates = name in _CONSUMERS or (name in _LAZY and use == ITERATED)
            for arg in node.args:
                value = arg.value if isinstance(arg, ast.Starred) else arg
                if iterates:
                    self._iterated(fn, value, site if name in _LAZY else node, stmt, out)
                elif type(value) not in _LEAVES:
                    plain(value)
            for keyword in node.keywords:
                if type(keyword.value) not in _LEAVES:
                    plain(keyword.value)
            return out
        if isinstance(node, ast.For):
            self.bind_target(fn, node.target)
            self._iterated(fn, node.iter, node, stmt, out)
            out.extend((child, PLAIN, None, stmt) for child in (*node.body, *node.orelse))
            return out
        if isinstance(node, ast.comprehension):
            self.bind_target(fn, node.target)
            self._iterated(fn, node.iter, node.iter, stmt, out)
            out.extend((child, PLAIN, None, stmt) for child in node.ifs)
            return out
        if isinstance(node, ast.YieldFrom):
            fn.generator = True
            self._iterated(fn, node.value, node, stmt, out)
            return out
        if isinstance(node, ast.Yield):
            fn.generator = True
        elif isinstance(node, ast.Return):
            if node.value is not None:
                out.append((node.value, RETURNED, None, stmt))
            return out
        elif isinstance(node, ast.Await):
            out.append((node.value, "await", None, stmt))
            return out
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                self.assign(fn, target, node.value)
            plain(node.value)
            return out
        elif isinstance(node, ast.AnnAssign):
            self.assign(fn, node.target, node.value, node.annotation)
            if node.value is not None:
                plain(node.value)
            return out
        elif isinstance(node, ast.AugAssign | ast.NamedExpr):
            self.bind_target(fn, node.target)
            plain(node.value)
            return out
        elif isinstance(node, ast.With | ast.AsyncWith):
            locks = self.resolver.lock_names
            span = (node.lineno, node.end_lineno or node.lineno)
            for item in node.items:
                expr = item.context_expr
                text = dotted(expr.func if isinstance(expr, ast.Call) else expr)
                if locks(text):
                    fn.locked.append((*span, text))  # type: ignore[arg-type]
                elif isinstance(expr, ast.Call):
                    fn.entered.append((span, expr.func))
        elif isinstance(node, ast.withitem):
            if _enters_itself(node):
                self.assign(fn, node.optional_vars, node.context_expr)  # type: ignore[arg-type]
            elif node.optional_vars is not None:
                self.bind_target(fn, node.optional_vars)
            plain(node.context_expr)
            return out
        elif isinstance(node, ast.ExceptHandler):
            if node.name:
                fn.bindings.setdefault(node.name, []).append(UNKNOWN)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for local, ref in imported(node):
                fn.bindings.setdefault(local, []).append(ref)
                self.resolver.note_import(ref)
            return out
        elif isinstance(node, ast.Global | ast.Nonlocal):
            fn.nonlocal_names.update(node.names)
            return out
        for name in _children(type(node)):
            value = getattr(node, name)
            for child in value if type(value) is list else (value,):
                if child is not None and type(child) not in _LEAVES:
                    out.append((child, PLAIN, None, stmt))
        return out

    def _iterated(self, fn: Def, value: ast.AST, site: ast.AST | None, stmt: ast.stmt | None, out: list) -> None:
        if isinstance(value, ast.Name):
            fn.name_iterations.append((value.id, site or value, stmt))
        out.append((value, ITERATED, site, stmt))

    def assign(self, fn: Def, target: ast.AST, value: ast.AST | None, annotation: ast.AST | None = None) -> None:
        typed = ("annotation", annotation) if annotation is not None else None
        if isinstance(target, ast.Name):
            if typed is not None:
                fn.bindings.setdefault(target.id, []).append(typed)
            elif value is not None:
                fn.bindings.setdefault(target.id, []).append(value)
                if isinstance(value, ast.Call):
                    fn.assigned_calls[id(value)] = target.id
        elif (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute)
              and target.value.attr == "state" and value is not None):
            fn.state_attrs.append((target.attr, target.value.value, value))
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            if typed is not None:
                fn.self_attrs.append((target.attr, typed))  # type: ignore[arg-type]
            elif value is not None:
                fn.self_attrs.append((target.attr, value))
        else:
            self.bind_target(fn, target)

    def bind_target(self, fn: Def, target: ast.AST) -> None:
        """Names bound to values the summary does not follow (loop variables, unpacking). A
        subscript or an attribute other than `self.x` binds nothing: it changes an object."""
        stack = [target]
        while stack:
            node = stack.pop()
            if type(node) is ast.Name:
                fn.bindings.setdefault(node.id, []).append(UNKNOWN)
            elif isinstance(node, ast.Tuple | ast.List):
                stack.extend(node.elts)
            elif isinstance(node, ast.Starred):
                stack.append(node.value)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                fn.self_attrs.append((node.attr, UNKNOWN))  # type: ignore[arg-type]


def _enters_itself(item: ast.withitem) -> bool:
    """`with httpx.Client() as client:`: the name is bound to the client the call made (its `__enter__` returns
    it), so that the client's calls are typed as a local's would be."""
    expr = item.context_expr
    return (isinstance(item.optional_vars, ast.Name) and isinstance(expr, ast.Call)
            and (dotted(expr.func) or "").rpartition(".")[2] in CLIENT_CLASSES)


def imported(node: ast.Import | ast.ImportFrom) -> list[tuple[str, str]]:
    """(local name, reference) for each name an import binds."""
    if isinstance(node, ast.Import):
        return [(a.asname, a.name) if a.asname else (a.name.split(".", 1)[0], a.name.split(".", 1)[0])
                for a in node.names]
    base = "." * node.level + (node.module or "")
    found = []
    for alias in node.names:
        if alias.name == "*":
            continue
        full = f"{base}.{alias.name}" if base and not base.endswith(".") else base + alias.name
        found.append((alias.asname or alias.name, full))
    return found


def child_name(parent: Def | None, node: ast.AST) -> str:
    """`f.<locals>.g` for a def in a def, `Engine.Inner` for a class in a class, `<lambda:3:8>`."""
    own = f"<lambda:{node.lineno}:{node.col_offset}>" if isinstance(node, ast.Lambda) else node.name  # type: ignore[attr-defined]
    if parent is None:
        return own
    if isinstance(parent.node, ast.ClassDef):
        return f"{parent.name}.{own}"
    return f"{parent.name}.<locals>.{own}"


def dotted(expr: ast.AST | None) -> str | None:
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    parts.append(expr.id)
    return ".".join(reversed(parts))


def own_nodes(node: ast.AST) -> list[ast.AST]:
    """The nodes of a def's body, not those of the defs, lambdas and classes inside it, nor markers
    (`child_nodes`), in the order a depth-first walk meets them. A list, made once per def: the summary
    reads it up to four times (collect.py, `_Resolver._function`)."""
    found = []
    stack = child_nodes(node)
    while stack:
        current = stack.pop()
        found.append(current)
        if not isinstance(current, SCOPES):
            stack.extend(child_nodes(current))
    return found


def child_nodes(node: ast.AST) -> list[ast.AST]:
    """The child nodes of `node` in `ast.iter_child_nodes`'s order, less the markers of `_MARKER_FIELDS`.
    The summary walks every node of a file (`raises.bound_anywhere`, each def's `own_nodes`): made field by
    field into a list, this costs about half of that function's two nested generators, and the markers left
    out are a third of the nodes (4 900 of 14 100 in vllm-mlx's engine/simple.py)."""
    kind = type(node)
    names = _NODE_FIELDS.get(kind)
    if names is None:
        names = _NODE_FIELDS[kind] = tuple(f for f in kind._fields if f not in _MARKER_FIELDS)
    found = []
    for name in names:
        value = getattr(node, name, None)
        if isinstance(value, ast.AST):
            found.append(value)
        elif type(value) is list:
            found.extend([item for item in value if isinstance(item, ast.AST)])
    return found
