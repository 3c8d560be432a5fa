from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.offload import keyword, positional
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.walker import descendants

_THREADS = frozenset({"threading.Thread"})
_THREAD_NAMES = ["thread", "*_thread"]  # a receiver of `.join(timeout)` known by name as a thread


@dataclass
class _Join:
    call: cst.Call
    receiver: cst.BaseExpression
    keys: set[str]  # the thread's, and the collection's when it is a loop variable
    order: int
    statement: cst.CSTNode | None
    polled: bool  # inside `while <receiver>.is_alive():`


@dataclass
class _Function:
    joins: list[_Join] = field(default_factory=list)
    checks: dict[str, int] = field(default_factory=dict)  # receiver key -> order of its last is_alive() call
    polling: list[set[str]] = field(default_factory=list)  # keys whose is_alive() the enclosing while loops test
    members: dict[str, str] = field(default_factory=dict)  # loop variable -> the collection it runs over


class ThreadJoinUnchecked(Rule):
    """`thread.join(timeout)` returns None whether or not the thread stopped: only
    `thread.is_alive()` afterwards tells. A shutdown that joins with a timeout and
    carries on leaves a thread that did not stop running beside whatever comes
    next: a generation thread still stepping the model while the server tears the
    model down, a cache writer still spilling into an index already closed.
    vllm-mlx's SSD cache tier did exactly that in `close()`
    (ssd_cache.py@61fab4b:1230: join(timeout=5.0), then close the index), fixed in
    2cd2230 to check `is_alive()` and raise; smg's MLX servicer still stops its
    generation loop with `self._gen_thread.join(timeout=5.0)` and never looks
    again (servicer.py `stop_generation_loop`, the teardown of the corpus's S2e)."""

    id = "INV115"
    catches = "`thread.join(timeout)` with no `is_alive()` check after it in the same function"
    message = (
        "`{call}` may return with `{thread}` still running, and nothing here checks: test "
        "`{thread}.is_alive()` after it and report (or escalate) a thread that did not stop"
    )
    known_problems = (
        "A thread is known by `threading.Thread(...)` assigned to it in this file or by a name ending in "
        "`thread`; a Thread subclass joining itself (`self.join(5)`) and multiprocessing processes are not "
        "judged. Any `is_alive()` of the same thread later in the function counts, as does one in the test "
        "of an enclosing `while` loop; for a loop variable, an `is_alive()` of any member of the same "
        "collection (`[t for t in threads if t.is_alive()]`) counts."
    )
    triggers = ((".join(",), ("thread", "Thread"))

    INVALID = [
        Invalid('''
            import threading

            class MlxServicer:
                def start_generation_loop(self):
                    self._gen_thread = threading.Thread(target=self._generation_loop, daemon=True)
                    self._gen_thread.start()

                def stop_generation_loop(self):
                    self._shutdown_event.set()
                    if self._gen_thread and self._gen_thread.is_alive():
                        self._gen_thread.join(timeout=5.0)  # expect: INV115
                    logger.info("Generation loop stopped")
        '''),
        Invalid('''
            from threading import Thread

            def run_with_deadline(work, seconds):
                runner = Thread(target=work)
                runner.start()
                runner.join(seconds)  # expect: INV115
                return "done"
        '''),
        Invalid('''
            def close(self):
                self._stop.set()
                self._writer_thread.join(timeout=2.0)  # expect: INV115
        '''),
        Invalid('''
            import threading

            def check_threads(before, trace):
                new = [t for t in threading.enumerate() if t not in before]
                for thread in new:
                    thread.join(timeout=2.0)  # expect: INV115
                trace.record("threads-joined", len(new))
        '''),
    ]
    VALID = [
        Valid('''
            import threading

            class MlxServicer:
                def start_generation_loop(self):
                    self._gen_thread = threading.Thread(target=self._generation_loop, daemon=True)
                    self._gen_thread.start()

                def stop_generation_loop(self):
                    self._shutdown_event.set()
                    if self._gen_thread and self._gen_thread.is_alive():
                        self._gen_thread.join(timeout=5.0)
                        if self._gen_thread.is_alive():
                            logger.error("generation thread did not stop within 5 s")
                    logger.info("Generation loop stopped")
        '''),
        Valid('''
            from threading import Thread

            def run_with_deadline(work, seconds):
                runner = Thread(target=work)
                runner.start()
                runner.join(seconds)
                return "timed out" if runner.is_alive() else "done"
        '''),
        Valid('''
            def close(self):
                self._stop.set()
                while self._writer_thread.is_alive():
                    self._writer_thread.join(timeout=2.0)
                    logger.info("still waiting for the cache writer")
        '''),
        Valid('''
            import threading

            def check_threads(before, trace):
                new = [t for t in threading.enumerate() if t not in before]
                for thread in new:
                    thread.join(timeout=2.0)
                alive = [t.name for t in new if t.is_alive()]
                trace.record("threads-joined", len(new), alive)
        '''),
        Valid('''
            import os

            def paths(thread, parts, root):
                thread.join()
                return os.path.join(root, ", ".join(parts))
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.functions: dict[int, _Function] = {}
        self.order = 0

    def _here(self) -> _Function:
        return self.functions.setdefault(id(self.ctx.scope.top.node), _Function())

    def visit_For(self, node: cst.For) -> None:
        self._member(node.target, node.iter)

    def visit_ListComp(self, node: cst.ListComp) -> None:
        self._comprehension(node.for_in)

    def visit_SetComp(self, node: cst.SetComp) -> None:
        self._comprehension(node.for_in)

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> None:
        self._comprehension(node.for_in)

    def visit_DictComp(self, node: cst.DictComp) -> None:
        self._comprehension(node.for_in)

    def _comprehension(self, clause: cst.CompFor | None) -> None:
        while clause is not None:  # before the element is walked: `[t.is_alive() for t in threads]`
            self._member(clause.target, clause.iter)
            clause = clause.inner_for_in

    def _member(self, target: cst.BaseExpression, collection: cst.BaseExpression) -> None:
        """`for t in threads: t.join(2)` and `[t for t in threads if t.is_alive()]` are about `threads`."""
        key = self.ctx.key(collection)
        if isinstance(target, cst.Name) and key is not None:
            self._here().members[target.value] = key

    def visit_While(self, node: cst.While) -> None:
        self._here().polling.append(self._alive_checks(node.test))

    def leave_While(self, node: cst.While) -> None:
        self._here().polling.pop()

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute):
            return
        self.order += 1
        key = self.ctx.key(func.value)
        if key is None:
            return
        function = self._here()
        keys = {key, function.members.get(key, key)}
        if func.attr.value == "is_alive":
            for each in keys:
                function.checks[each] = self.order
        elif func.attr.value == "join" and _has_timeout(node):
            self.ctx.pin(func.value)
            polled = any(keys & tested for tested in function.polling)
            function.joins.append(_Join(node, func.value, keys, self.order, self.ctx.statement, polled))

    def end(self) -> None:
        for function in self.functions.values():
            for join in function.joins:
                checked = any(function.checks.get(k, 0) > join.order for k in join.keys)
                if join.polled or checked or not self._is_thread(join.receiver):
                    continue
                thread = dotted(join.receiver) or "the thread"
                message = self.message.format(call=f"{thread}.join(...)", thread=thread)
                self.ctx.report_at(self.id, join.call, join.statement, message)

    def _alive_checks(self, test: cst.BaseExpression) -> set[str]:
        keys = set()
        for node in [test, *descendants(test)]:
            func = node.func if isinstance(node, cst.Call) else None
            if isinstance(func, cst.Attribute) and func.attr.value == "is_alive":
                key = self.ctx.key(func.value)
                if key:
                    keys.add(key)
        return keys

    def _is_thread(self, receiver: cst.BaseExpression) -> bool:
        built = self.ctx.facts.constructed_by(self.ctx.key(receiver))
        if built:
            return bool(built & _THREADS)
        return matches_name(dotted(receiver), _THREAD_NAMES)


def _has_timeout(call: cst.Call) -> bool:
    timeout = keyword(call, "timeout") or positional(call, 0)
    return timeout is not None and not (isinstance(timeout, cst.Name) and timeout.value == "None")
