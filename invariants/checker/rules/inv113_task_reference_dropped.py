from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.rule import Invalid, Rule, Valid

_SPAWNERS = frozenset({"asyncio.create_task", "asyncio.ensure_future", "asyncio.tasks.create_task",
                       "asyncio.tasks.ensure_future"})
_LOOP_MAKERS = frozenset({"asyncio.get_event_loop", "asyncio.get_running_loop", "asyncio.new_event_loop",
                          "asyncio.events.get_event_loop", "asyncio.events.get_running_loop"})
_LOOP_NAMES = ["loop", "*_loop"]  # a receiver of `.create_task` known by name as an event loop


@dataclass
class _Dropped:
    call: cst.Call
    receiver: cst.BaseExpression | None  # for `loop.create_task`: judged once the file's assignments are known
    statement: cst.CSTNode | None


class TaskReferenceDropped(Rule):
    """`asyncio.create_task(...)` on a line of its own drops the only strong
    reference to the task: the event loop keeps tasks in a weak set, so one that
    is waiting on something nobody else holds can be garbage-collected before it
    finishes, and an exception it raises is never retrieved ("Task exception was
    never retrieved" at best, at garbage collection). vllm-mlx's AsyncEngineCore.start
    did this with the engine's own start-up (fixed in a76295c by keeping
    `self._start_task`); its server still fires `_rewarm()` and
    `_deferred_generator_close()` this way (server.py:3831 and :4739 at 4b654c0).

    Opt-in (`select = ["INV", "INV113"]`): in practice a dropped task is kept alive by
    what it waits on (a timer, a socket, an event its engine holds) and its exception is
    logged when it is collected, so of five findings on the HEADs of ten MLX servers none
    mattered: two coroutines that logged their own errors, two waiting on state the
    engine kept, and a start-up task that finished in its first step."""

    id = "INV113"
    catches = "the task `asyncio.create_task` / `ensure_future` / `loop.create_task` returns, discarded"
    message = (
        "the task `{call}` creates is dropped: the loop holds tasks only weakly, so it can be garbage-collected "
        "mid-flight and its exception is never seen; keep a reference (an attribute, or a set of background "
        "tasks with `task.add_done_callback(tasks.discard)`) and handle its outcome"
    )
    known_problems = (
        "Only a call that is a statement of its own is judged: a task bound to a name nobody reads, or "
        "`create_task(...).add_done_callback(...)`, is not flagged. `X.create_task` counts when X was built "
        "by asyncio.get_event_loop/get_running_loop/new_event_loop in this file or is named `loop` or "
        "`*_loop`; a TaskGroup's create_task keeps its task and is never flagged. It cannot tell a task that "
        "could really be collected mid-flight (one waiting on a future nothing else holds) from the usual "
        "harmless kind, which is why it is opt-in."
    )
    # Opt-in: on the HEADs of ten MLX servers its 5 findings were all harmless (a task that finishes in
    # its first step, or waits on what the engine keeps alive and logs its own errors); a dropped task
    # is kept alive by what it waits on, and its exception is logged when it is collected.
    default_enabled = False
    triggers = (("create_task", "ensure_future"),)

    INVALID = [
        Invalid('''
            import asyncio

            class AsyncEngineCore:
                def start(self):
                    asyncio.create_task(self.engine.start())  # expect: INV113
        '''),
        Invalid('''
            import asyncio as aio

            async def load_model(app):
                async def _rewarm():
                    await app.engine.warm()

                aio.ensure_future(_rewarm())  # expect: INV113
        '''),
        Invalid('''
            import asyncio

            class Server:
                def __init__(self):
                    self._events = asyncio.get_event_loop()

                def close_later(self, generator):
                    self._events.create_task(generator.aclose())  # expect: INV113
        '''),
        Invalid('''
            import asyncio

            async def stream(response):
                loop = asyncio.get_running_loop()
                loop.create_task(response.aclose())  # expect: INV113
        '''),
    ]
    VALID = [
        Valid('''
            import asyncio

            class AsyncEngineCore:
                def start(self):
                    self._start_task = asyncio.create_task(self.engine.start())
        '''),
        Valid('''
            import asyncio as aio

            _background = set()

            async def load_model(app):
                async def _rewarm():
                    await app.engine.warm()

                task = aio.ensure_future(_rewarm())
                _background.add(task)
                task.add_done_callback(_background.discard)
        '''),
        Valid('''
            import asyncio

            class Server:
                def __init__(self):
                    self._events = asyncio.get_event_loop()
                    self._closing = set()

                def close_later(self, generator):
                    task = self._events.create_task(generator.aclose())
                    self._closing.add(task)
                    task.add_done_callback(self._closing.discard)
        '''),
        Valid('''
            import asyncio

            async def stream(response):
                await asyncio.create_task(response.aclose())
        '''),
        Valid('''
            import asyncio

            async def fan_out(jobs):
                async with asyncio.TaskGroup() as tg:
                    for job in jobs:
                        tg.create_task(job.run())
        '''),
        Valid('''
            from scheduler.jobs import create_task

            def nightly():
                create_task("compact-cache")
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.dropped: list[_Dropped] = []

    def visit_Expr(self, node: cst.Expr) -> None:
        call = node.value
        if not isinstance(call, cst.Call):
            return
        if self.ctx.resolve(call.func) in _SPAWNERS:
            self.dropped.append(_Dropped(call, None, self.ctx.statement))
        elif isinstance(call.func, cst.Attribute) and call.func.attr.value == "create_task":
            self.ctx.pin(call.func.value)
            self.dropped.append(_Dropped(call, call.func.value, self.ctx.statement))

    def end(self) -> None:
        for dropped in self.dropped:
            if dropped.receiver is not None and not self._is_loop(dropped.receiver):
                continue
            text = f"{dotted(dropped.call.func) or 'create_task'}(...)"
            self.ctx.report_at(self.id, dropped.call, dropped.statement, self.message.format(call=text))

    def _is_loop(self, receiver: cst.BaseExpression) -> bool:
        if isinstance(receiver, cst.Call):
            return self.ctx.resolve(receiver.func) in _LOOP_MAKERS
        built = self.ctx.facts.constructed_by(self.ctx.key(receiver))
        if built:
            return bool(built & _LOOP_MAKERS)
        return matches_name(dotted(receiver), _LOOP_NAMES)
