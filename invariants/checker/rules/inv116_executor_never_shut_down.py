from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.offload import POOLS, positional
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.scopes import FUNCTION_KINDS
from mlx_invariants.checker.nodes import children
from mlx_invariants.checker.walker import descendants


@dataclass
class _Pool:
    call: cst.Call
    name: str | None  # the local it is bound to; None when the call is used where it stands
    function: cst.CSTNode
    statement: cst.CSTNode | None


class ExecutorNeverShutDown(Rule):
    """An executor built inside a function body and never shut down keeps its
    worker threads (and whatever they hold: an MLX stream, a model's buffers, a
    BatchGenerator that a garbage collector later closes on the wrong thread) for
    the life of the process, one more set per call. vllm-mlx's MLLM scheduler built
    `ThreadPoolExecutor(max_workers=1, thread_name_prefix="mllm-step")` at the top
    of `_process_loop` and never shut it down (mllm_scheduler.py@33fea8f7:793),
    while its twin in engine_core.py shut the same pool down in `finally`, with a
    comment on the SIGABRT a stale worker caused."""

    id = "INV116"
    # Opt-in: on MLX servers nobody here had studied, blind reviewers graded none of its findings true (one
    # arguable, one false: a pool that lives as long as the listener it serves, garbage-collected with it), and
    # it detects no case of the corpus; a leaked pool is hygiene, not a hang.
    default_enabled = False
    catches = "a ThreadPoolExecutor/ProcessPoolExecutor built in a function and never shut down there"
    message = (
        "`{pool}` is built here and never shut down, nor handed on: each call leaves its worker threads "
        "behind; use `with {short}(...) as pool:`, call `.shutdown()` in a `finally`, or keep one pool "
        "on the object"
    )
    known_problems = (
        "Judges pools built inside a function. The pool counts as handed on (and is not judged) when it "
        "is stored anywhere but a plain local, returned or yielded, passed to any call other than "
        "`run_in_executor`, or bound to a local that is so used; any `.shutdown` of the local in the "
        "function (a nested def included) counts, on whatever path it runs."
    )
    triggers = (("Executor",),)

    INVALID = [
        Invalid('''
            import asyncio
            import concurrent.futures

            class MLLMScheduler:
                async def _process_loop(self):
                    _executor = concurrent.futures.ThreadPoolExecutor(  # expect: INV116
                        max_workers=1, thread_name_prefix="mllm-step"
                    )
                    loop = asyncio.get_running_loop()
                    while self._running:
                        await loop.run_in_executor(_executor, self.step)
        '''),
        Invalid('''
            from concurrent.futures import ThreadPoolExecutor

            def embed_all(texts, embed):
                futures = [ThreadPoolExecutor(4).submit(embed, t) for t in texts]  # expect: INV116
                return [f.result() for f in futures]
        '''),
        Invalid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor as Pool

            async def load(path, read):
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(Pool(max_workers=1), read, path)  # expect: INV116
        '''),
    ]
    VALID = [
        Valid('''
            import asyncio
            import concurrent.futures

            class MLLMScheduler:
                async def _process_loop(self):
                    _executor = concurrent.futures.ThreadPoolExecutor(
                        max_workers=1, thread_name_prefix="mllm-step"
                    )
                    loop = asyncio.get_running_loop()
                    try:
                        while self._running:
                            await loop.run_in_executor(_executor, self.step)
                    finally:
                        _executor.shutdown(wait=True)
        '''),
        Valid('''
            from concurrent.futures import ThreadPoolExecutor

            def embed_all(texts, embed):
                with ThreadPoolExecutor(4) as pool:
                    futures = [pool.submit(embed, t) for t in texts]
                    return [f.result() for f in futures]
        '''),
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor as Pool

            class Loader:
                def __init__(self):
                    self._pool = Pool(max_workers=1)

                async def load(self, path, read):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(self._pool, read, path)
        '''),
        Valid('''
            from concurrent import futures

            import grpc

            def serve(port):
                server = grpc.aio.server(futures.ThreadPoolExecutor(max_workers=10))
                server.add_insecure_port(f"[::]:{port}")
                return server
        '''),
        Valid('''
            from concurrent.futures import ThreadPoolExecutor

            def make_worker(name):
                worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
                worker.submit(bind_streams).result()
                return worker
        '''),
        Valid('''
            from concurrent.futures import ThreadPoolExecutor

            _POOL = ThreadPoolExecutor(max_workers=2)

            def pool():
                return _POOL
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.pools: list[_Pool] = []

    def visit_Call(self, node: cst.Call) -> None:
        function = self.ctx.scope.function()
        if function is None or self.ctx.scope.top.kind not in FUNCTION_KINDS:
            return
        if self.ctx.resolve(node.func) not in POOLS:
            return
        statement = self.ctx.statement
        if statement is None:
            return
        parents = _parents(statement)
        holder = _holder(node, parents)
        if holder is _HANDED_ON:
            return
        self.pools.append(_Pool(node, holder, function.node, statement))

    def end(self) -> None:
        for pool in self.pools:
            if pool.name is not None and _handled(pool.name, pool.function):
                continue
            text = dotted(pool.call.func) or "ThreadPoolExecutor"
            message = self.message.format(pool=f"{text}(...)", short=text.rsplit(".", 1)[-1])
            self.ctx.report_at(self.id, pool.call, pool.statement, message)


_HANDED_ON = "<handed on>"


def _parents(root: cst.CSTNode) -> dict[int, cst.CSTNode]:
    found: dict[int, cst.CSTNode] = {}
    stack = [root]
    while stack:
        node = stack.pop()
        for child in children(node):
            found[id(child)] = node
            stack.append(child)
    return found


def _holder(call: cst.Call, parents: dict[int, cst.CSTNode]) -> str | None:
    """The local name the new pool is bound to, None if it is used where it stands, or _HANDED_ON."""
    node: cst.CSTNode = call
    parent = parents.get(id(node))
    while isinstance(parent, cst.BooleanOperation | cst.IfExp):  # `given or ThreadPoolExecutor(1)`
        node, parent = parent, parents.get(id(parent))
    if isinstance(parent, cst.WithItem):
        return _HANDED_ON  # the with statement shuts it down
    if isinstance(parent, cst.Assign | cst.AnnAssign | cst.NamedExpr):
        targets = [t.target for t in parent.targets] if isinstance(parent, cst.Assign) else [parent.target]
        names = [t.value for t in targets if isinstance(t, cst.Name)]
        return names[0] if names and len(names) == len(targets) else _HANDED_ON
    if isinstance(parent, cst.Return | cst.Yield | cst.Element | cst.DictElement):
        return _HANDED_ON
    if isinstance(parent, cst.Arg):
        call_site = parents.get(id(parent))
        if isinstance(call_site, cst.Call) and _is_run_in_executor(call_site) and positional(call_site, 0) is node:
            return None
        return _HANDED_ON
    if isinstance(parent, cst.Attribute):
        return None  # `ThreadPoolExecutor(4).submit(...)`: nobody can shut it down
    return _HANDED_ON


def _handled(name: str, function: cst.CSTNode) -> bool:
    """The local `name` is shut down, managed by a with, or handed on, somewhere in `function`."""
    parents = _parents(function)
    for node in descendants(function):
        if not (isinstance(node, cst.Name) and node.value == name):
            continue
        parent = parents.get(id(node))
        if isinstance(parent, cst.Attribute) and parent.value is node:
            if parent.attr.value == "shutdown":
                return True
            continue  # `pool.submit`, `pool.map`: used, not handed on
        if isinstance(parent, cst.AssignTarget | cst.Param):
            continue
        if isinstance(parent, cst.Arg):
            call = parents.get(id(parent))
            if isinstance(call, cst.Call) and _is_run_in_executor(call) and positional(call, 0) is node:
                continue
        return True  # returned, stored, passed on, managed by `with`, declared global or nonlocal
    return False


def _is_run_in_executor(call: cst.Call) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "run_in_executor"
