from __future__ import annotations

from mlx_invariants.checker.model.queries import UNGUARDED_MESSAGE
from mlx_invariants.checker.rule import PACKAGE_ONLY, Invalid, Rule, Valid

# The engine the examples import: a sync def that encodes MLX work, one that waits for it.
_ENGINE = {"app/engine.py": '''
    import mlx.core as mx

    class Engine:
        def encode(self, prompt):
            return mx.array(prompt)

        def generate_all(self, prompt):
            tokens = self.encode(prompt)
            mx.eval(tokens)
            return tokens
'''}
# This rule alone: the handoffs under a lock are INV103's and INV105's to judge, the default pool INV107's.
_ONLY = {"select": ["INV125"]}
_LOCK = {**_ONLY, "mlx-locks": ["self._generation_lock"]}


class MlxOutsideDeclaredLock(Rule):
    """Lockset completeness, asked only of a project that declares the locks that guard its
    MLX (`mlx-locks = ["self._generation_lock"]` in [tool.invariants], or `# invariants:
    mlx-lock` on the line that assigns one, which asks about the handlers of that module). Such an engine
    serializes MLX by that lock: two requests inside Metal at once, or a prompt cache built
    while another request's generation runs, is what the lock is there to prevent. One path
    that reaches MLX without it undoes the lock for every request, and nothing fails until two
    requests meet there. vllm-mlx's SimpleEngine took `self._generation_lock` around its
    generations (vllm_mlx/engine/simple.py@67632e9:242, 401; "Must hold _generation_lock to
    prevent concurrent Metal access", :626) while the cache-hit path of
    `_stream_generate_text` built a prompt cache and an `mx.array` on the loop without it
    (:1024-1028, fixed in d76f9b3). Maintainers check this today with `git grep` for the
    lock's name; the package model checks it over every module.

    A request handler is an `async def` on the event loop (not one declared to run on the
    owner thread); its family is its class, or its module's top level, and only a family
    that takes a declared lock somewhere is asked: the lock is that class's, not another's.
    Reported where a handler leaves the lock out: its own MLX call, its call of a sync def of
    the package that reaches MLX with no declared lock taken on the way, and a handoff to a
    thread (the default pool, an executor, a `Thread`; not the owner executor of
    owner-executors, which serializes by itself) of work that does. A def every caller
    enters with the lock held is judged at its callers. With `mlx-locks =
    ["self._generation_lock"]`, vllm-mlx at 67632e9 gives two findings: the bug above
    (:1028) and `start()`'s `build_text_model()` (:166, start-up work, arguable); at its fix
    d76f9b3 only the second; at 4b654c0 none (`stop()`'s `mx.clear_cache()`, :976, was
    one until the allocator's cache clear counted as safe on any thread, mlx_facts.py)."""

    id = "INV125"
    catches = "MLX reached from a request handler without the lock the project declares to guard MLX (mlx-locks)"
    message = UNGUARDED_MESSAGE
    known_problems = (
        "Needs a declared MLX lock (mlx-locks, or the comment): silent in a project that declares none. "
        "Start-up and shutdown work (`start()`, `stop()`) is judged like any handler: take the lock there too, "
        "or suppress the line where nothing else can run yet. Only `with` / `async with` blocks count as "
        "holding the lock (`lock.acquire()` ... `release()` does not); a helper that forwards its callable to a "
        "thread under any lock of lock-names counts as serialized. A blocking call without the lock is INV108's too (it says to move it off the "
        "loop, this rule to take the lock). What the package model cannot name (an untyped parameter, a callback "
        "stored and called later) is not followed."
    )
    triggers = PACKAGE_ONLY

    INVALID = [
        Invalid('''
            import asyncio

            import mlx.core as mx


            class Engine:
                def encode(self, prompt):
                    return mx.array(prompt)


            class Server:
                def __init__(self):
                    self.engine = Engine()
                    # Serializes Metal command-buffer (MLX) access; not an admission gate.
                    self._generation_lock = asyncio.Lock()  # invariants: mlx-lock

                async def prefill(self, prompt):
                    async with self._generation_lock:
                        return self.engine.encode(prompt)

                async def count_tokens(self, prompt):
                    return len(self.engine.encode(prompt))  # expect: INV125

                async def embed(self, prompt):
                    return mx.array(prompt)  # expect: INV125
        '''),
        Invalid('''
            import asyncio

            from .engine import Engine


            class Server:
                def __init__(self):
                    self.engine = Engine()
                    self._generation_lock = asyncio.Lock()

                async def generate(self, prompt):
                    async with self._generation_lock:
                        return await asyncio.to_thread(self.engine.generate_all, prompt)

                async def count_tokens(self, prompt):
                    return len(self.engine.encode(prompt))  # expect: INV125
        ''', options=_LOCK, files=_ENGINE),
        Invalid('''
            import asyncio

            from .engine import Engine


            class Server:
                def __init__(self):
                    self.engine = Engine()
                    self._generation_lock = asyncio.Lock()

                async def generate(self, prompt):
                    return await asyncio.to_thread(self.engine.generate_all, prompt)  # expect: INV125

                async def count_tokens(self, prompt):
                    async with self._generation_lock:
                        return len(self.engine.encode(prompt))
        ''', options=_LOCK, files=_ENGINE),
    ]
    VALID = [
        Valid('''
            import asyncio

            import mlx.core as mx


            class Engine:
                def encode(self, prompt):
                    return mx.array(prompt)


            class Server:
                def __init__(self):
                    self.engine = Engine()
                    # Serializes Metal command-buffer (MLX) access; not an admission gate.
                    self._generation_lock = asyncio.Lock()  # invariants: mlx-lock

                async def prefill(self, prompt):
                    async with self._generation_lock:
                        return self.engine.encode(prompt)

                async def count_tokens(self, prompt):
                    async with self._generation_lock:
                        return len(self.engine.encode(prompt))

                async def embed(self, prompt):
                    async with self._generation_lock:
                        return mx.array(prompt)
        '''),
        Valid('''
            import asyncio

            from .engine import Engine


            class Server:
                def __init__(self):
                    self.engine = Engine()
                    self._generation_lock = asyncio.Lock()

                async def generate(self, prompt):
                    async with self._generation_lock:
                        return await asyncio.to_thread(self.engine.generate_all, prompt)

                async def count_tokens(self, prompt):
                    async with self._generation_lock:
                        return len(self.engine.encode(prompt))
        ''', options=_LOCK, files=_ENGINE),
        Valid('''
            import asyncio

            from .engine import Engine


            class Server:
                def __init__(self):
                    self.engine = Engine()
                    self._generation_lock = asyncio.Lock()

                async def generate(self, prompt):
                    async with self._generation_lock:
                        return await self._run(prompt)

                async def _run(self, prompt):
                    return await asyncio.to_thread(self.engine.generate_all, prompt)
        ''', options=_LOCK, files=_ENGINE),
        # The lock is Server's: a class that never takes it is not judged by it.
        Valid('''
            import asyncio

            from .engine import Engine


            class Server:
                def __init__(self):
                    self.engine = Engine()
                    self._generation_lock = asyncio.Lock()

                async def count_tokens(self, prompt):
                    async with self._generation_lock:
                        return len(self.engine.encode(prompt))


            class Warmup:
                def __init__(self):
                    self.engine = Engine()
                    self._generation_lock = asyncio.Lock()

                async def run(self, prompt):
                    return len(self.engine.encode(prompt))
        ''', options=_LOCK, files=_ENGINE),
        # No lock declared: the project did not ask.
        Valid('''
            import asyncio

            from .engine import Engine


            class Server:
                def __init__(self):
                    self.engine = Engine()

                async def count_tokens(self, prompt):
                    return len(self.engine.encode(prompt))
        ''', options=_ONLY, files=_ENGINE),
        # The owner executor serializes MLX by itself.
        Valid('''
            import asyncio
            from concurrent.futures import ThreadPoolExecutor

            from .engine import Engine


            class Server:
                def __init__(self):
                    self.engine = Engine()
                    self._generation_lock = asyncio.Lock()
                    self._mlx_executor = ThreadPoolExecutor(max_workers=1)

                async def generate(self, prompt):
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(self._mlx_executor, self.engine.generate_all, prompt)

                async def count_tokens(self, prompt):
                    async with self._generation_lock:
                        return len(self.engine.encode(prompt))
        ''', options={**_LOCK, "owner-executors": ["self._mlx_executor"]}, files=_ENGINE),
        # A loop that runs on the owner thread, declared so.
        Valid('''
            import asyncio

            from .engine import Engine


            class Server:
                def __init__(self):
                    self.engine = Engine()
                    self._generation_lock = asyncio.Lock()

                async def _owner_main(self, prompts):  # invariants: owner-thread
                    return [len(self.engine.encode(p)) for p in prompts]

                async def count_tokens(self, prompt):
                    async with self._generation_lock:
                        return len(self.engine.encode(prompt))
        ''', options=_LOCK, files=_ENGINE),
    ]
