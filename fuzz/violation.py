"""`Violation`: what an oracle reports. A module of its own so oracle modules beyond `fuzz/oracles.py`
(`fuzz/ownership.py`) can build them while `oracles.ORACLES` lists theirs."""

from __future__ import annotations

from dataclasses import dataclass


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
