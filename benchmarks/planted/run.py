"""Run the static check, the engine tests and the fuzzer on the planted regressions (regressions.py).

The run is unseen_mutants.py's, reused: one snapshot of the engine, the catalogue's `Runner` with every
layer on every regression, the same table (check / tests / fuzz / killed by) and summary, then one
line: how many of the set the fuzzer killed, and how many any layer did.

The engine tests run per regression are those of the layer it changes (unseen_mutants' CORE_TESTS,
and HTTP_TESTS when it changes engine/http/), handed to the runner as its test selection; the set
itself keeps `killers=()`. The fuzzer drives each regression's declared routes in-process, and for a
regression that changes engine/http/ the same routes behind the copy's own HTTP app (`http-simple`,
served inside the fuzzing child), each with the fuzz budget.

    .venv/bin/python benchmarks/planted/run.py                          # all 20, 40 s of fuzzing per route
    .venv/bin/python benchmarks/planted/run.py --only P05,P17 --fuzz-budget 30
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: unseen_mutants and planted

import unseen_mutants  # noqa: E402
from mlx_invariants.fuzz.adapters.served import SERVED_PREFIX  # noqa: E402
from planted.regressions import CLASSES, REGRESSIONS  # noqa: E402


@dataclass(frozen=True)
class Row:
    """What the shared table shows of a regression: its class (in the operator column), its files, its title."""

    operator: str
    where: str
    change: str


def class_of(regression_id: str) -> str:
    return next(name for name, ids in CLASSES.items() if regression_id in ids)


def row(mutant) -> Row:
    return Row(class_of(mutant.id), ", ".join(path.removeprefix("engine/") for path in mutant.files), mutant.title)


def with_tests(mutant):
    """The regression with the engine tests of the layers it changes as the runner's selection, and, when it
    changes engine/http/, its routes behind the engine's own HTTP app too (`http-simple`: served in the
    fuzzing process, so the engine's points and threads stay in sight), after the plain ones."""
    http = any(path.startswith("engine/http/") for path in mutant.files)
    core = any(not path.startswith("engine/http/") for path in mutant.files)
    tests = (unseen_mutants.CORE_TESTS if core else ()) + (unseen_mutants.HTTP_TESTS if http else ())
    routes = mutant.routes + (tuple(SERVED_PREFIX + route for route in mutant.routes) if http else ())
    return dataclasses.replace(mutant, killers=tuple(f"test:{test}" for test in tests), routes=routes)


def select(only: str) -> list:
    """`--only P01,P05` (or `1,5`), in the set's order; every regression when empty."""
    wanted = [part.strip() for part in only.split(",") if part.strip()]
    unknown = [w for w in wanted if not any(m.matches(w) for m in REGRESSIONS)]
    if unknown:
        raise ValueError(f"no planted regression {', '.join(unknown)}; the ids are P01 to P{len(REGRESSIONS):02d}")
    return [m for m in REGRESSIONS if not wanted or any(m.matches(w) for w in wanted)]


def headline(results, total: int) -> str:
    """Kills out of the whole set (a regression not run counts as not killed)."""
    fuzz = sum(any(o.layer == "fuzz" and o.killed for o in r.outcomes) for r in results)
    killed = sum(r.killed for r in results)
    return f"fuzz kills {fuzz}/{total}, all layers {killed}/{total}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", metavar="IDS", help="comma-separated ids to run (default: all)")
    unseen_mutants.add_layer_options(parser)
    args = parser.parse_args(argv)
    layers = unseen_mutants.chosen_layers(parser, args)
    try:
        chosen = select(args.only)
    except ValueError as exc:
        parser.error(str(exc))
    mutants = [with_tests(m) for m in chosen]
    with tempfile.TemporaryDirectory(prefix="planted-") as tmp:
        repo = unseen_mutants.snapshot(args.repo.resolve(), Path(tmp))
        code, report = unseen_mutants.measure(args, layers, repo, mutants, [row(m) for m in chosen],
                                             kind="class", place="files")
    if code == 0 and report is not None:
        print(f"\n{headline(report.results, len(chosen))}")
    return code


if __name__ == "__main__":
    sys.exit(main())
