from __future__ import annotations

import libcst as cst

from mlx_invariants.checker.names import terminal
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.walker import OWN_BODY_STOP, descendants

_CLOCKS = frozenset({"time.monotonic", "time.time", "time.perf_counter", "time.monotonic_ns", "time.time_ns"})
_CLOCK_NAMES = frozenset(q.rsplit(".", 1)[-1] for q in _CLOCKS)


class StreamDeadlineFromStart(Rule):
    """A streaming response can be long and healthy: a 4000-token answer takes
    minutes, with a chunk every few milliseconds. A timeout that counts from when
    the stream started (`if monotonic() - started >= timeout:` inside the loop
    that relays chunks) kills exactly those streams, mid-answer, while a stream
    that is truly stuck is caught no sooner than by an inactivity timeout. What a
    stream guard should measure is the time since the last chunk. vllm-mlx's
    `_disconnect_guard` aborted every stream at its 300 s request timeout counted
    from the start (server.py@6b41b1a:4358), fixed in 4a8d94b by an inactivity
    timeout reset on every chunk. vmlx's `_stream_with_keepalive` did the same
    with its 300 s request default (vmlx_engine/server.py@82c3aa2:4432), cutting
    long generations with "[Generation interrupted]" (its issue #31); 8aacbffe
    passed the request's own timeout instead, still counted from the start."""

    id = "INV123"
    # Opt-in (a policy): reviewers graded its 3 findings on ten MLX servers not studied here arguable, each a
    # documented whole-request cap; the cut-off long stream is real (vmlx #31), but whether a cap is total is the server's call.
    default_enabled = False
    catches = "a streaming loop that times out from the stream's start instead of from its last chunk"
    message = (
        "this deadline counts from `{start}`, set once before the stream loop: a long but productive stream is "
        "cut off when it reaches it; time the gap since the last chunk instead (reset `{start}` on every chunk)"
    )
    known_problems = (
        "Looks at generators (a def with `yield`) only, at a comparison in a loop of it that subtracts a "
        "name from a clock call (`time.monotonic()`, `time.time()`, `time.perf_counter()`) where the name "
        "is assigned in the def but never inside that loop. A deliberate cap on a stream's total duration "
        "is flagged too; suppress it there."
    )
    triggers = (("yield",), ("monotonic", "time()", "perf_counter"))

    INVALID = [
        Invalid('''
            import time

            async def disconnect_guard(chunks, timeout):
                started = time.monotonic()
                async for chunk in chunks:
                    if time.monotonic() - started >= timeout:  # expect: INV123
                        raise TimeoutError("stream took too long")
                    yield chunk
        '''),
    ]
    VALID = [
        Valid('''
            import time

            async def disconnect_guard(chunks, timeout):
                last_chunk_at = time.monotonic()
                async for chunk in chunks:
                    if time.monotonic() - last_chunk_at >= timeout:
                        raise TimeoutError("no output for too long")
                    last_chunk_at = time.monotonic()
                    yield chunk
        '''),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if terminal(node.func) in _CLOCK_NAMES:
            self.ctx.resolve(node.func)  # remembered for leave_FunctionDef, where local imports are out of scope

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        body = descendants(node.body, OWN_BODY_STOP)
        if not any(isinstance(n, cst.Yield) for n in body):
            return
        assigned_in_def = {name for n in body for name in _assigned(n)}
        for loop in (n for n in body if isinstance(n, cst.While | cst.For)):
            inside = descendants(loop.body, OWN_BODY_STOP)
            reset = {name for n in inside for name in _assigned(n)}
            for comparison in (n for n in inside if isinstance(n, cst.Comparison)):
                start = self._since(comparison)
                if start and start in assigned_in_def and start not in reset:
                    self.report(comparison, start=start)

    def _since(self, comparison: cst.Comparison) -> str | None:
        """`started` for `time.monotonic() - started` on the left of a comparison."""
        left = comparison.left
        if not (isinstance(left, cst.BinaryOperation) and isinstance(left.operator, cst.Subtract)):
            return None
        clock = left.left
        if not (isinstance(clock, cst.Call) and self.ctx.resolve(clock.func) in _CLOCKS):
            return None
        return left.right.value if isinstance(left.right, cst.Name) else None


def _assigned(node: cst.CSTNode) -> list[str]:
    if isinstance(node, cst.Assign):
        return [t.target.value for t in node.targets if isinstance(t.target, cst.Name)]
    if isinstance(node, cst.AnnAssign | cst.AugAssign) and isinstance(node.target, cst.Name):
        return [node.target.value]
    return []
