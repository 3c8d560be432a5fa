"""The follow-up request: what it returned, and whether the baseline's own one makes a usable reference.

After every scenario one greedy request (`DriverSettings.followup`) checks
that the engine still serves as a fresh one does. Its outcome is a typed
value compared on what a client can rely on (how it ended, the error code,
the tokens), never on how long it took: two refusals of the same request
are the same answer whatever their timings.

The baseline (a request-free scenario on a fresh engine) gives the reference
outcome. When that reference is not a completed generation, or a launched
server never entered MLX while producing it, nothing the fuzzer compares
afterwards means anything: that is a setup error (exit 2) quoting the
server's words, not a finding against the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from mlx_invariants.fuzz.errors import SetupError
from mlx_invariants.fuzz.trace import Trace


# Refusal codes that mean "busy", not "this request is wrong": an engine busy with nothing running is a bug
# for the oracles to judge, never a setup error.
BUSY_CODES = frozenset({"busy", "429", "503", "overloaded", "queue_full"})


def is_busy(code: Any) -> bool:
    text = str(code or "").lower()
    return text in BUSY_CODES or "busy" in text


@dataclass(frozen=True)
class FollowupOutcome:
    """How the follow-up ended: `kind` (completed, refused, error, aborted, cancelled, crashed, ...),
    the refusal or error `code`, the `tokens` it streamed, and the server's `message` (kept for reports,
    never compared)."""

    kind: str
    code: str = ""
    tokens: tuple[Any, ...] = ()
    message: str = ""

    @classmethod
    def of(cls, end: dict[str, Any], tokens: list[Any]) -> "FollowupOutcome":
        """From a request-end record (`driver.ScenarioRun._client`) and the tokens its client received."""
        kind = str(end.get("outcome", ""))
        message = str(end.get("message") or end.get("error") or "")
        return cls(kind, str(end.get("code") or ""), tuple(tokens) if kind == "completed" else (), message)

    @property
    def refused_as_sent(self) -> bool:
        """Refused for what the request is (a model not served, a field rejected: a 4xx or a named code),
        not for being busy or for a server error (a 5xx): the fuzzer's request, not the engine, is wrong."""
        return self.kind == "refused" and not is_busy(self.code) and not (self.code.isdigit()
                                                                          and self.code.startswith("5"))

    def same_as(self, other: "FollowupOutcome") -> bool:
        """The same answer as `other`: how it ended, its code and its tokens."""
        return (self.kind, self.code, self.tokens) == (other.kind, other.code, other.tokens)

    def describe(self) -> str:
        if self.kind == "completed":
            return f"{len(self.tokens)} tokens {list(self.tokens)}"
        said = f": {self.message}" if self.message else ""
        return f"{self.kind}{' ' + self.code if self.code else ''}{said}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "code": self.code, "tokens": list(self.tokens), "message": self.message}

    @classmethod
    def of_trace(cls, trace: Trace) -> Optional["FollowupOutcome"]:
        """The follow-up outcome a scenario's trace recorded, if it ran one."""
        return cls.from_json(trace.meta.get("followup"))

    @classmethod
    def from_json(cls, data: Optional[dict[str, Any]]) -> Optional["FollowupOutcome"]:
        if data is None:
            return None
        return cls(data["kind"], data.get("code", ""), tuple(data.get("tokens", ())), data.get("message", ""))


def reference_of(baseline: Trace, label: str, log_tail: str = "", *, sees_server_mlx: bool = False) -> FollowupOutcome:
    """The baseline's follow-up outcome, the reference every later follow-up is compared with.

    Raises `SetupError` when the engine did not start (or its start did not return in its own bound, timed
    apart from the follow-up's), when that follow-up (a fresh engine with nothing
    else running) was refused for what it is (`refused_as_sent`), or, for a launched server whose MLX calls
    the sentinel records (`sees_server_mlx`), when the server never entered MLX while serving it. A
    follow-up that crashed, failed or was refused as busy is the engine's to answer for: the oracles judge
    the baseline like any scenario.
    """
    tail = f"\nthe server's last log lines:\n{log_tail}" if log_tail else ""
    start = next((c for c in baseline.of("check", "stalled") if c.info.get("why") == "start"), None)
    if start is not None:
        raise SetupError(f"{label}: the engine's first start did not return within {start.info['bound_s']:g}s "
                         f"(its imports, model load and warm-up), so no request was sent{tail}")
    failed = baseline.first("check", "startup-failed")
    if failed is not None:
        raise SetupError(f"{label}: the engine did not start: {failed.info.get('error')}{tail}")
    reference = FollowupOutcome.of_trace(baseline)
    if reference is None:
        raise SetupError(f"{label}: the baseline's follow-up request never ended, so there is nothing to "
                         f"compare later follow-ups with{tail}")
    if reference.refused_as_sent:
        raise SetupError(f"{label}: on a fresh engine with nothing else running, the follow-up request was "
                         f"{reference.describe()}. The fuzzer needs a request the target serves: name the model "
                         f"with --model, the routes with --routes, or add or change body fields with "
                         f"--request-body{tail}")
    if reference.kind == "completed" and sees_server_mlx and not baseline.of("mlx"):
        raise SetupError(f"{label}: the server answered the follow-up but the sentinel saw no MLX call in it: "
                         f"either it does not generate with MLX in the launched process, or the sentinel could "
                         f"not be injected (a server that starts Python with -I or -S, or in a child process "
                         f"the command does not run directly){tail}")
    return reference
