"""Where a run's generated faults and arrivals aim, decided once after its baseline: `Aims`.

A fault aimed at a point the target never reaches is never delivered, and its scenario runs fault-free:
a module factory's target takes every point an engine may mark, while a drop-in engine marks only the
points its client sees (zoo/vllm_engines.py: ADMITTED and CHUNK_SENT), so 63 % of the ci scenarios drawn
for an in-process vllm-mlx engine aimed no fault anywhere it went (docs/benchmarks.md, "Time to first
find: the zoo"). So a run aims, in the target's own order (shrinking's):

- at the points the target was given, where they are not its kind's default (`Target.points_given`: a
  test's, or a case file's, which records the points its run aimed at), as they are;
- at every point a server target takes: each is marked by the fuzzer's own HTTP client, for the requests
  it fits (SERVER_STEP while a response is awaited, which a streaming follow-up may never wait for);
- else, of the points an engine marks, at those its adapter declares (an optional `points` beside
  `owner`: `points_of`), else at those its baseline reached (the `point` events of its follow-up, a
  streaming completion on a fresh engine: a point marked only on another path, a plain answer or a
  cancel, is not seen there), and at the client's own points the target takes (a served route's
  BODY_PART) as they are;
- else, none declared or reached, at every point the target takes.

Not the seed corpus's points: the corpus runs inside the first Hypothesis round, after the example
database's failures, and both are drawn through the strategy, which needs its points before either.
The run goes on with its target narrowed to these points, so every case file, report and summary.json
names them, and a run started from one draws what this run drew (a given set is never narrowed again);
the example database is scoped by them too (`fuzz.database.scope_of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

from mlx_invariants.fuzz.scenario import CLIENT_POINTS
from mlx_invariants.fuzz.target import Target

SOURCES = {
    "given": "as the target names them",
    "client": "all of them: the fuzzer's HTTP client marks each",
    "declared": "those its adapter declares",
    "reached": "those the baseline reached",
    "all": "every point the target takes: the baseline reached none of them",
}


@dataclass(frozen=True)
class Aims:
    """The points generated faults and arrivals aim at, where they came from (a key of `SOURCES`), and the
    budget a request whose client goes away may draw (`fuzz.strategies`: `gone_tokens`; 0: not known)."""

    points: tuple[str, ...]
    source: str
    gone_tokens: int = 0

    def describe(self) -> str:
        gone = f"; a gone client's request up to {self.gone_tokens} tokens" if self.gone_tokens else ""
        return f"faults aimed at {', '.join(self.points)} ({SOURCES[self.source]}){gone}"

    def to_json(self) -> dict[str, Any]:
        return {"points": list(self.points), "source": self.source, "gone_tokens": self.gone_tokens}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Aims":
        return cls(tuple(data["points"]), str(data["source"]), int(data.get("gone_tokens") or 0))


def aims_for(target: Target, declared: Optional[Iterable[str]], reached: Iterable[str],
             gone_tokens: int = 0) -> Aims:
    """Where a run on `target` aims, from what its adapter `declared` (None: nothing) and the points its
    baseline `reached`; always some of `target.points`, in their order."""
    if target.points_given:
        return Aims(target.points, "given", gone_tokens)
    if target.kind.http:
        return Aims(target.points, "client", gone_tokens)
    for source, names in (("declared", declared), ("reached", reached)):
        chosen = set(names) if names is not None else set()
        if chosen & (set(target.points) - set(CLIENT_POINTS)):
            points = tuple(p for p in target.points if p in chosen or p in CLIENT_POINTS)
            return Aims(points, source, gone_tokens)
    return Aims(target.points, "all", gone_tokens)
