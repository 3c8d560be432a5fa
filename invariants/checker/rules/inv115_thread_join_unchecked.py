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
# Methods that release what they are called on (or, on `os`/`shutil`, what they are handed).
_RELEASES = frozenset({"close", "aclose", "shutdown", "terminate", "kill", "release", "cleanup", "dispose",
                       "destroy", "unload", "free", "stop", "disconnect", "unlink", "rmtree"})
_REMOVERS = frozenset({"os.remove", "os.unlink", "os.rmdir", "shutil.rmtree"})


@dataclass
class _Release:
    """A statement that releases something: closes, stops or deletes it, or sets it to None."""

    order: int
    names: set[str]  # the names and attributes of what it releases
    keys: set[str]  # the keys of what it releases (a thread's own handle `self._thread = None` is not a release)
    statement: cst.CSTNode


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
    releases: list[_Release] = field(default_factory=list)  # statements that release something, in order
    polling: list[set[str]] = field(default_factory=list)  # keys whose is_alive() the enclosing while loops test
    members: dict[str, str] = field(default_factory=dict)  # loop variable -> the collection it runs over


class ThreadJoinUnchecked(Rule):
    """`thread.join(timeout)` returns None whether or not the thread stopped: only
    `thread.is_alive()` afterwards tells. A shutdown that joins with a timeout and
    then releases what the thread works on leaves a thread that did not stop
    running into what is gone: a generation thread still stepping a model the
    server has just closed or dropped, a cache writer still spilling into an index
    already closed. vllm-mlx's SSD cache tier did exactly that in `close()`
    (ssd_cache.py@61fab4b:1230: join(timeout=5.0), then close the index), fixed in
    2cd2230 to check `is_alive()` and raise. Only that is judged: a join followed by
    a release (`x.close()`, `shutdown()`, `terminate()`, `unlink()`, `os.remove`,
    `shutil.rmtree`, `del x`, `x = None`) of something the thread's target or its
    `args` use, or, when the thread's code is not in the file, of anything but the
    thread's own handle. A join that is just a bounded wait (a daemon told to stop,
    a server whose `shutdown()` already waited for `serve_forever`, followed by
    logging, `self._thread = None`, or more use of a thread-safe queue) is not.
    What counts as checking: `is_alive()` after the join, or an `assert`/`if` on
    what the thread's target writes. Tests are not judged: there the timeout is
    the test's own deadline, and what the test asserts afterwards, or the test run
    ending, settles a thread left behind."""

    id = "INV115"
    catches = ("`thread.join(timeout)` outside tests, unchecked by `is_alive()`, then a release (close, "
               "shutdown, `= None`, ...) of what the thread uses")
    message = (
        "`{call}` may return with `{thread}` still running, and `{release}` then releases what it uses: "
        "test `{thread}.is_alive()` after the join and report (or escalate) a thread that did not stop "
        "before releasing anything"
    )
    known_problems = (
        "A thread is known by `threading.Thread(...)` assigned to it in this file or by a name ending in "
        "`thread`; a Thread subclass joining itself (`self.join(5)`) and multiprocessing processes are not "
        "judged. Any `is_alive()` of the same thread later in the function counts, as does one in the test "
        "of an enclosing `while` loop; for a loop variable, an `is_alive()` of any member of the same "
        "collection (`[t for t in threads if t.is_alive()]`) counts. So does an `assert` or `if` after the join "
        "that reads a name the thread's target (a lambda, or a def of this file) uses, whether or not that "
        "test really tells the thread finished. Only a release in the same function counts as relying on the "
        "thread: one in a caller (`stop()` then `close()`), a release through a method of another name "
        "(`reset()`, `clear()`), reusing what the thread uses (putting to its queue, restarting it) and "
        "returning a result the thread was to produce are not judged. A released name or attribute is "
        "matched to the thread's code by its last part, so a shared name that means something else counts "
        "as the thread's. Test code is not judged (a join's timeout there is the test's own "
        "deadline): a `test*` function, a `Test*` class, a pytest fixture, anything nested in them, and a "
        "whole file that imports pytest or unittest (test modules, conftest.py); a test helper module that "
        "imports neither is judged like any other code."
    )
    # Opt-in: on the servers kept aside from the rules (issue 23, sets k, m and n) none of its four findings was
    # graded true blind (one arguable, three false): what the join releases was, each time, something the thread
    # no longer needed (a progress thread's clock, a loop asyncio refuses to close while it runs, a cache's disk
    # layer) or teardown at exit. Whether a release hurts a thread still running is more than the code around the
    # join says.
    default_enabled = False
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
            import shutil
            from threading import Thread

            def run_in_scratch(work, scratch, seconds):
                runner = Thread(target=work, args=(scratch,))
                runner.start()
                runner.join(seconds)  # expect: INV115
                shutil.rmtree(scratch)
        '''),
        Invalid('''
            def close(self):
                self._stop.set()
                self._writer_thread.join(timeout=2.0)  # expect: INV115
                self._index.close()
        '''),
        Invalid('''
            def stop_workers(workers, pool):
                for thread in workers:
                    thread.join(timeout=2.0)  # expect: INV115
                pool.shutdown()
        '''),
        Invalid('''
            import threading

            def record_transcript(url, transcript):
                client = threading.Thread(target=lambda: transcript.write(post(url).text))
                client.start()
                client.join(30)  # expect: INV115
                transcript.close()
        '''),
        Invalid('''
            import threading

            class Generator:
                def start(self):
                    self._worker = threading.Thread(target=self._decode_loop, daemon=True)
                    self._worker.start()

                def _decode_loop(self):
                    while not self._stop.is_set():
                        self.model.step()

                def unload(self):
                    self._stop.set()
                    self._worker.join(timeout=5.0)  # expect: INV115
                    self.model = None
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
            import shutil
            from threading import Thread

            def run_in_scratch(work, scratch, seconds):
                runner = Thread(target=work, args=(scratch,))
                runner.start()
                runner.join(seconds)
                if runner.is_alive():
                    raise TimeoutError(f"work still running after {seconds} s; {scratch} kept")
                shutil.rmtree(scratch)
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
            def stop_workers(workers, pool):
                for thread in workers:
                    thread.join(timeout=2.0)
                alive = [t.name for t in workers if t.is_alive()]
                if alive:
                    raise RuntimeError(f"workers still running: {alive}")
                pool.shutdown()
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
        Valid('''
            import threading

            class Generator:
                def start(self):
                    self._worker = threading.Thread(target=self._decode_loop, daemon=True)
                    self._worker.start()

                def _decode_loop(self):
                    while not self._stop.is_set():
                        self.model.step()

                def unload(self):
                    self._stop.set()
                    self._worker.join(timeout=5.0)
                    if self._worker.is_alive():
                        raise RuntimeError("decode thread still running after 5 s; model kept")
                    self.model = None
        '''),
        Valid('''
            import socketserver
            import threading

            class HandoffServer(socketserver.ThreadingTCPServer):
                def start(self):
                    self._thread = threading.Thread(target=self.serve_forever, daemon=True)
                    self._thread.start()

                def stop(self):
                    self.shutdown()  # returns once serve_forever has returned
                    self.server_close()
                    self._thread.join(timeout=5)
                    self._thread = None
        '''),
        Valid('''
            import threading

            def download(repo, progress):
                done = threading.Event()
                beat = threading.Thread(target=lambda: send_heartbeats(done, progress), daemon=True)
                beat.start()
                fetch(repo)
                done.set()
                beat.join(timeout=1.0)
                progress.put({"kind": "end", "repo": repo})  # a queue: a late heartbeat just lands after this
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
        released: list[cst.BaseExpression] = []
        for small in node.body:
            released += self._released(small)
        if released:
            self.order += 1
            names = set().union(*(_names(r) for r in released))
            keys = {k for k in map(self.ctx.key, released) if k}
            self._here().releases.append(_Release(self.order, names, keys, node))

    def _released(self, small: cst.BaseSmallStatement) -> list[cst.BaseExpression]:
        """What `small` releases: `x.close()` (and the other `_RELEASES`), `os.remove(path)`,
        `shutil.rmtree(path)`, `del x`, `x = None`."""
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            call = small.value
            if self.ctx.resolve(call.func) in _REMOVERS:
                return [a.value for a in call.args]
            if isinstance(call.func, cst.Attribute) and call.func.attr.value in _RELEASES:
                return [call.func.value]
            return []
        if isinstance(small, cst.Del):
            target = small.target
            return list(e.value for e in target.elements) if isinstance(target, cst.Tuple) else [target]
        if isinstance(small, cst.Assign) and isinstance(small.value, cst.Name) and small.value.value == "None":
            return [t.target for t in small.targets if isinstance(t.target, cst.Name | cst.Attribute)]
        return []

    def _tests(self, test: cst.BaseExpression) -> None:
        self.order += 1
        self._here().tested.append((self.order, _names(test)))

    def leave_While(self, node: cst.While) -> None:
        self._here().polling.pop()

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if self.ctx.resolve(func) in _THREADS:
            self.ctx.pin(keyword(node, "target"))  # `self._run` is keyed by class: remembered for end()
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
                # What comes after the join releases something the thread uses (anything but its own
                # handle, when the thread's code is not in this file): it relies on the thread having stopped.
                release = next((r for r in function.releases if r.order > join.order and not r.keys & join.keys
                                and (used is None or r.names & used)), None)
                if release is None:
                    continue
                if used and any(order > join.order and names & used for order, names in function.tested):
                    continue
                thread = dotted(join.receiver) or "the thread"
                message = self.message.format(call=f"{thread}.join(...)", thread=thread,
                                              release=_short(self.ctx.module.code_for_node(release.statement)))
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
        """The names and attributes the thread's target (a lambda, or a def of this file), the defs of
        this file it calls (`self._spill()`, and theirs), and its `args` use; None when the target's
        code is not in this file."""
        names: set[str] = set()
        known = False
        facts = self.ctx.facts
        for assignment in facts.assigned.get(self.ctx.key(receiver) or "", ()):
            if assignment.call_qual not in _THREADS or not isinstance(assignment.value, cst.Call):
                continue
            target = keyword(assignment.value, "target")
            bodies = [target] if isinstance(target, cst.Lambda) else [
                f.node for f in facts.by_key.get(self.ctx.key(target) or "", ())
            ] if target is not None else []
            reached = [f for f in (facts.functions.get(id(b)) for b in bodies) if f is not None]
            seen = {id(f.node) for f in reached}
            while reached:
                for callee in facts.callees(reached.pop()):
                    if id(callee.node) not in seen:
                        seen.add(id(callee.node))
                        reached.append(callee)
                        bodies.append(callee.node)
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


def _short(code: str) -> str:
    line = " ".join(code.split())
    return line if len(line) <= 60 else line[:57] + "..."


def _has_timeout(call: cst.Call) -> bool:
    timeout = keyword(call, "timeout") or positional(call, 0)
    return timeout is not None and not (isinstance(timeout, cst.Name) and timeout.value == "None")
