"""What one fuzz run spent and saw, summed over every scenario it ran (confirmations and shrinking
included): MLX time and entries, the threads that entered MLX, and how often each oracle fired."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from mlx_invariants.fuzz.oracles import Violation
from mlx_invariants.fuzz.trace import Trace


@dataclass
class RunStatistics:
    mlx_s: float = 0.0                                   # time spent inside MLX
    mlx_calls: int = 0                                   # MLX entries the sentinel saw (a server's included)
    runs: int = 0                                        # scenario runs
    threads: set[str] = field(default_factory=set)       # names of the threads that entered MLX
    counts: Counter[str] = field(default_factory=Counter)   # violating examples per oracle

    def add_run(self, trace: Trace) -> None:
        """One more scenario run, and the MLX spans its trace holds."""
        self.runs += 1
        spans = trace.of("mlx")
        self.mlx_s += sum(span.duration for span in spans)
        self.mlx_calls += len(spans)
        self.threads.update(span.thread_name for span in spans)

    def count(self, violations: list[Violation]) -> None:
        """One violating example: one more for each oracle that fired in it."""
        for kind in {v.kind for v in violations}:
            self.counts[kind] += 1
