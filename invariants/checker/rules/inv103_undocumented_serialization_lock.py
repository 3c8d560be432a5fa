from __future__ import annotations

import libcst as cst

from mlx_invariants.checker.globs import matches_name
from mlx_invariants.checker.locks import AWAITED_MUTEXES
from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.walker import OWN_BODY_STOP, descendants


class UndocumentedSerializationLock(Rule):
    """A lock that serializes MLX exists for one reason: two threads must never
    encode Metal command buffers at once. Without a comment saying so, the next
    change reuses it as a request-admission gate ("just wait for the lock"), and
    requests start queueing for minutes behind it. The comment is the contract:
    it says the lock serializes Metal/command-buffer (MLX) access and is not an
    admission gate, so admission stays a separate, fail-fast decision. Code that
    already refuses a request when the lock is held (`if lock.locked(): raise
    Busy(...)` before acquiring it) states that contract in behaviour, which
    outranks any comment: such a lock is not judged.

    The contract is asked of the locks coroutines await (asyncio's, anyio's, trio's): awaiting
    one costs a request nothing but time, so `async with lock` is what a later change reaches
    for as a queue. A threading lock is not judged here: taken on the event loop it blocks
    the loop, which INV114 reports as the defect it is, and taken on worker threads it is
    those threads' serialization, waited on only by the threads the server hands work to.
    On the HEADs of ten MLX servers this rule's two findings were threading locks (a worker
    lock shared with a batch scheduler, whose one wait on the loop INV114 reports; a lock
    that requests poll with a timeout and a cancel check), both graded no defect (issue 23)."""

    id = "INV103"
    # Opt-in (a request for a comment): it detects no corpus case, and reviewers graded none of its 4 sampled
    # findings on ten MLX servers not studied here true (the comment was there, or the file was dead code).
    default_enabled = False
    catches = ("an MLX serialization lock that coroutines await with neither a comment saying it is not an "
               "admission gate nor fail-fast admission (`if lock.locked(): raise Busy`)")
    message = (
        "say in a comment above `{name}` that it serializes Metal command-buffer (MLX) access "
        "and is not an admission gate ({missing})"
    )
    known_problems = (
        "Checks the comment's words, not its truth; only locks whose names match `names` are checked, "
        "and only where they are created. Only awaited lock types are judged (asyncio, anyio, trio): a "
        "threading lock that a thread-per-request server makes its requests queue on is missed. A lock counts as having fail-fast admission when this file "
        "tests its `locked()` in an `if` whose block raises or returns (the `if` may test other things too, "
        "such as an admission mode that can be switched to waiting); admission decided in another file is "
        "not seen."
    )
    options = {
        "names": [
            "*generation*lock*", "*lock*generation*", "*mlx*lock*", "*lock*mlx*", "*metal*lock*", "*lock*metal*",
        ],
        "about-keywords": ["metal", "command buffer", "command-buffer", "mlx"],
        "not-admission-keywords": [
            "not an admission", "not a request-admission", "not a request admission", "not admission",
            "not an admission gate", "not a queue", "never an admission",
        ],
    }
    triggers = (("Lock",),)

    INVALID = [
        Invalid('''
            import asyncio

            class SimpleEngine:
                def __init__(self):
                    # Lock to serialize MLX operations.
                    self._generation_lock = asyncio.Lock()  # expect: INV103
        '''),
        Invalid('''
            import asyncio

            class SimpleEngine:
                def __init__(self):
                    # Lock to serialize MLX operations (prevents Metal command buffer conflicts).
                    self._generation_lock = asyncio.Lock()  # expect: INV103

                async def generate(self, request):
                    if self._generation_lock.locked():
                        logger.info("busy; request %s waits for the lock", request.id)
                    async with self._generation_lock:
                        return await self._run(request)
        '''),
        Invalid('''
            import asyncio

            MLX_LOCK = asyncio.Lock()  # expect: INV103
        '''),
    ]
    VALID = [
        Valid('''
            import asyncio

            class SimpleEngine:
                def __init__(self):
                    # Lock to serialize MLX operations: it guards Metal command-buffer
                    # access only and is not an admission gate (admission fails fast).
                    self._generation_lock = asyncio.Lock()
        '''),
        Valid('''
            import asyncio

            MLX_LOCK = asyncio.Lock()  # serializes Metal command buffers; not an admission gate
        '''),
        Valid('''
            import asyncio

            class SimpleEngine:
                def __init__(self):
                    # Lock to serialize MLX operations (prevents Metal command buffer conflicts).
                    self._generation_lock = asyncio.Lock()

                async def generate(self, request):
                    if self._admission == "fail_fast" and self._generation_lock.locked():
                        raise EngineBusy("the serialized route is busy; retry later")
                    async with self._generation_lock:
                        return await self._run(request)
        '''),
        Valid('''
            import threading
            from queue import Queue

            class Runner:
                """Two worker threads (the batch loop and a single-request fallback) share the model."""

                def __init__(self, model):
                    self.model = model
                    self.jobs = Queue(maxsize=16)
                    self.mlx_lock = threading.RLock()

                def _fallback_worker(self):
                    while (job := self.jobs.get()) is not None:
                        with self.mlx_lock:
                            job.finish(self.model(job.prompt))
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.candidates: list[tuple[cst.SimpleStatementLine, cst.BaseExpression, str, str | None]] = []
        self.refused_when_held: set[str] = set()

    def visit_If(self, node: cst.If) -> None:
        """`if ... lock.locked() ...: raise` (or return): a request is refused when the lock is held."""
        if not any(isinstance(n, cst.Raise | cst.Return) for n in descendants(node.body, OWN_BODY_STOP)):
            return
        for call in [node.test, *descendants(node.test)]:
            func = call.func if isinstance(call, cst.Call) else None
            if isinstance(func, cst.Attribute) and func.attr.value == "locked":
                key = self.ctx.key(func.value)
                if key:
                    self.refused_when_held.add(key)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        for small in node.body:
            if isinstance(small, cst.Assign):
                targets = [t.target for t in small.targets]
                value = small.value
            elif isinstance(small, cst.AnnAssign) and small.value is not None:
                targets, value = [small.target], small.value
            else:
                continue
            if not isinstance(value, cst.Call) or self.ctx.resolve(value.func) not in AWAITED_MUTEXES:
                continue
            for target in targets:
                name = dotted(target)
                if matches_name(name, self.opts["names"]):
                    self.candidates.append((node, target, name or "lock", self.ctx.key(target)))

    def end(self) -> None:
        for statement, target, name, key in self.candidates:
            if key not in self.refused_when_held:
                self._judge(statement, target, name)

    def _judge(self, statement: cst.SimpleStatementLine, target: cst.BaseExpression, name: str) -> None:
        text = " ".join(_comments(statement)).lower()
        missing = []
        if not any(k.lower() in text for k in self.opts["about-keywords"]):
            missing.append("no mention of Metal/MLX")
        if not any(k.lower() in text for k in self.opts["not-admission-keywords"]):
            missing.append("no 'not an admission gate'")
        if missing:
            self.ctx.report_at(self.id, target, statement, self.message.format(name=name, missing=", ".join(missing)))


def _comments(statement: cst.SimpleStatementLine) -> list[str]:
    """The comment beside the statement and the comment block directly above it."""
    found = []
    if statement.trailing_whitespace.comment is not None:
        found.append(statement.trailing_whitespace.comment.value)
    for line in reversed(statement.leading_lines):
        if line.comment is None:
            break
        found.append(line.comment.value)
    return found
