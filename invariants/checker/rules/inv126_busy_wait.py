from __future__ import annotations

import ast
from typing import TYPE_CHECKING

import libcst as cst

from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.walker import OWN_BODY_STOP, descendants

if TYPE_CHECKING:
    from collections.abc import Sequence

    from mlx_invariants.checker.walker import FileContext

# Calls that only read: a path made of these and plain reads goes round again at once.
_QUIET_BUILTINS = frozenset({"len", "bool", "isinstance", "getattr", "hasattr", "int", "float", "str", "min", "max",
                             "abs", "any", "all"})
_QUIET_CLOCKS = frozenset({"time.time", "time.monotonic", "time.perf_counter", "time.time_ns", "time.monotonic_ns"})
# Non-blocking probes of state another thread sets (`event.is_set()`, `future.done()`, `queue.empty()`).
_PROBES = frozenset({"is_set", "done", "empty", "full", "qsize", "locked", "is_alive", "cancelled"})


# What the CPython tree of a file must hold for visit_While to report anything: a `while` whose test only reads
# and whose body opens with a statement a quiet way round can start with. The same tests as _Path's, on
# the first statement only and wider where the tree knows less (any call of an attribute named like a clock
# counts as a clock read: no imports are resolved), so a loop it rules out is never one visit_While reports.
_CLOCK_NAMES = frozenset(clock.rsplit(".", 1)[1] for clock in _QUIET_CLOCKS)
_LOUD = (ast.Await, ast.Yield, ast.YieldFrom, ast.Lambda)


def _may_spin(tree: ast.Module) -> bool:
    return any(type(node) is ast.While and _reads(node.test) and _quiet_start(node.body[0]) for node in ast.walk(tree))


def _quiet_start(statement: ast.stmt) -> bool:
    if isinstance(statement, ast.Pass | ast.Continue):
        return True
    if isinstance(statement, ast.If):
        return _reads(statement.test)
    if isinstance(statement, ast.Expr | ast.Assign | ast.AnnAssign):
        return statement.value is not None and _reads(statement.value)
    return False


def _reads(expr: ast.expr) -> bool:
    for node in ast.walk(expr):
        if isinstance(node, _LOUD):
            return False
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                quiet = func.id in _QUIET_BUILTINS
            elif isinstance(func, ast.Attribute):
                quiet = (func.attr in _PROBES and not node.args and not node.keywords) or func.attr in _CLOCK_NAMES
            else:
                quiet = False
            if not quiet:
                return False
    return True


class BusyWait(Rule):
    """A `while` loop that waits for another thread, or for the event loop, to
    change some state by reading it over and over, with nothing on the way round
    that sleeps, blocks or awaits, is a busy-wait. On a thread it burns a core and
    takes the GIL from the very thread (or loop) that must run to write what it
    waits for, so the wait itself slows the wait down: every request streamed this
    way costs a spinning thread, and each one starves the loop that feeds them. In
    an `async def` it is worse: nothing else runs on the loop until it stops, so a
    writer on the loop never runs and the loop hangs. parallax's streaming
    generator polled `processing_requests[rid].text` with `continue` until the
    loop's `_handle_loop` appended to it (http_server.py@800f70c:177, one thread
    of Starlette's pool spinning per stream), fixed in 59ffd7b by awaiting a
    per-request `asyncio.Queue` the loop fills.

    Judged: a path from the top of the loop's body back to its test (through
    `continue`, or off the end of the body) on which every statement is a plain
    read: `pass`, an assignment of a read to a local name (`x = self.state[k]`),
    an `if` whose test reads, with no call but `len()`-like builtins, clock reads
    and non-blocking probes (`is_set()`, `done()`, `empty()`, `qsize()`). The
    loop must poll state something else writes: an attribute this file assigns
    outside the loop (`request.done = True` in the writer), or a probe's
    receiver."""

    id = "INV126"
    catches = "a `while` loop that polls state another thread or the loop writes, with no sleep, wait or await on the way round"
    message = (
        "this loop goes round again at once while {state} has not changed: nothing on that path sleeps, waits or "
        "awaits, so {cost}; wait on what the writer signals (a queue, an Event or Condition, an awaited future) "
        "instead of polling"
    )
    known_problems = (
        "Only `while` loops, and only a path of plain reads: a path that calls anything but `len()`-like builtins, "
        "clock reads and non-blocking probes is taken to wait or work, so a poll through a project's own getter "
        "(`while not self.is_ready(): pass`) or a non-blocking `get_nowait()` in a `try` is missed. The polled state "
        "must be an attribute assigned in the same file outside the loop, or a probe's receiver: state written "
        "from another file is not known to be shared, and a loop reading only local names is left alone (it never "
        "sees a change). mlx-lm's generation thread spun through `requests.get_nowait()` while its batch "
        "generator sat idle (server.py@68f18ba:543, fixed in 1e0c0f39 by a timed `get`): a real busy-wait of this "
        "class, missed, since the non-blocking get is a call and the spin depends on the batch's state. A "
        "deliberate spin of a few microseconds (a lock-free hand-off measured to beat a wait) is "
        "reported too; suppress it there."
    )
    triggers = (("while",),)
    # `while` is in a third of the files of real servers, most loops there call something on the way round:
    # CPython's tree says which files hold none that visit_While could report (see _may_spin).
    possible = staticmethod(_may_spin)

    INVALID = [
        Invalid('''
            class Handler:
                def __init__(self):
                    self.requests = {}

                async def on_output(self, rid, text, eos):
                    request = self.requests[rid]
                    request.text += text
                    request.finished = eos

                def stream(self, rid):
                    sent = 0
                    while True:  # expect: INV126
                        request = self.requests[rid]
                        if request.finished:
                            break
                        if len(request.text) == sent:
                            continue
                        yield request.text[sent:]
                        sent = len(request.text)
        '''),
        Invalid('''
            import threading

            class Engine:
                def __init__(self):
                    self._ready = threading.Event()
                    threading.Thread(target=self._load, daemon=True).start()

                def _load(self):
                    self._ready.set()

                async def wait_ready(self):
                    while not self._ready.is_set():  # expect: INV126
                        pass
        '''),
    ]
    VALID = [
        Valid('''
            import asyncio

            class Handler:
                def __init__(self):
                    self.queues = {}

                async def on_output(self, rid, text, eos):
                    await self.queues[rid].put(None if eos else text)

                async def stream(self, rid):
                    while True:
                        text = await self.queues[rid].get()
                        if text is None:
                            break
                        yield text
        '''),
        Valid('''
            import time

            class Handler:
                def __init__(self):
                    self.finished = False

                def finish(self):
                    self.finished = True

                def wait(self):
                    while not self.finished:
                        time.sleep(0.01)
        '''),
        Valid('''
            def skip_blanks(tokens):
                i = 0
                while i < len(tokens):
                    if tokens[i].kind == "blank":
                        i += 1
                        continue
                    return tokens[i]
        '''),
    ]

    def visit_While(self, node: cst.While) -> None:
        path = _Path(self.ctx)
        if not path.quiet_expr(node.test):
            return
        spin, through, _ = path.walk(node.body.body)
        if not (spin or through):
            return
        shared = self._written_elsewhere(node)
        polled = sorted(path.probes | (path.attributes & shared))
        if not polled:
            return
        state = ", ".join(f"`{name}`" for name in polled[:3])
        cost = ("nothing else runs on the event loop meanwhile, a writer on the loop included" if self.ctx.in_async
                else "this thread burns a core and holds the GIL against the thread or loop that writes it")
        self.report(node, state=state, cost=cost)

    def _written_elsewhere(self, loop: cst.While) -> set[str]:
        """Attribute names this file assigns (`x.attr = ...`, `x.attr += ...`, `x.attr[k] = ...`) outside `loop`."""
        inside = {id(n) for n in descendants(loop)}
        return {attr for store, attr in self._attribute_stores() if id(store) not in inside}

    def _attribute_stores(self) -> list[tuple[cst.CSTNode, str]]:
        """Every assignment of the file to an attribute, with the attribute's name; computed once per file."""
        found = self.ctx.facts.memo.get("attribute-stores")
        if found is None:
            found = []
            for node in descendants(self.ctx.module):
                if isinstance(node, cst.Assign):
                    targets = [t.target for t in node.targets]
                elif isinstance(node, cst.AugAssign | cst.AnnAssign):
                    targets = [node.target]
                else:
                    continue
                for target in targets:
                    while isinstance(target, cst.Subscript):
                        target = target.value
                    if isinstance(target, cst.Attribute):
                        found.append((node, target.attr.value))
            self.ctx.facts.memo["attribute-stores"] = found
        return found


class _Path:
    """Walks a loop body for a way round made only of reads, collecting what those reads look at."""

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self.attributes: set[str] = set()
        self.probes: set[str] = set()

    def walk(self, statements: Sequence[cst.BaseStatement]) -> tuple[bool, bool, bool]:
        """(a quiet path reaches `continue`, a quiet path falls off the end, something on the way does more
        than read). An `if` is passed over only when neither branch does more than read: a skipped branch that
        works may be the very branch the loop takes whenever the other one is skipped."""
        spin = False
        for statement in statements:
            if isinstance(statement, cst.If):
                if not self.quiet_expr(statement.test):
                    return spin, False, True
                body_spin, body_through, body_busy = self.walk(statement.body.body)
                else_spin, else_through, else_busy = self._orelse(statement.orelse)
                spin = spin or body_spin or else_spin
                if body_busy or else_busy or not (body_through or else_through):
                    return spin, False, body_busy or else_busy
            elif isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    if isinstance(small, cst.Continue):
                        return True, False, False
                    if isinstance(small, cst.Break | cst.Return | cst.Raise):
                        return spin, False, False
                    if not self._quiet_small(small):
                        return spin, False, True
            else:
                return spin, False, True
        return spin, True, False

    def _orelse(self, orelse: cst.If | cst.Else | None) -> tuple[bool, bool, bool]:
        if orelse is None:
            return False, True, False
        if isinstance(orelse, cst.If):
            return self.walk([orelse])
        return self.walk(orelse.body.body)

    def _quiet_small(self, small: cst.BaseSmallStatement) -> bool:
        if isinstance(small, cst.Pass):
            return True
        if isinstance(small, cst.Expr):
            return self.quiet_expr(small.value)
        if isinstance(small, cst.Assign | cst.AnnAssign) and small.value is not None:
            targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
            names: set[str] = set()
            for target in targets:
                bound = _local_names(target)
                if bound is None:  # a store into an attribute or a subscript: the loop writes, not only reads
                    return False
                names.update(bound)
            read = {n.value for n in descendants(small.value) if isinstance(n, cst.Name)}
            if isinstance(small.value, cst.Name):
                read.add(small.value.value)
            # `node = node.next` moves on each time round: a traversal, not a poll.
            return not (read & names) and self.quiet_expr(small.value)
        return False

    def quiet_expr(self, expr: cst.BaseExpression) -> bool:
        """`expr` only reads (no await, yield, or call but a quiet one); notes the attributes and probes it reads."""
        for node in [expr, *descendants(expr, OWN_BODY_STOP)]:
            if isinstance(node, cst.Await | cst.Yield | cst.Lambda):
                return False
            if isinstance(node, cst.Attribute):
                self.attributes.add(node.attr.value)
            if isinstance(node, cst.Call) and not self._quiet_call(node):
                return False
        return True

    def _quiet_call(self, call: cst.Call) -> bool:
        func = call.func
        if isinstance(func, cst.Name):
            return func.value in _QUIET_BUILTINS
        if isinstance(func, cst.Attribute):
            if func.attr.value in _PROBES and not call.args:
                self.probes.add(f"{_text(func.value)}.{func.attr.value}()")
                return True
            return self.ctx.resolve(func) in _QUIET_CLOCKS
        return False


def _local_names(target: cst.BaseExpression) -> list[str] | None:
    """The names a target binds (`x`, `a, b`), or None when it stores elsewhere (an attribute, a subscript)."""
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, cst.Tuple | cst.List):
        names: list[str] = []
        for element in target.elements:
            inner = _local_names(element.value)
            if inner is None:
                return None
            names.extend(inner)
        return names
    return None


def _text(expr: cst.BaseExpression) -> str:
    return cst.Module([]).code_for_node(expr)
