"""`python -m mlx_invariants.mutants.fuzzing ROUTE REPORT_DIR [BUDGET_S]`: the fuzzer's ci profile on one route.

Run as a child with the copy first on PYTHONPATH, so the route of
`mlx_invariants.engine` that `run_fuzz` builds is the copy's. ROUTE is what
`invariants fuzz --engine` takes: `simple`, or `http-simple` for the route behind
the copy's own HTTP app (served in the child, fuzz/adapters/served.py). It prints one
JSON line (the first violation's kind and headline, or none) and exits 0
clean, 1 violation: the parent reads the kind instead of scraping the CLI's
prose. BUDGET_S, when given, replaces the profile's budget and example cap
with that many seconds of wall time.
"""

from __future__ import annotations

import json
import sys

MARK = "MUTANT-FUZZ-RESULT "


def main(argv: list[str]) -> int:
    route, report_dir, *budget = argv
    from mlx_invariants.fuzz.runner import run_fuzz
    from mlx_invariants.fuzz.settings import FuzzSettings
    from mlx_invariants.fuzz.target import Target

    result = run_fuzz(Target.engine(route), FuzzSettings(profile="ci", report_dir=report_dir, replays=0,
                                                          budget_s=float(budget[0]) if budget else None))
    failure = result.failure
    print(MARK + json.dumps({
        "kind": failure.violations[0].kind if failure else None,
        "headline": failure.headline if failure else None,
        "examples": result.examples,
        "seconds": round(result.elapsed_s, 1),
        "report": str(result.report_dir) if result.report_dir else None,
    }), flush=True)
    return 0 if failure is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
