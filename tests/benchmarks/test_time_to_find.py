"""benchmarks/time_to_find.py hunts what it says (the catalogue's entries with a fuzz killer) and its table's
median counts finds only, shown once more than half the seeds found the bug."""

from __future__ import annotations

from benchmarks.time_to_find import hunted, row


def test_it_hunts_every_entry_the_fuzzer_is_said_to_find_and_only_those():
    from mlx_invariants.mutants.catalogue import CATALOGUE

    ids = {m.id for m in hunted()}
    assert ids == {m.id for m in CATALOGUE if m.finds and m.routes}
    assert "M01-slot-freed-on-cancel" in ids and "M03-worker-error-swallowed-on-cancel" not in ids
    assert [m.id for m in hunted(["M01"])] == ["M01-slot-freed-on-cancel"]


def test_a_row_gives_the_median_of_the_finds_and_each_seed():
    mutant = hunted(["M01"])[0]
    runs = [{"mutant": mutant.id, "profile": "ci", "seed": s, "s": t} for s, t in ((1, 4.0), (2, None), (3, 2.0))]
    runs += [{"mutant": mutant.id, "profile": "runner", "seed": s, "s": t} for s, t in ((1, None), (2, None), (3, 9.0))]
    runs[4]["kind"] = "stalled"  # runner seed 2 stopped at another kind than the entry names
    line = row(mutant, runs, seeds=3)
    assert "| 2/3 | 3.0 | 4.0, miss, 2.0 |" in line and "| 1/3 | - | miss, other: `stalled`, 9.0 |" in line
