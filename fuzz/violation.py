"""`Violation`: what an oracle reports, and `ViolationKind`: what each kind means, declared by its oracle.

A module of its own so oracle modules beyond `fuzz/oracles.py` (`fuzz/ownership.py`, `fuzz/compute.py`)
can build and declare them while `oracles.ORACLES` lists theirs and `oracles.KINDS` gathers every
declaration. An oracle names the kinds it yields with `@yields(ViolationKind(...), ...)`; `invariants
explain KIND`, docs/fuzz-reference.md's oracle table and the exact kinds (`oracles.EXACT_KINDS`) all come from
those declarations, and tests/fuzz/test_vocabulary.py ties them to every `Violation("kind", ...)` in fuzz/.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, TypeVar


@dataclass(frozen=True)
class Violation:
    kind: str  # kebab-case, e.g. "slot-freed-early"
    message: str
    stacks: tuple[tuple[str, ...], ...] = ()
    rid: str | None = None
    detail: str = ""

    def to_json(self) -> dict:
        return {"kind": self.kind, "message": self.message, "rid": self.rid,
                "stacks": [list(s) for s in self.stacks], "detail": self.detail}

    @classmethod
    def from_json(cls, data: dict) -> "Violation":
        return cls(data["kind"], data["message"], tuple(tuple(s) for s in data.get("stacks", ())),
                   data.get("rid"), data.get("detail", ""))


@dataclass(frozen=True)
class ViolationKind:
    """One kind of violation, as the oracle that yields it declares it.

    `exact`: one sighting fails the run without a replay. Only for a verdict that cannot depend on
    timing: `why` then names the recorded fact no correct engine can produce. Otherwise the finding
    counts once it replays (`fuzz.findings`), and `why` says what the verdict depends on (order
    across threads, timing, leftovers, outputs)."""

    name: str                 # kebab-case, as `Violation.kind`
    doc: str                  # one line: what went wrong
    exact: bool
    why: str
    known_problems: str = ""  # where the oracle is blind or may call a correct engine wrong
    oracle: str = ""          # who yields it, "module.function"; `yields` fills it in

    def __post_init__(self) -> None:
        if not self.doc.strip() or "\n" in self.doc.strip() or not self.why.strip():
            raise ValueError(f"{self.name}: a violation kind needs a one-line doc and a why")


Oracle = TypeVar("Oracle", bound=Callable)


def yields(*kinds: ViolationKind) -> Callable[[Oracle], Oracle]:
    """Declare the kinds an oracle yields: `oracle.kinds`, each naming the oracle."""
    def declare(oracle: Oracle) -> Oracle:
        module = oracle.__module__.rsplit(".", 1)[-1]
        oracle.kinds = tuple(replace(kind, oracle=f"{module}.{oracle.__name__}") for kind in kinds)  # type: ignore[attr-defined]
        return oracle
    return declare


def declared_by(oracle: Callable) -> tuple[ViolationKind, ...]:
    """The kinds `oracle` declared with `@yields` (none if it declared nothing)."""
    return getattr(oracle, "kinds", ())
