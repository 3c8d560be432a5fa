from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.offload import keyword, positional
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.scopes import FUNCTION_KINDS, Kind
from mlx_invariants.checker.walker import descendants

_THREADS = frozenset({"threading.Thread"})
_THREAD_NAMES = ["thread", "*_thread"]  # a receiver of `.join(timeout)` known by name as a thread
_TEST_FRAMEWORKS = frozenset({"pytest", "_pytest", "unittest"})


@dataclass
class _Join:
    call: cst.Call
    receiver: cst.BaseExpression
    keys: set[str]  # the thread's, and the collection's when it is a loop variable
    order: int
    statement: cst.CSTNode | None
    polled: bool  # inside `while <receiver>.is_alive():`
    in_test: bool  # in a test function, a Test class or a pytest fixture


@dataclass
class _Function:
    joins: list[_Join] = field(default_factory=list)
    checks: dict[str, int] = field(default_factory=dict)  # receiver key -> order of its last is_alive() call
    # Names read by an `assert` or an `if` test, with the order they were read at: a test of
    # what the thread's target wrote (`assert answers[0].ok`) tells whether it finished.
    tested: list[tuple[int, set[str]]] = field(default_factory=list)
    # Statements that do more than log or return: their order and the names they use.
    acting: list[tuple[int, set[str]]] = field(default_factory=list)
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
    2cd2230 to check `is_alive()` and raise. What counts as checking: `is_alive()`
    after the join, or an `assert`/`if` on what the thread's target writes (a test
    that joins a client thread, then asserts on the answer it appended). A join
    that nothing after it relies on is a bounded wait and is not judged: only
    logging follows, or (when the thread's code is in the file) what follows
    touches nothing the thread's target or its `args` use. Tests are not
    judged: there the timeout is the test's own deadline, and what the test
    asserts afterwards, or the test run ending, settles a thread left behind."""

    id = "INV115"
    catches = "`thread.join(timeout)` outside tests with no `is_alive()` check after it in the same function"
    message = (
        "`{call}` may return with `{thread}` still running, and nothing here checks: test "
        "`{thread}.is_alive()` after it and report (or escalate) a thread that did not stop"
    )
    known_problems = (
        "A thread is known by `threading.Thread(...)` assigned to it in this file or by a name ending in "
        "`thread`; a Thread subclass joining itself (`self.join(5)`) and multiprocessing processes are not "
        "judged. Any `is_alive()` of the same thread later in the function counts, as does one in the test "
        "of an enclosing `while` loop; for a loop variable, an `is_alive()` of any member of the same "
        "collection (`[t for t in threads if t.is_alive()]`) counts. So does an `assert` or `if` after the join "
        "that reads a name the thread's target (a lambda, or a def of this file) uses, whether or not that "
        "test really tells the thread finished. A join followed only by logging, or by statements sharing no "
        "name or attribute with the thread's code (when that code is in this file), is not judged, even when "
        "the caller goes on to tear down what the thread uses; a shared name that means something else "
        "counts as relying on the thread. Test code is not judged (a join's timeout there is the test's own "
        "deadline): a `test*` function, a `Test*` class, a pytest fixture, anything nested in them, and a "
        "whole file that imports pytest or unittest (test modules, conftest.py); a test helper module that "
        "imports neither is judged like any other code."
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
                    self.batch_generator.close()
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
                self._index.close()
        '''),
        Invalid('''
            import threading

            def check_threads(before, trace):
                new = [t for t in threading.enumerate() if t not in before]
                for thread in new:
                    thread.join(timeout=2.0)  # expect: INV115
                trace.record("threads-joined", len(new))
        '''),
        Invalid('''
            import threading

            def record_transcript(url, transcript):
                client = threading.Thread(target=lambda: transcript.write(post(url).text))
                client.start()
                client.join(30)  # expect: INV115
                transcript.close()
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
                            raise RuntimeError("generation thread did not stop within 5 s")
                    self.batch_generator.close()
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
                self._index.close()
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
            import threading

            def test_stream_survives_shutdown(url, server):
                answers = []
                client = threading.Thread(target=lambda: answers.append(post(url)))
                client.start()
                server.terminate()
                client.join(30)
                assert answers[0].status_code == 200
                assert server.wait(30) == 0
        '''),
        Valid('''
            import threading

            class MlxServicer:
                def stop_generation_loop(self):
                    self._shutdown_event.set()
                    if self._gen_thread and self._gen_thread.is_alive():
                        self._gen_thread.join(timeout=5.0)
                    logger.info("Generation loop stopped")
        '''),
        Valid('''
            import threading

            def serve(server_args, scheduler_procs):
                warmup = threading.Thread(target=_warmup, args=(server_args,))
                warmup.start()
                run_until_stopped()
                warmup.join(timeout=5.0)
                for proc in scheduler_procs:
                    proc.terminate()

            def _warmup(server_args):
                send_warmup_request(server_args.url)
        '''),
        Valid('''
            import threading

            def record_transcript(url, transcript):
                client = threading.Thread(target=lambda: transcript.write(post(url).text))
                client.start()
                client.join(30)
                if client.is_alive():
                    raise TimeoutError(f"no answer from {url} within 30 s")
                transcript.close()
        '''),
        Valid('''
            import threading

            def test_client_transcript(url, transcript):
                client = threading.Thread(target=lambda: transcript.write(post(url).text))
                client.start()
                client.join(30)  # a test's own deadline: a thread still running fails it below or is reaped
                transcript.close()
        '''),
        Valid('''
            import threading

            import pytest

            @pytest.fixture
            def server(app):
                runner = threading.Thread(target=app.serve_forever, daemon=True)
                runner.start()
                yield app
                app.shutdown()
                runner.join(timeout=5)
                app.server_close()

            def serve_in_background(app):
                worker_thread = threading.Thread(target=app.serve_forever, daemon=True)
                worker_thread.start()
                yield app
                app.shutdown()
                worker_thread.join(timeout=5)
                app.server_close()
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
        self._tests(node.test)

    def visit_If(self, node: cst.If) -> None:
        self._tests(node.test)

    def visit_Assert(self, node: cst.Assert) -> None:
        self._tests(node.test)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if not all(_only_reports(small) for small in node.body):
            self.order += 1
            self._here().acting.append((self.order, _names(node)))

    def _tests(self, test: cst.BaseExpression) -> None:
        self.order += 1
        self._here().tested.append((self.order, _names(test)))

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
            function.joins.append(_Join(node, func.value, keys, self.order, self.ctx.statement, polled,
                                        self._in_test()))

    def end(self) -> None:
        if self._test_module():
            return
        for function in self.functions.values():
            for join in function.joins:
                checked = any(function.checks.get(k, 0) > join.order for k in join.keys)
                if join.polled or checked or join.in_test or not self._is_thread(join.receiver):
                    continue
                used = self._target_names(join.receiver)
                after = [names for order, names in function.acting if order > join.order]
                # Nothing after the join relies on the thread having stopped: only logging, or (when the
                # thread's code is known) statements that touch nothing the thread uses.
                if not after or (used is not None and not any(names & used for names in after)):
                    continue
                if used and any(order > join.order and names & used for order, names in function.tested):
                    continue
                thread = dotted(join.receiver) or "the thread"
                message = self.message.format(call=f"{thread}.join(...)", thread=thread)
                self.ctx.report_at(self.id, join.call, join.statement, message)

    def _in_test(self) -> bool:
        """Inside a `test_*` function, a `Test*` class or a pytest fixture: a join there bounds the test."""
        for frame in self.ctx.scope.frames:
            if frame.kind is Kind.CLASS and frame.name.startswith("Test"):
                return True
            if frame.kind in FUNCTION_KINDS and frame.name.startswith("test"):
                return True
            if isinstance(frame.node, cst.FunctionDef) and any(
                (self.ctx.resolve(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator) or "")
                .startswith("pytest.fixture") for d in frame.node.decorators
            ):
                return True
        return False

    def _test_module(self) -> bool:
        """The file imports pytest or unittest at its top: a test module, a conftest.py, a test helper."""
        imported = self.ctx.scope.frames[0].imports.names.values()
        return any(name.split(".", 1)[0] in _TEST_FRAMEWORKS for name in imported)

    def _alive_checks(self, test: cst.BaseExpression) -> set[str]:
        keys = set()
        for node in [test, *descendants(test)]:
            func = node.func if isinstance(node, cst.Call) else None
            if isinstance(func, cst.Attribute) and func.attr.value == "is_alive":
                key = self.ctx.key(func.value)
                if key:
                    keys.add(key)
        return keys

    def _target_names(self, receiver: cst.BaseExpression) -> set[str] | None:
        """The names and attributes the thread's target (a lambda, or a def of this file) and its
        `args` use; None when the target's code is not in this file."""
        names: set[str] = set()
        known = False
        for assignment in self.ctx.facts.assigned.get(self.ctx.key(receiver) or "", ()):
            if assignment.call_qual not in _THREADS or not isinstance(assignment.value, cst.Call):
                continue
            target = keyword(assignment.value, "target")
            bodies = [target] if isinstance(target, cst.Lambda) else [
                f.node for f in self.ctx.facts.by_key.get(dotted(target) or "", ())
            ] if target is not None else []
            for body in bodies:
                known = True
                names |= _names(body)
            args = keyword(assignment.value, "args")
            if args is not None:
                names |= _names(args)
        return names if known else None

    def _is_thread(self, receiver: cst.BaseExpression) -> bool:
        built = self.ctx.facts.constructed_by(self.ctx.key(receiver))
        if built:
            return bool(built & _THREADS)
        return matches_name(dotted(receiver), _THREAD_NAMES)


_COMMON = frozenset({"self", "cls", "logger", "print", "len", "range", "True", "False", "None", "str"})


def _names(node: cst.CSTNode) -> set[str]:
    """Names and attribute names used in `node`, without the ones every statement shares (`self`)."""
    found = set()
    for n in [node, *descendants(node)]:
        if isinstance(n, cst.Name):
            found.add(n.value)
        elif isinstance(n, cst.Attribute):
            found.add(n.attr.value)
    return found - _COMMON


def _only_reports(small: cst.BaseSmallStatement) -> bool:
    """`logger.info(...)`, `print(...)`, `return`, `pass`: a statement nothing else depends on."""
    if isinstance(small, cst.Pass):
        return True
    if isinstance(small, cst.Return):
        return small.value is None
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        name = dotted(small.value.func) or ""
        return name == "print" or name.split(".", 1)[0] in ("logger", "log", "logging", "_logger", "LOGGER")
    return False


def _has_timeout(call: cst.Call) -> bool:
    timeout = keyword(call, "timeout") or positional(call, 0)
    return timeout is not None and not (isinstance(timeout, cst.Name) and timeout.value == "None")
