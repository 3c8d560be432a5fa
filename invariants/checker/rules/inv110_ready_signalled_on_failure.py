from __future__ import annotations

import libcst as cst

from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.walker import OWN_BODY_STOP, descendants

EVENTS = frozenset({"threading.Event", "asyncio.Event", "multiprocessing.Event", "anyio.Event"})


class ReadySignalledOnFailure(Rule):
    """An owner thread that fails to start (model load, BatchGenerator
    construction) and then sets its ready event anyway tells every waiter it is
    ready: startup marks the server healthy, requests queue for a thread that has
    already exited, and they hang instead of failing. Record the failure before
    setting the event (so `wait_ready()` can return False), or re-raise."""

    id = "INV110"
    catches = "a ready event set in an except handler without recording the failure"
    message = "`{event}.set()` after a failure reports the thread ready: record the failure first (so wait_ready() returns False) or re-raise"
    known_problems = (
        "Looks at the except handler's own statements: a failure recorded by a helper called there is "
        "recognised only as a call before the `set()`. Events are known by constructor or event-names."
    )
    triggers = ((".set()",), ("except",))

    INVALID = [
        Invalid('''
            import logging
            import threading

            logger = logging.getLogger(__name__)

            class Servicer:
                def __init__(self):
                    self._ready_event = threading.Event()

                def _generation_loop(self):
                    try:
                        self.batch_generator = self._build()
                    except Exception:
                        logger.exception("BatchGenerator construction failed")
                        self._ready_event.set()  # expect: INV110
                        return
        '''),
    ]
    VALID = [
        Valid('''
            import logging
            import threading

            logger = logging.getLogger(__name__)

            class Servicer:
                def __init__(self):
                    self._ready_event = threading.Event()

                def _generation_loop(self):
                    try:
                        self.batch_generator = self._build()
                    except Exception as exc:
                        logger.exception("BatchGenerator construction failed")
                        self._startup_error = exc
                        self._ready_event.set()
                        return
        '''),
        Valid('''
            import threading

            class Servicer:
                def __init__(self):
                    self._ready_event = threading.Event()

                def _generation_loop(self):
                    try:
                        self.batch_generator = self._build()
                    except Exception:
                        self._ready_event.set()
                        raise
        '''),
    ]

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        body = node.body.body if isinstance(node.body, cst.IndentedBlock) else ()
        if any(isinstance(n, cst.Raise) for n in descendants(node.body, OWN_BODY_STOP)):
            return
        recorded = False
        for statement in body:
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            for small in statement.body:
                if isinstance(small, cst.Assign | cst.AugAssign | cst.AnnAssign):
                    recorded = True
                elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                    event = _set_receiver(small.value)
                    if event is not None and not recorded and self._is_event(event):
                        self.report(small.value, event=dotted(event))
                    elif event is None and not _is_logging(small.value):
                        recorded = True  # a helper call may record the failure

    def _is_event(self, expr: cst.BaseExpression) -> bool:
        """A readiness event: setting a done/stop event on failure is right, so only these count."""
        text = (dotted(expr) or "").lower()
        if "ready" not in text and "start" not in text:
            return False
        built = self.ctx.facts.constructed_by(self.ctx.key(expr))
        if built:
            return bool(built & EVENTS)
        return matches_name(text, self.ctx.shared["event-names"])


def _set_receiver(call: cst.Call) -> cst.BaseExpression | None:
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "set" and not call.args:
        return func.value
    return None


def _is_logging(call: cst.Call) -> bool:
    text = (dotted(call.func) or "").lower()
    return text.startswith(("log", "logger", "logging", "_log", "self.log", "self._log", "print", "warnings"))
