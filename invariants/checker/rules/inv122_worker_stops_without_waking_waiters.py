from __future__ import annotations

import libcst as cst

from mlx_invariants.checker.facts import FunctionFacts
from mlx_invariants.checker.names import dotted, terminal
from mlx_invariants.checker.offload import keyword
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.walker import OWN_BODY_STOP, descendants

_THREADS = frozenset({"threading.Thread"})
# How a worker thread hands a result (or an error) back to coroutines waiting on the loop.
_HAND_BACKS = frozenset({"call_soon_threadsafe", "run_coroutine_threadsafe"})
# ... and what else counts as failing or waking them when it stops.
_WAKES = _HAND_BACKS | {"set_exception", "set_result", "cancel", "put_nowait", "put", "notify_all"}


class WorkerStopsWithoutWakingWaiters(Rule):
    """A worker thread that answers requests (it resolves their futures or feeds
    their queues on the event loop through `call_soon_threadsafe`) owns a promise
    to every request still waiting. When it is told to stop, its loop ends and the
    thread exits; if nothing on the way out fails the requests it had not answered
    yet, their coroutines wait forever on a future nobody will resolve, until the
    client's deadline or the transport gives up, and a graceful shutdown hangs on
    them. smg's MLX servicer stopped its generation thread this way
    (servicer.py@fbe2497:423-427: set the shutdown event, join), fixed in a41aa6c
    by failing pending futures and closing every stream queue in the thread's
    shutdown tail."""

    id = "INV122"
    catches = "a stop flag set for a worker thread that answers loop waiters but wakes none of them when it exits"
    message = (
        "`{call}` ends `{worker}`'s loop, and nothing after that loop wakes the coroutines it answers through "
        "`{hand_back}`: requests still waiting hang until their deadline; on exit, fail pending futures and "
        "close stream queues (from the thread, through `call_soon_threadsafe`)"
    )
    known_problems = (
        "Sees a `threading.Thread` target of this file whose body has a `while` loop testing an event "
        "(`while not self._stop.is_set():`), and a `.set()` of that event elsewhere in the file. Any hand-back "
        "call in the target outside that loop (call_soon_threadsafe, set_exception, put_nowait, ...) counts "
        "as waking the waiters, whatever it wakes; a stop flag that is a plain attribute is not judged."
    )
    triggers = (("Thread",), ("call_soon_threadsafe", "run_coroutine_threadsafe"), (".set()",))

    INVALID = [
        Invalid('''
            import threading

            class MlxServicer:
                def start_generation_loop(self, loop):
                    self._loop = loop
                    self._stop = threading.Event()
                    self._thread = threading.Thread(target=self._generation_loop, daemon=True)
                    self._thread.start()

                def stop_generation_loop(self):
                    self._stop.set()  # expect: INV122

                def _generation_loop(self):
                    while not self._stop.is_set():
                        for uid, token in self._step():
                            self._loop.call_soon_threadsafe(self._queues[uid].put_nowait, token)
        '''),
    ]
    VALID = [
        Valid('''
            import threading

            class MlxServicer:
                def start_generation_loop(self, loop):
                    self._loop = loop
                    self._stop = threading.Event()
                    self._thread = threading.Thread(target=self._generation_loop, daemon=True)
                    self._thread.start()

                def stop_generation_loop(self):
                    self._stop.set()

                def _generation_loop(self):
                    while not self._stop.is_set():
                        for uid, token in self._step():
                            self._loop.call_soon_threadsafe(self._queues[uid].put_nowait, token)
                    for queue in self._queues.values():
                        self._loop.call_soon_threadsafe(queue.put_nowait, None)
        '''),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if terminal(node.func) == "Thread":
            self.ctx.pin(keyword(node, "target"))  # its key is looked up in end(), outside the class

    def end(self) -> None:
        facts = self.ctx.facts
        for function in list(facts.functions.values()):
            for site in function.calls:
                if site.qual not in _THREADS:
                    continue
                target = keyword(site.node, "target")
                for worker in facts.by_key.get(self.ctx.key(target) or "", ()) if target is not None else ():
                    self._judge(worker)

    def _judge(self, worker: FunctionFacts) -> None:
        node = worker.node
        if not isinstance(node, cst.FunctionDef):
            return
        body = list(descendants(node.body, OWN_BODY_STOP))
        for loop in (n for n in body if isinstance(n, cst.While)):
            flag = _event_tested(loop.test)
            inside = {id(n) for n in descendants(loop, OWN_BODY_STOP)}
            hand_backs = [n for n in body if id(n) in inside and _call_named(n, _HAND_BACKS)]
            if flag is None or not hand_backs:
                continue
            if any(id(n) not in inside and n is not loop and _call_named(n, _WAKES) for n in body):
                continue
            hand_back = terminal(hand_backs[0].func) or "call_soon_threadsafe"  # type: ignore[attr-defined]
            for function in self.ctx.facts.functions.values():
                if function is worker:
                    continue
                for site in function.calls:
                    if site.text == f"{flag}.set":
                        message = self.message.format(call=f"{flag}.set()", worker=worker.key, hand_back=hand_back)
                        self.ctx.report_at(self.id, site.node, None, message)


def _event_tested(test: cst.BaseExpression) -> str | None:
    """`self._stop` for `while not self._stop.is_set():`."""
    for n in [test, *descendants(test)]:
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "is_set":
            return dotted(n.func.value)
    return None


def _call_named(node: cst.CSTNode, names: frozenset[str]) -> bool:
    return isinstance(node, cst.Call) and terminal(node.func) in names
