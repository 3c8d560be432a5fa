"""Oracle for health while an engine stops: a shutting-down or stopped engine must not say it is healthy.

A server being stopped (a rolling deploy, SIGTERM) drains: running requests finish, new ones are refused.
A load balancer or readiness probe that reads its health meanwhile must hear "not ready", or it keeps
sending traffic that can only be refused, and it cannot tell the drain from a healthy server. The
served-route adapter (fuzz/adapters/served.py) reads the app's `/health` over HTTP once the engine's
shutdown has begun and once the engine stopped while the server still listens; the driver records each
reading (`check/stopping-health`) once the shutdown returned.
"""

from __future__ import annotations

from typing import Iterator

from mlx_invariants.fuzz.trace import Trace
from mlx_invariants.fuzz.violation import Violation, ViolationKind, yields


@yields(ViolationKind(
    "health-while-stopping", "The engine's health answered healthy while it was shutting down, or after it "
                             "stopped while its server still listened.",
    exact=True,
    why="Read only after the engine's shutdown had begun (its first steps ran), so the engine was shutting "
        "down whatever the timing: a correct health route says so from the first step.",
    known_problems="Read only by adapters that offer readings (`stopping_health`): the served routes "
                   "(`--engine http-simple`). An in-process route has no health route, and a launched "
                   "server is not shut down by the fuzzer."))
def health_says_stopping(trace: Trace) -> Iterator[Violation]:
    """While an engine drains and once it stopped, its health does not answer healthy."""
    for check in trace.of("check", "stopping-health"):
        if check.info.get("healthy") is True:
            when = "while it drained" if check.info.get("during") == "drain" else "after it stopped"
            yield Violation("health-while-stopping", f"/health answered 200 {when}: the engine was shutting "
                                                     "down, so a readiness probe kept sending it traffic")


STOPPING_ORACLES = (health_says_stopping,)
