"""The seed bugs, planted into copies of the reference engine under other package names.

Each plant is a list of exact source edits applied to a copy of `engine/`
(never a flag inside `engine/`, never a special case in `fuzz/`). If the
engine changes so that an edit no longer applies, `plant()` says which one.
"""

from __future__ import annotations

import importlib
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

ENGINE_DIR = Path(__file__).resolve().parents[2] / "engine"


@dataclass(frozen=True)
class Plant:
    name: str
    engine: str                                   # "simple" or "batched"
    edits: tuple[tuple[str, str, str], ...]       # (file, exact old text, new text)
    finds: frozenset[str]                         # violation kinds that count as catching it
    why: str


PLANTS: dict[str, Plant] = {p.name: p for p in (
    Plant("lock_freed_on_cancel", "simple", (
        ("serial.py", "            await wait_through_cancellation(job.done)\n",
         "            if not stream.abort_acknowledged:  # cancelled: nothing left to wait for (wrong)\n"
         "                await wait_through_cancellation(job.done)\n"),),
        frozenset({"slot-freed-early"}),
        "a cancelled request gives up the slot at once while its worker is still generating"),
    Plant("nested_lock_reacquire", "simple", (
        ("serial.py", "            await wait_through_cancellation(job.done)\n",
         "            if stream.abort_acknowledged:\n"
         "                async with self._generation_lock:  # 'keep others out while we drain' (re-acquire)\n"
         "                    await wait_through_cancellation(job.done)\n"
         "            else:\n"
         "                await wait_through_cancellation(job.done)\n"),),
        frozenset({"lock-reentered", "stalled"}),
        "the abort path re-acquires the generation lock its own task already holds"),
    Plant("array_crosses_threads", "simple", (
        ("serial.py", "        job = Job(pending, asyncio.get_running_loop().create_future())\n",
         "        job = Job(pending, asyncio.get_running_loop().create_future())\n"
         "        if len(pending.prompt) > 14:  # pre-build the long prompt's prefix on the loop (wrong thread)\n"
         "            import mlx.core as mx\n"
         "            job.prefix = mx.array(pending.prompt[:8]) * 1\n"),
        ("serial.py", "        reach(Point.WORKER_STARTED, rid)\n",
         "        reach(Point.WORKER_STARTED, rid)\n"
         "        if getattr(job, 'prefix', None) is not None:\n"
         "            import mlx.core as mx\n"
         "            mx.eval(job.prefix)\n")),
        frozenset({"mlx-no-stream"}),
        "an MLX array built on the event loop thread is evaluated on the owner thread"),
    Plant("worker_on_pool_thread", "simple", (
        ("serial.py", "    def post(self, job: Job) -> None:\n        self._inbox.put(job)\n",
         "    def post(self, job: Job) -> None:\n"
         "        if job.pending.params.max_tokens > 8:  # long generations go to a pool (wrong thread)\n"
         "            self.loop.run_in_executor(None, self._run, job)\n"
         "        else:\n"
         "            self._inbox.put(job)\n"),),
        frozenset({"mlx-off-owner", "mlx-concurrent", "mlx-no-stream"}),
        "long generations are dispatched to whatever executor thread is free"),
    Plant("shutdown_leaves_waiters", "batched", (
        ("frontend.py", "        await self._wait_streams_ended(grace_s)\n"
                        "        for stream in list(self._streams.values()):\n"
                        "            stream.abort()\n"
                        "        await self._wait_streams_ended(max(grace_s, 1.0))\n", ""),
        ("frontend.py", "        for stream in list(self._streams.values()):\n"
                        "            stream.push_terminal_if_open(\"the engine shut down\")\n", ""),
        ("batched.py", "        for active in list(self._active.values()):\n"
                       "            rid = active.pending.rid\n", "        for active in []:\n"
                                                                 "            rid = active.pending.rid\n")),
        frozenset({"shutdown-left-waiter", "stalled"}),
        "shutdown stops the owner without ending the requests in the batch"),
    Plant("abort_lost_between_sections", "batched", (
        ("batched.py", "            if pending.rid in aborts:\n",
         "            if False:  # aborts only look at requests already decoding (wrong)\n"),
        ("batched.py", "            if uid is not None:\n                self._generator.remove([uid])\n",
         "            if uid is not None and self._active[uid].produced > 1:  # not decoding yet: dropped\n"
         "                self._generator.remove([uid])\n")),
        frozenset({"abort-ignored", "abort-completed"}),
        "an abort reaching a request between leaving the inbox and its first decode step is dropped"),
    Plant("double_cancel_releases_slot", "simple", (
        ("drain.py", "    cancelled = False\n    while not done.done():\n        try:\n"
                     "            await asyncio.shield(done)\n        except asyncio.CancelledError:\n"
                     "            cancelled = True\n    if cancelled:\n        raise asyncio.CancelledError()\n",
         "    await asyncio.shield(done)  # a cancel during the drain escapes\n"),),
        frozenset({"slot-freed-early"}),
        "a second cancel, arriving while the first is draining the worker, releases the slot"),
)}

_IMPORT = re.compile(r"^(\s*)(from|import) mlx_invariants\.engine(\.|\b)", re.M)


def plant(name: str, root: Path) -> str:
    """Copy `engine/` into `root` as package `planted_<name>` with the plant's edits; return its name."""
    spec = PLANTS[name]
    package = f"planted_{name}"
    target = root / package
    if package in sys.modules:
        return package
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for source in ENGINE_DIR.glob("*.py"):
        text = _IMPORT.sub(lambda m: f"{m.group(1)}{m.group(2)} {package}{m.group(3)}", source.read_text())
        (target / source.name).write_text(text)
    for file, old, new in spec.edits:
        path = target / file
        text = path.read_text()
        if text.count(old) != 1:
            raise AssertionError(f"plant {name!r} no longer applies: engine/{file} changed near {old.strip()[:60]!r}; "
                                 f"update tests/fuzz/planted.py")
        path.write_text(text.replace(old, new))
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    importlib.import_module(package)
    return package
