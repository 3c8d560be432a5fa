"""Sync calls that block their thread for as long as another thread takes to do something: what
INV130 follows from the event loop.

A call is judged by the qualified name the summary gives its callee, receivers typed as
`collect.py` types them (`self._cond` assigned `threading.Condition()` in the class,
`t = threading.Thread(...)`, a parameter annotated `queue.Queue`), and by its arguments: a
wait with a constant timeout under `_BRIEF` seconds or a `get(block=False)` returns at once.
An awaited call is an asyncio API, never one of these.

Left out, each for what it was on real code (issue 23):
- a `get` from a queue the same def puts back into: a pool of slots checked out and returned in
  one call, whose `get` waits for other holders of a slot, not for a thread that produces (smg's
  RDMA landing ring, grpc_servicer/smg_grpc_servicer/mm_rdma.py@73da68c:250, 334, graded false
  blind);
- a thread's `join`: on a request path it reaps a worker that has just handed over its last
  result (mlx-manager's `gen_thread.join(timeout=1.0)` once the result queue answered,
  backend/mlx_manager/mlx_server/utils/metal.py@b1682f9:60, 120, 128), and a join that waits on
  real work is teardown;
- an executor's `shutdown`: on the loop it ends an engine loop, or a request whose work it has
  already awaited (vllm-mlx's `_engine_loop` drains its step executor in its `finally:`, on
  purpose, vllm_mlx/engine_core.py@4b06de6:268);
- subprocesses and network calls: on the request paths of 25 MLX servers' trees nearly all were
  a `sysctl` probe of a few milliseconds, an admin route's, or a model download on the load
  path, which INV108 leaves to start-up as it leaves loads;
- `time.sleep`: flake8-async reports it in an `async def`, and the ones found through helpers
  were a lazily loaded registry's one-off poll of an orphaned process (opta's
  quantize.py@7a90bcb:405-413, arguable).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from mlx_invariants.checker.model.blocking import last_name
from mlx_invariants.checker.model.scan import dotted

# The kind of the summary's entries for these calls (`Function.waits`), as a finding says it.
THREAD = "a wait on another thread"

# A constant timeout below this returns before anyone notices the loop stood still.
_BRIEF = 0.05

_QUEUES = ("queue.Queue()", "queue.SimpleQueue()", "queue.LifoQueue()", "queue.PriorityQueue()",
           "multiprocessing.Queue()", "multiprocessing.JoinableQueue()")
_JOINABLE = tuple(q for q in _QUEUES if q not in ("queue.SimpleQueue()", "multiprocessing.Queue()"))
_POOLS = ("concurrent.futures.ThreadPoolExecutor()", "concurrent.futures.ProcessPoolExecutor()",
          "concurrent.futures.thread.ThreadPoolExecutor()", "concurrent.futures.process.ProcessPoolExecutor()",
          "multiprocessing.pool.ThreadPool()", "multiprocessing.Pool()")

# (receiver or module, method) -> where the call's timeout is: a position, a keyword (None, None: it has none).
_CALLS: dict[tuple[str, str], tuple[int | None, str | None]] = {
    ("threading.Event()", "wait"): (0, "timeout"),
    ("threading.Condition()", "wait"): (0, "timeout"),
    ("threading.Condition()", "wait_for"): (1, "timeout"),
    ("threading.Barrier()", "wait"): (0, "timeout"),
    ("concurrent.futures.wait", ""): (1, "timeout"),
    ("asyncio.run_coroutine_threadsafe()", "result"): (0, "timeout"),
    **{(queue, "get"): (1, "timeout") for queue in _QUEUES},
    **{(queue, "join"): (None, None) for queue in _JOINABLE},
    **{(f"{pool}.submit()", "result"): (0, "timeout") for pool in _POOLS},
}


# The last names of the calls above: a call named otherwise is none of them, whatever its receiver.
_NAMES = frozenset(method or qual.rpartition(".")[2] for qual, method in _CALLS)


def named(call: ast.Call) -> bool:
    """`call`'s last name is one of the waits' (`wait`, `get`, `result`, ...): worth typing its receiver."""
    return last_name(call.func) in _NAMES


def blocks(qual: str | None, call: ast.Call) -> bool:
    """`call` (of the callee named `qual`) waits on another thread: a wait of the table that does not
    return at once (a constant timeout under `_BRIEF`, a queue's `get(block=False)`)."""
    if not qual:
        return False
    receiver, _, method = qual.rpartition(".")
    found = _CALLS.get((receiver, method)) or _CALLS.get((qual, ""))
    if found is None:
        return False
    if method == "get" and receiver in _QUEUES and _false(_argument(call, 0, "block")):
        return False
    timeout = _argument(call, *found)
    return timeout is None or not _brief(timeout)


def checked_out(call: ast.Call, calls: Iterable[ast.Call]) -> bool:
    """`call` gets a slot from a queue that one of `calls` (its def's) puts back into (`self._free.put(slot)`)."""
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr != "get":
        return False
    receiver = dotted(func.value)
    return receiver is not None and any(
        isinstance(c.func, ast.Attribute) and c.func.attr in ("put", "put_nowait") and dotted(c.func.value) == receiver
        for c in calls)


def _argument(call: ast.Call, position: int | None, keyword: str | None) -> ast.AST | None:
    if keyword is not None:
        for item in call.keywords:
            if item.arg == keyword:
                return item.value
    if position is not None and position < len(call.args) and not any(
            isinstance(a, ast.Starred) for a in call.args[: position + 1]):
        return call.args[position]
    return None


def _false(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def _brief(node: ast.AST | None) -> bool:
    """A constant number of seconds under `_BRIEF`."""
    return isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(
        node.value, bool) and node.value < _BRIEF
