from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from mlx_invariants.checker import mlx_api
from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.walker import descendants


@dataclass
class _Removal:
    call: cst.Call
    receiver: str | None
    names: set[str]
    guarded: bool  # in a finally or an except clause
    statement: cst.CSTNode | None


@dataclass
class _Function:
    inserts: dict[str, tuple[str | None, cst.BaseExpression]] = field(default_factory=dict)
    removals: list[_Removal] = field(default_factory=list)


class ProbeLeakedOnError(Rule):
    """A function that inserts a request into a BatchGenerator and removes it
    itself (a warmup probe, a health check) must remove it in `finally`. When a
    step in between raises, the removal is skipped: the probe stays in the batch
    and decodes beside the first real requests, taking a slot and changing the
    batch's shape, and nothing ever reports it."""

    id = "INV111"
    catches = "a BatchGenerator insert whose removal, in the same function, is skipped when a step raises"
    message = "`{call}` is skipped when a step before it raises, leaving `{uids}` in the batch: remove it in a `finally`"
    known_problems = (
        "Only judges functions that both insert and remove the same uids; a request removed elsewhere "
        "(the normal case for real requests) is not followed. Generators are known by constructor in "
        "this file or by name (generator-names)."
    )
    options = {"generator-names": ["*batch_generator*", "*batch_gen", "*_generator", "generator"]}
    triggers = ((".insert(",), (".remove(",))

    INVALID = [
        Invalid('''
            import logging

            logger = logging.getLogger(__name__)

            class Servicer:
                def _warmup(self):
                    try:
                        uids = self.batch_generator.insert([[0]], max_tokens=[1])
                        for _ in range(10):
                            _, responses = self.batch_generator.next()
                            if any(r.finish_reason for r in responses):
                                break
                        self.batch_generator.remove(uids)  # expect: INV111
                    except Exception:
                        logger.warning("Warmup failed (non-fatal)", exc_info=True)
        '''),
    ]
    VALID = [
        Valid('''
            import logging

            logger = logging.getLogger(__name__)

            class Servicer:
                def _warmup(self):
                    try:
                        uids = self.batch_generator.insert([[0]], max_tokens=[1])
                        try:
                            for _ in range(10):
                                _, responses = self.batch_generator.next()
                                if any(r.finish_reason for r in responses):
                                    break
                        finally:
                            self.batch_generator.remove(uids)
                    except Exception:
                        logger.warning("Warmup failed (non-fatal)", exc_info=True)
        '''),
        Valid('''
            class Scheduler:
                def admit(self, prompts):
                    uids = self.batch_generator.insert(prompts)
                    self._active.update(uids)

                def finish(self, uid):
                    self.batch_generator.remove([uid])
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.functions: dict[int, _Function] = {}
        self.guards: dict[int, int] = {}

    def _here(self) -> tuple[int, _Function]:
        key = id(self.ctx.scope.top.node)
        return key, self.functions.setdefault(key, _Function())

    def _guard(self, step: int) -> None:
        key = id(self.ctx.scope.top.node)
        self.guards[key] = self.guards.get(key, 0) + step

    def visit_Finally(self, node: cst.Finally) -> None:
        self._guard(1)

    def leave_Finally(self, node: cst.Finally) -> None:
        self._guard(-1)

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        self._guard(1)

    def leave_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        self._guard(-1)

    def visit_Assign(self, node: cst.Assign) -> None:
        value = node.value
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "insert":
            receiver = value.func.value
            self.ctx.pin(receiver)
            _, function = self._here()
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    function.inserts[target.target.value] = (self.ctx.key(receiver), receiver)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "remove" and node.args):
            return
        frame, function = self._here()
        names = {n.value for a in node.args for n in [a.value, *descendants(a.value)] if isinstance(n, cst.Name)}
        guarded = self.guards.get(frame, 0) > 0
        function.removals.append(_Removal(node, self.ctx.key(func.value), names, guarded, self.ctx.statement))

    def end(self) -> None:
        for function in self.functions.values():
            for uids, (receiver, expr) in function.inserts.items():
                if not self._is_generator(expr):
                    continue
                removals = [r for r in function.removals if r.receiver == receiver and uids in r.names]
                if not removals or any(r.guarded for r in removals):
                    continue
                first = removals[0]
                call = f"{dotted(first.call.func) or 'remove'}({uids})"
                self.ctx.report_at(self.id, first.call, first.statement, self.message.format(call=call, uids=uids))

    def _is_generator(self, expr: cst.BaseExpression) -> bool:
        return mlx_api.is_batch_generator(expr, self.ctx) or matches_name(dotted(expr), self.opts["generator-names"])
