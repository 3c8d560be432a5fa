"""Every exception the fuzzer defines, in one place.

Setup mistakes (a target that names nothing buildable, a setting out of
range, a file that is not a scenario, a server that does not come up) are
`UsageError`s: the console script prints them and exits 2. The others are
signals inside a run: what an adapter or an injected fault raises, and what
the runner raises inside Hypothesis to report a violation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlx_invariants.errors import UsageError

if TYPE_CHECKING:
    from mlx_invariants.fuzz.oracles import Violation
    from mlx_invariants.fuzz.scenario import Scenario
    from mlx_invariants.fuzz.trace import Trace
    from mlx_invariants.fuzz.transport import Answer


class TargetError(UsageError):
    """The target names nothing that can be built (unknown route, unimportable factory, bad server command)."""


class SettingsError(UsageError):
    """A fuzz setting is out of range."""


class ReplayError(UsageError):
    """The file to replay cannot be read as a scenario, or does not say what it ran on."""


class ServerError(UsageError):
    """The server command did not come up, or the URL is not a loopback address."""


class SetupError(UsageError):
    """The target could not be fuzzed at all: its engine did not start on the run's first try."""


class BaselineError(UsageError):
    """The baseline file cannot be read or written, or is not a baseline."""


class Refused(Exception):
    """The engine declined the request before any output (busy, shutting down, invalid); adapters raise it.
    Over HTTP, `answer` says how (the status and the error the server sent)."""

    def __init__(self, code: str, message: str, answer: "Answer | None" = None):
        super().__init__(message)
        self.code = code
        self.answer = answer


class InjectedFault(RuntimeError):
    """The fuzzer's stand-in for an exception raised inside an MLX call."""


class WorkerKilled(BaseException):
    """The fuzzer's "worker-dies" fault: a `BaseException`, so no per-request `except Exception` in the
    worker catches it and it escapes the generation thread's loop, as an uncaught bug there does."""


class LockReentered(RuntimeError):
    """A task tried to acquire an asyncio lock it already holds."""


class SentinelError(RuntimeError):
    """Strict mode refused an MLX entry that would have been concurrent or off the owner thread."""


class ViolationFound(Exception):
    """Raised inside the Hypothesis test; one subclass per violation kind keeps shrinking on that kind."""

    def __init__(self, scenario: "Scenario", trace: "Trace", violations: "list[Violation]"):
        super().__init__(f"{violations[0].kind}: {violations[0].message}")
        self.scenario, self.trace, self.violations = scenario, trace, violations
