"""benchmarks/unseen_mutants.py generates what it says it measures.

A tiny module holds one instance of every operator's pattern, so each operator
must find exactly the lines it names there; on the real engine every operator
must still find a site (else the benchmark quietly measures less), every
mutant must parse and differ from the original, apply through the catalogue's
own `copy_engine`, and one seed must always pick the same sample.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import unseen_mutants as um  # noqa: E402  (the benchmark script, importable once benchmarks/ is on the path)

TOY = """\
import asyncio


class Engine:
    async def close(self, job, loop, ex, stream):
        try:
            await asyncio.shield(job.done)
        except asyncio.CancelledError:
            self.note()
            raise
        finally:
            self.forget(job)
            self.lock.release()
        with self.lock:
            taken = self.inbox
            self.inbox = []
        self.active -= 1
        loop.call_soon_threadsafe(stream.push, taken)
        await asyncio.to_thread(self.parse, job)
        await loop.run_in_executor(ex, self.parse, job)
        return await asyncio.wait_for(stream.ended, 5)
"""
TOY_SITES = {
    "drop-shield": [7],
    "release-early": [13, 16],
    "cancel-swallow": [10],
    "threadsafe-direct": [18],
    "offload-direct": [19, 20],
    "timeout-drop": [21],
    "status-drop": [17],
    "finally-drop": [12, 13],
}


@pytest.fixture(scope="module")
def engine_sites():
    return um.find_sites(REPO / "engine")[0]


def _lines(sites):
    found = {op: [] for op in um.OPERATORS}
    for site in sites:
        found[site.operator].append(site.line)
    return found


def test_each_operator_finds_exactly_its_sites_in_a_toy_module():
    sites, equivalent = um.sites_in(TOY, "engine/toy.py")
    assert _lines(sites) == TOY_SITES
    assert equivalent == 0
    changed = {site.operator: site.mutated for site in sites}
    assert "stream.push(taken)" in changed["threadsafe-direct"] and "call_soon" not in changed["threadsafe-direct"]
    assert "await asyncio.shield" not in changed["drop-shield"]
    assert "wait_for" not in changed["timeout-drop"] and "return await stream.ended" in changed["timeout-drop"]


def test_a_change_that_leaves_the_ast_alone_is_skipped_as_equivalent():
    twice = "def f(lock):\n    lock.release()\n    lock.release()\n"
    sites, equivalent = um.sites_in(twice, "engine/twice.py")
    assert [s.operator for s in sites] == [] and equivalent == 1


def test_every_operator_has_sites_in_the_engine_and_every_mutant_parses_and_differs(engine_sites):
    counts = {op: sum(s.operator == op for s in engine_sites) for op in um.OPERATORS}
    assert all(counts.values()), f"an operator finds nothing in engine/: {counts}"
    for site in engine_sites:
        assert ast.dump(ast.parse(site.mutated)) != ast.dump(ast.parse(site.original)), site.where
    assert len({(s.path, s.mutated) for s in engine_sites}) == len(engine_sites), "one mutant listed twice"


def test_a_mutant_applies_through_the_catalogue_copy(engine_sites, tmp_path):
    from mlx_invariants.mutants.copies import copy_engine

    for index, op in enumerate(um.OPERATORS):
        site = next(s for s in engine_sites if s.operator == op)
        target = tmp_path / f"copy{index}"
        copy_engine(REPO / "engine", target, um.to_mutant(index, site))
        assert (target / site.path.removeprefix("engine/")).read_text() == site.mutated, site.where


def test_the_seed_makes_the_sample_reproducible(engine_sites):
    first = um.sample(engine_sites, 12, seed=5)
    assert first == um.sample(engine_sites, 12, seed=5)
    assert first != um.sample(engine_sites, 12, seed=6)
    assert {s.operator for s in first} == set(um.OPERATORS)  # round-robin: 12 >= 8 operators
    assert len(set(first)) == 12
    assert len(um.sample(engine_sites, 10_000, seed=1)) == len(engine_sites)  # more than there are: all of them


def test_bad_arguments_are_usage_errors(capsys):
    with pytest.raises(SystemExit) as exit_:
        um.main(["--layers", "static,nope"])
    assert exit_.value.code == 2
    assert "--layers" in capsys.readouterr().err


def test_the_fuzz_budget_reaches_the_fuzzer(monkeypatch, tmp_path):
    """`--fuzz-budget` goes through the catalogue's fuzz layer (Settings -> argv -> the child's FuzzSettings)."""
    from types import SimpleNamespace

    import mlx_invariants.fuzz.runner
    from mlx_invariants.mutants import fuzzing, layers
    from mlx_invariants.mutants.workspace import Workspace

    calls = []
    monkeypatch.setattr(layers, "_run", lambda argv, ws, timeout: calls.append(argv) or (0, "", 0.1))
    layers.fuzz(Workspace(tmp_path), layers.Settings(fuzz_budget_s=7.0), 60, "simple")
    child_argv = calls[0][2:]  # after "-m mlx_invariants.mutants.fuzzing"
    ran = []
    done = SimpleNamespace(failure=None, examples=1, elapsed_s=0.1, report_dir=None)
    monkeypatch.setattr(mlx_invariants.fuzz.runner, "run_fuzz", lambda target, settings: ran.append(settings) or done)
    assert fuzzing.main(child_argv) == 0
    assert ran[0].budget_s == 7.0 and ran[0].profile == "ci"
