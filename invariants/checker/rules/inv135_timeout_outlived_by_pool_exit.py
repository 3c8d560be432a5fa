from __future__ import annotations

import libcst as cst

from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.offload import POOLS
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.scopes import FUNCTION_KINDS
from mlx_invariants.checker.walker import descendants

_FUNCTIONS = (cst.FunctionDef, cst.Lambda, cst.ClassDef)  # their bodies run elsewhere, later, or never
_WAITS = frozenset({"concurrent.futures.wait", "concurrent.futures.as_completed"})


class TimeoutOutlivedByPoolExit(Rule):
    """A `with ThreadPoolExecutor() as pool:` block ends with `pool.shutdown(wait=True)`: leaving it, by a
    return, an exception or the end of the block, waits for every task the pool still runs. A timeout taken
    inside the block (`future.result(timeout=120)`, `concurrent.futures.wait(futures, timeout=...)`) raises
    on time, but the `except TimeoutError:` or the error it raises then leaves the block, and the exit waits
    for the slow task after all: the caller gets its answer when the task ends, however long that is, and the
    timeout guards nothing. `shutdown(wait=False, cancel_futures=True)` in the handler does not help: the exit
    calls `shutdown(wait=True)` again, and a running task cannot be cancelled. open-jarvis/OpenJarvis enforced
    its tool timeout with `future.result(timeout)` inside such a block, so a hung tool held the agent, and the
    request driving it, for the tool's whole run (src/openjarvis/tools/_stubs.py@29b8302:263-267, fixed in
    43f6bae); menaje/mlx-serve bounds a model download the same way (src/mlx_serve/core/model_manager.py@a773868:880),
    and liwz-hz/qwen3-tts-mlx-studio its generation (app.py@6b1fd6d:198).

    Not reported: a handler for the timeout that tells the task to stop (an `Event.set()`, a
    `.stop()`/`.close()`/`.kill()`/`.terminate()`), which the task may honour (a future's `.cancel()` does not
    stop a task already running); a timeout of `None`; a wait in a nested def or lambda (a done-callback), which
    runs when it is called."""

    id = "INV135"
    catches = "a timeout on a future of a `with ThreadPoolExecutor()` block, whose exit waits for the task anyway"
    message = (
        "`{wait}` times out inside `with {pool}(...) as {name}:`, whose exit runs `{name}.shutdown(wait=True)`: "
        "when the timeout fires, leaving the block still waits for the task to finish, so the caller waits as "
        "long as the task takes; keep the pool outside a `with` and give up on the task with "
        "`{name}.shutdown(wait=False)`, or have the task stop itself when the deadline passes"
    )
    known_problems = (
        "A handler that stops the task through something this rule does not recognise (a flag the task polls, "
        "set by assignment) still counts as not stopping it. The future is followed from `pool.submit(...)` "
        "through one local name or directly; futures kept in a list and waited on one by one with `.result("
        "timeout)` are followed when the list is built in the block from `pool.submit` and the loop is there."
    )
    triggers = (("Executor",), ("timeout",))

    INVALID = [
        Invalid('''
            import concurrent.futures


            def run_tool(tool, arguments, timeout):
                with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
                    future = pool.submit(tool.run, arguments)
                    try:
                        return future.result(timeout=timeout)  # expect: INV135
                    except concurrent.futures.TimeoutError:
                        return {"error": f"tool timed out after {timeout}s"}
        '''),
        Invalid('''
            from concurrent.futures import ThreadPoolExecutor, wait


            def embed_batches(batches, embed, deadline):
                with ThreadPoolExecutor(4) as pool:
                    futures = [pool.submit(embed, batch) for batch in batches]
                    done, pending = wait(futures, timeout=deadline)  # expect: INV135
                    if pending:
                        raise TimeoutError(f"{len(pending)} batches still running")
                    return [f.result() for f in done]
        '''),
        Invalid('''
            from concurrent.futures import ThreadPoolExecutor


            def review(workflow, reviewers):
                results = {}
                with ThreadPoolExecutor(max_workers=3) as pool:
                    futures = {name: pool.submit(run, workflow) for name, run in reviewers.items()}
                    for name, future in futures.items():
                        try:
                            results[name] = future.result(timeout=1800)  # expect: INV135
                        except Exception as error:
                            results[name] = {"status": "failed", "error": str(error)}
                return results
        '''),
        Invalid('''
            from concurrent.futures import ThreadPoolExecutor


            def generate_with_timeout(generate, prompt):
                with ThreadPoolExecutor(max_workers=1) as pool:
                    return pool.submit(generate, prompt).result(120)  # expect: INV135
        '''),
    ]
    VALID = [
        Valid('''
            import concurrent.futures


            def run_tool(tool, arguments, timeout):
                pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
                future = pool.submit(tool.run, arguments)
                try:
                    return future.result(timeout=timeout)
                except concurrent.futures.TimeoutError:
                    return {"error": f"tool timed out after {timeout}s"}
                finally:
                    pool.shutdown(wait=False)
        '''),
        Valid('''
            import concurrent.futures
            import threading


            def run_tool(tool, arguments, timeout):
                stop = threading.Event()
                with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
                    future = pool.submit(tool.run, arguments, stop)
                    try:
                        return future.result(timeout=timeout)
                    except concurrent.futures.TimeoutError:
                        stop.set()  # the tool checks it between steps
                        return {"error": f"tool timed out after {timeout}s"}
        '''),
        Valid('''
            from concurrent.futures import ThreadPoolExecutor


            def embed_all(texts, embed):
                with ThreadPoolExecutor(4) as pool:
                    futures = [pool.submit(embed, t) for t in texts]
                    return [f.result(timeout=None) for f in futures]
        '''),
        Valid('''
            from concurrent.futures import ThreadPoolExecutor


            def start(job, report):
                with ThreadPoolExecutor(max_workers=1) as pool:
                    future = pool.submit(job)
                    future.add_done_callback(lambda _: report(future.result(timeout=0)))
        '''),
    ]

    def visit_With(self, node: cst.With) -> None:
        if self.ctx.scope.top.kind not in FUNCTION_KINDS:
            return
        for item in node.items:
            call, name = item.item, item.asname.name if item.asname is not None else None
            if not (isinstance(call, cst.Call) and isinstance(name, cst.Name) and self.ctx.resolve(call.func) in POOLS):
                continue
            for wait, statement in _timed_waits(node, name.value, self.ctx.resolve):
                if not _stops_the_task(node, statement):
                    short = (dotted(call.func) or "ThreadPoolExecutor").rsplit(".", 1)[-1]
                    self.ctx.report_at(self.id, wait, statement, self.message.format(
                        wait=_shown(wait), pool=short, name=name.value))


def _timed_waits(block: cst.With, pool: str, resolve) -> list[tuple[cst.Call, cst.CSTNode]]:
    """The waits with a timeout on the pool's futures in the block's own body, each with its statement."""
    futures = _futures(block, pool)
    found = []
    for statement in descendants(block.body, stop=_FUNCTIONS):
        if not isinstance(statement, cst.SimpleStatementLine | cst.BaseCompoundStatement):
            continue
        for node in _own_calls(statement):
            if _timeout(node) is None:
                continue
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value == "result":
                receiver = func.value
                if (isinstance(receiver, cst.Name) and receiver.value in futures) or _submits(receiver, pool):
                    found.append((node, statement))
            elif resolve(func) in _WAITS and futures:
                found.append((node, statement))
    return found


def _own_calls(statement: cst.CSTNode) -> list[cst.Call]:
    """The calls of a simple statement, or of a compound statement's header (its test, its iterable)."""
    if isinstance(statement, cst.SimpleStatementLine):
        return [n for n in descendants(statement, stop=_FUNCTIONS) if isinstance(n, cst.Call)]
    header = [getattr(statement, field, None) for field in ("test", "iter", "items")]
    nodes = [n for part in header if part is not None
             for item in (part if isinstance(part, list | tuple) else [part])
             for n in (item, *descendants(item, stop=_FUNCTIONS))]
    return [n for n in nodes if isinstance(n, cst.Call)]


def _futures(block: cst.With, pool: str) -> set[str]:
    """Locals the block binds to the pool's futures: `f = pool.submit(...)`, `fs = [pool.submit(...) ...]`, and
    the targets of loops over anything made of them (`for f in as_completed(fs)`, `for name, f in fs.items()`)."""
    names: set[str] = set()
    for node in descendants(block.body, stop=_FUNCTIONS):
        if isinstance(node, cst.Assign) and any(
                _submits(n, pool) for n in (node.value, *descendants(node.value, stop=_FUNCTIONS))):
            names.update(t.target.value for t in node.targets if isinstance(t.target, cst.Name))
    for node in descendants(block.body, stop=_FUNCTIONS):
        if isinstance(node, cst.For | cst.CompFor) and any(
                isinstance(n, cst.Name) and n.value in names for n in (node.iter, *descendants(node.iter))):
            targets = [node.target, *descendants(node.target)]  # `for name, future in futures.items()`: both
            names.update(t.value for t in targets if isinstance(t, cst.Name))
    return names


def _submits(node: cst.CSTNode, pool: str) -> bool:
    """`pool.submit(...)` itself."""
    return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "submit"
            and isinstance(node.func.value, cst.Name) and node.func.value.value == pool)


def _timeout(call: cst.Call) -> cst.BaseExpression | None:
    """The timeout a wait is given, None when it has none (or `None`): `result(5)`, `result(timeout=5)`,
    `wait(fs, timeout=5)`, `as_completed(fs, 5)`."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "timeout":
            return None if isinstance(arg.value, cst.Name) and arg.value.value == "None" else arg.value
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    method = call.func.attr.value if isinstance(call.func, cst.Attribute) else dotted(call.func) or ""
    index = 0 if method == "result" else 1
    value = positional[index] if len(positional) > index else None
    return None if isinstance(value, cst.Name) and value.value == "None" else value


_STOPS = frozenset({"set", "stop", "close", "kill", "terminate"})


def _stops_the_task(block: cst.With, statement: cst.CSTNode) -> bool:
    """A handler of the `try` around the wait, in the block, tells something to stop (`stop.set()`, `proc.kill()`):
    the task may end soon after the timeout."""
    for node in descendants(block.body, stop=_FUNCTIONS):
        if isinstance(node, cst.Try) and any(n is statement for n in descendants(node.body, stop=_FUNCTIONS)):
            for handler in node.handlers:
                for call in descendants(handler.body, stop=_FUNCTIONS):
                    if (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
                            and call.func.attr.value in _STOPS):
                        return True
    return False


def _shown(call: cst.Call) -> str:
    text = dotted(call.func) or ""
    if not text and isinstance(call.func, cst.Attribute):
        text = f"{(dotted(call.func.value) or '...').rsplit('.', 1)[-1][:30]}.{call.func.attr.value}"
    return f"{text or 'wait'}(...)"
