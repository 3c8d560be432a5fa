"""One walk per file: every enabled rule sees each node once, in source order.

libcst's own visitor rebuilds every node on the way back up; this walk only
reads fields, skipping whitespace and punctuation, which makes it an order of
magnitude cheaper than parsing. It is iterative, so deep nesting cannot
overflow Python's stack here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import libcst as cst

from mlx_invariants.checker import mlx_api, mlx_facts
from mlx_invariants.checker.facts import CallSite, Facts, FunctionFacts, number
from mlx_invariants.checker.names import dotted, imported_names, resolve, terminal
from mlx_invariants.checker.nodes import IS_NODE, Classes, child_fields
from mlx_invariants.checker.offload import HANDOFF_NAMES, handoff
from mlx_invariants.checker.rule import Rule
from mlx_invariants.checker.scopes import Kind, ScopeStack

COMPOUND = frozenset({
    cst.If, cst.Try, cst.TryStar, cst.FunctionDef, cst.ClassDef, cst.With, cst.For, cst.While, cst.Match,
    cst.ExceptHandler, cst.ExceptStarHandler, cst.Else, cst.Finally,
})
STATEMENTS = COMPOUND | {cst.SimpleStatementLine}
_STOPS: dict[tuple[type, ...], Classes] = {}


class RawFinding(NamedTuple):
    rule: str
    node: cst.CSTNode
    statement: cst.CSTNode | None
    message: str
    requires: tuple[str, ...] = ()  # the MLX facts (mlx_facts.py) under which the finding is not true
    # Findings of one rule with the same `group` are one defect: after suppressions, the first left
    # reports it and names the others by their `mention` (analysis.py), before its `remedy`.
    group: object = None
    mention: str = ""
    remedy: str = ""  # a grouped finding's remedy, kept apart from `message` (what is wrong) until merged


class FileContext:
    """What a rule can ask about the code at the current node, and where it reports."""

    def __init__(self, module: cst.Module, shared: dict[str, Any], holds: frozenset[str] = frozenset()) -> None:
        self.module = module
        self.shared = shared
        # The generation keywords that raise on every mlx-lm the file's project admits (mlx_facts.ANALYSIS_FACTS).
        self.rejected = mlx_facts.rejected_keywords(holds)
        self.scope = ScopeStack(module)
        self.facts = Facts()
        self.raw: list[RawFinding] = []
        self.statements: list[cst.CSTNode] = []
        self._executor_roots: set[int] = set()
        module_facts = self.facts.module_calls = FunctionFacts(module, None)
        self._function_stack: list[FunctionFacts] = [module_facts]
        self._keys: dict[int, str | None] = {}
        self._quals: dict[int, str | None] = {}
        self._prescan_imports(module.body)

    # --- questions rules ask -------------------------------------------------------
    def resolve(self, expr: cst.BaseExpression) -> str | None:
        """Qualified name of `expr` through the imports in scope here (remembered per node)."""
        found = self._quals.get(id(expr), self)
        if found is self:
            found = self._quals[id(expr)] = resolve(expr, self.scope.tables)
        return found  # type: ignore[return-value]

    def call_qual(self, call: cst.Call) -> str | None:
        """The qualified name of what `call` calls, as the rules judge it: None for a call of mlx-lm's
        generation that raises before it runs (`mlx_api.rejected_generation`), which is no MLX work."""
        qual = self.resolve(call.func)
        keywords = (arg.keyword.value for arg in call.args if arg.keyword is not None)
        return None if mlx_api.rejected_generation(qual, keywords, self.rejected) else qual

    def key(self, expr: cst.BaseExpression | None) -> str | None:
        """Identity of a name or attribute: `Engine._lock` for `self._lock` in class Engine.

        Remembered per node, so a rule deciding in `end()` gets the answer from
        where the node was, provided it asked once during the walk (see `pin`).
        """
        if expr is None:
            return None
        found = self._keys.get(id(expr), self)
        if found is self:
            text = dotted(expr)
            if text is not None and text.split(".", 1)[0] in ("self", "cls") and "." in text:
                owner = self.scope.method_class()
                if owner:
                    text = owner + text[text.index(".") :]
            found = self._keys[id(expr)] = text
        return found  # type: ignore[return-value]

    def pin(self, *exprs: cst.BaseExpression | None) -> None:
        """Remember keys and qualified names of `exprs` (and their callees) for `end()`."""
        for expr in exprs:
            if expr is None:
                continue
            if isinstance(expr, cst.Call):
                self.pin(expr.func, *(a.value for a in expr.args))
            elif isinstance(expr, cst.Attribute):
                self.key(expr)
                self.resolve(expr)
                self.pin(expr.value)
            elif isinstance(expr, cst.Name):
                self.key(expr)
                self.resolve(expr)

    @property
    def in_async(self) -> bool:
        return self.scope.in_async

    def report(self, rule_id: str, node: cst.CSTNode, message: str) -> None:
        statement = self.statements[-1] if self.statements else None
        self.raw.append(RawFinding(rule_id, node, statement, message))

    def report_at(self, rule_id: str, node: cst.CSTNode, statement: cst.CSTNode | None, message: str,
                  requires: tuple[str, ...] = (), group: object = None, mention: str = "",
                  remedy: str = "") -> None:
        """Report from `end()`, with the statement captured during the walk. A finding true only on some
        MLX versions names the facts of mlx_facts.py under which it is not (`requires`); findings of one
        defect share a `group`, and are reported once, naming the others by `mention` after what is wrong
        (`message`) and before the `remedy`."""
        self.raw.append(RawFinding(rule_id, node, statement, message, requires, group, mention, remedy))

    @property
    def statement(self) -> cst.CSTNode | None:
        return self.statements[-1] if self.statements else None

    def function_facts(self, node: cst.CSTNode) -> FunctionFacts | None:
        return self.facts.functions.get(id(node))

    # --- bookkeeping during the walk -------------------------------------------
    def _prescan_imports(self, body: Any) -> None:
        """Module-level imports count everywhere in the file, even in functions defined above them."""
        for stmt in body:
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, cst.Import | cst.ImportFrom):
                        self._add_import(small)
            elif isinstance(stmt, cst.If | cst.Try | cst.With | cst.Else | cst.ExceptHandler | cst.Finally):
                inner = stmt.body
                self._prescan_imports(getattr(inner, "body", ()))
                for extra in ("orelse", "finalbody"):
                    part = getattr(stmt, extra, None)
                    if part is not None and not isinstance(part, cst.If):
                        self._prescan_imports(getattr(part.body, "body", ()))
                for handler in getattr(stmt, "handlers", ()):
                    self._prescan_imports(getattr(handler.body, "body", ()))

    def _add_import(self, node: cst.Import | cst.ImportFrom) -> None:
        self.scope.add_import(node)
        for _, full in imported_names(node):
            mlx_api.note_import(full, self)

    def enter(self, node: cst.CSTNode, kind: type) -> None:
        if kind in STATEMENTS:
            self.statements.append(node)
        if kind is cst.Call:
            self._on_call(node)  # type: ignore[arg-type]
        elif kind is cst.Assign:
            for target in node.targets:  # type: ignore[attr-defined]
                self._on_assign(target.target, node.value)  # type: ignore[attr-defined]
        elif kind is cst.AnnAssign:
            if node.value is not None:  # type: ignore[attr-defined]
                self._on_assign(node.target, node.value)  # type: ignore[attr-defined]
        elif kind is cst.WithItem:
            if node.asname is not None:  # type: ignore[attr-defined]
                self._on_assign(node.asname.name, node.item)  # type: ignore[attr-defined]
        elif kind is cst.Import or kind is cst.ImportFrom:
            self._add_import(node)  # type: ignore[arg-type]

    def push_frame(self, node: cst.CSTNode, kind: type) -> bool:
        """Open the scope `node` starts, if it starts one; True when it did."""
        if kind is cst.FunctionDef:
            is_async = node.asynchronous is not None  # type: ignore[attr-defined]
            name = node.name.value  # type: ignore[attr-defined]
            self.scope.push(Kind.ASYNC if is_async else Kind.SYNC, node, name)
            owner = self.scope.top.class_name
            self._open_function(node, f"{owner}.{name}" if owner else name)
        elif kind is cst.Lambda:
            self.scope.push(Kind.LAMBDA, node, "<lambda>")
            self._open_function(node, None)
        elif kind is cst.ClassDef:
            self.scope.push(Kind.CLASS, node, node.name.value)  # type: ignore[attr-defined]
            return True
        elif kind is cst.GeneratorExp and id(node) in self._executor_roots:
            self.scope.push(Kind.EXECUTOR, node, "<genexpr>")
            self._open_function(node, None)
        else:
            return False
        return True

    def pop_frame(self, node: cst.CSTNode) -> None:
        if self.scope.top.kind is not Kind.CLASS:
            self._function_stack.pop()
        self.scope.pop()

    def leave(self, node: cst.CSTNode, kind: type) -> None:
        if kind in STATEMENTS:
            self.statements.pop()

    def _open_function(self, node: cst.CSTNode, key: str | None) -> None:
        facts = FunctionFacts(node, key)
        self.facts.add_function(facts)
        self._function_stack.append(facts)

    def _on_call(self, call: cst.Call) -> None:
        func = call.func
        self._function_stack[-1].calls.append(CallSite(call, self.call_qual(call), dotted(func), self.key(func)))
        # Receivers and next()'s argument are judged in end(): remember where they were.
        if isinstance(func, cst.Attribute):
            self.key(func.value)
        elif isinstance(func, cst.Name) and func.value == "next" and call.args:
            self.pin(call.args[0].value)
        if terminal(func) in HANDOFF_NAMES and handoff(call, self) is not None:
            for arg in call.args:
                if isinstance(arg.value, cst.GeneratorExp):
                    self._executor_roots.add(id(arg.value))

    def _on_assign(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        key = self.key(target)
        if key is None:
            return
        # `given or ThreadPoolExecutor(1)` and `a if c else b` may hold either value.
        for option in _alternatives(value):
            qual = self.call_qual(option) if isinstance(option, cst.Call) else None
            self.facts.assign(key, option, qual, id(self._function_stack[-1].node))
        if self.scope.top.kind is Kind.MODULE and isinstance(target, cst.Name):
            constant = number(value, self.facts.constants)
            if constant is not None:
                self.facts.constants[target.value] = constant


def _alternatives(value: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(value, cst.BooleanOperation):
        return [*_alternatives(value.left), *_alternatives(value.right)]
    if isinstance(value, cst.IfExp):
        return [*_alternatives(value.body), *_alternatives(value.orelse)]
    return [value]


_dispatch: dict[type[Rule], list[tuple[type, bool, str]]] = {}


def _handlers(rule: type[Rule]) -> list[tuple[type, bool, str]]:
    """(node class, is_leave, method name) for each visit_/leave_ method of a rule class."""
    found = _dispatch.get(rule)
    if found is None:
        found = []
        for attr in dir(rule):
            prefix, _, node_name = attr.partition("_")
            if prefix in ("visit", "leave") and node_name and hasattr(cst, node_name):
                found.append((getattr(cst, node_name), prefix == "leave", attr))
        _dispatch[rule] = found
    return found


def check_module(
    module: cst.Module, rules: list[tuple[type[Rule], dict[str, Any]]], shared: dict[str, Any],
    holds: frozenset[str] = frozenset(),
) -> list[RawFinding]:
    """Run every rule over `module` in one walk; return what they reported. `holds`: the facts of
    mlx_facts.ANALYSIS_FACTS true for the file's project."""
    global _kept
    _kept = {}
    try:
        ctx = FileContext(module, shared, holds)
        enter: dict[type, list[Any]] = {}
        leave: dict[type, list[Any]] = {}
        instances = []
        for rule_class, options in rules:
            rule = rule_class(ctx, options)
            instances.append(rule)
            for node_class, is_leave, attr in _handlers(rule_class):
                (leave if is_leave else enter).setdefault(node_class, []).append(getattr(rule, attr))
        _walk(module, ctx, enter, leave)
        for rule in instances:
            rule.end()
        return ctx.raw
    finally:
        _kept = None


# Node kinds the context keeps books on as the walk enters them (FileContext.enter), and those
# that may open a scope (FileContext.push_frame): every other node only leads to its children.
_BOOKKEPT = STATEMENTS | {cst.Call, cst.Assign, cst.AnnAssign, cst.WithItem, cst.Import, cst.ImportFrom}
_FRAMES = frozenset({cst.FunctionDef, cst.Lambda, cst.ClassDef, cst.GeneratorExp})


def _walk(module: cst.Module, ctx: FileContext, enter: dict[type, list[Any]], leave: dict[type, list[Any]]) -> None:
    """Enter every node in source order, and leave it after its children where anything happens
    on leaving (a rule's leave handler, a statement or scope closed): most nodes (names,
    attributes, constants) are only entered, and what each kind needs is looked up once, which
    took a fifth off the walk's own time (0.30 s to 0.24 s over vllm-mlx's 89 parsed files)."""
    is_node = IS_NODE
    # What each kind of node needs, worked out once per kind:
    # (kept: FileContext.enter, enter handlers, may open a scope, leaves something, child fields).
    plans: dict[type, tuple[bool, Any, bool, bool, tuple[str, ...]]] = {}
    # Entries are (node, None) to enter, or (node, frame_opened) to leave.
    stack: list[tuple[cst.CSTNode, bool | None]] = [(module, None)]
    pop, push = stack.pop, stack.append
    while stack:
        node, leaving = pop()
        kind = type(node)
        if leaving is not None:
            if leaving:
                ctx.pop_frame(node)
            for handler in leave.get(kind, ()):
                handler(node)
            ctx.leave(node, kind)
            continue
        plan = plans.get(kind)
        if plan is None:
            plan = plans[kind] = (kind in _BOOKKEPT, enter.get(kind, ()), kind in _FRAMES,
                                  kind in leave or kind in STATEMENTS, child_fields(kind))
        kept, handlers, frames, leaves, fields = plan
        if kept:
            ctx.enter(node, kind)
        for handler in handlers:
            handler(node)
        opened = frames and ctx.push_frame(node, kind)
        if opened or leaves:
            push((node, opened))
        children: list[cst.CSTNode] = []
        for name in fields:
            value = getattr(node, name)
            cls = type(value)
            if cls is tuple or cls is list:
                children.extend(v for v in value if is_node[type(v)])
            elif is_node[cls]:
                children.append(value)
        for child in reversed(children):
            push((child, None))


def located_nodes(raw: list[RawFinding]) -> Iterator[cst.CSTNode]:
    """The nodes whose positions place these findings: each node, its statement, and the
    statement's first body line (a compound statement's header ends above it)."""
    for finding in raw:
        yield finding.node
        statement = finding.statement
        if statement is not None:
            yield statement
            body = getattr(statement, "body", None)
            if isinstance(body, cst.IndentedBlock) and body.body:
                yield body.body[0]


def descendants(node: cst.CSTNode, stop: tuple[type, ...] = ()) -> list[cst.CSTNode]:
    """Every node below `node`, not entering nodes of the `stop` types (they are included). While
    `check_module` runs, kept until it returns: several rules ask for the same def's own body (INV129 every
    def's, INV132 each `async def`'s), and asked again they were 6% of the rules' time on vllm-mlx's
    engine/simple.py. Callers only read the list."""
    if _kept is None:
        return _descendants(node, stop)
    found = _kept.get((node, stop))
    if found is None:
        found = _kept[(node, stop)] = _descendants(node, stop)
    return found


# `descendants`' answers while `check_module` runs (None otherwise), by node and stop types.
_kept: dict[tuple[cst.CSTNode, tuple[type, ...]], list[cst.CSTNode]] | None = None


def _descendants(node: cst.CSTNode, stop: tuple[type, ...]) -> list[cst.CSTNode]:
    found: list[cst.CSTNode] = []
    stack = [node]
    is_node = IS_NODE
    stops = _STOPS.get(stop)
    if stops is None:
        stops = _STOPS[stop] = Classes(stop)
    while stack:
        current = stack.pop()
        for name in child_fields(type(current)):
            value = getattr(current, name)
            items = value if type(value) is tuple or type(value) is list else (value,)
            for child in items:
                cls = type(child)
                if is_node[cls]:
                    found.append(child)
                    if not stops[cls]:
                        stack.append(child)
    return found


# A function's own body: nested defs, lambdas and classes run elsewhere.
OWN_BODY_STOP = (cst.FunctionDef, cst.Lambda, cst.ClassDef)
