"""Baseline files: the findings a project has seen and accepted, so only new ones fail a run.

`invariants fuzz --write-baseline FILE` writes one from what a run found;
`--baseline FILE` reads it back (`Finding.to_json()` supplies the entries). It lists signatures (`fuzz.findings.signature`:
the oracle and the engine frames that matter, no line numbers), each with the
headline it was written for so a reviewer sees what was accepted:

```json
{"mlx_invariants_fuzz_baseline": 1,
 "accepted": [{"signature": "slot-freed-early @ serial.py:_close < ...", "headline": "..."}]}
```
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from mlx_invariants.fuzz.errors import BaselineError

FORMAT_KEY = "mlx_invariants_fuzz_baseline"
FORMAT = 1


def load_baseline(path: str | Path) -> frozenset[str]:
    """The signatures `path` accepts; `BaselineError` (exit 2) if it is missing or not a baseline."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BaselineError(f"cannot read the baseline {path}: {exc}") from None
    if not isinstance(data, dict) or data.get(FORMAT_KEY) != FORMAT or not isinstance(data.get("accepted"), list):
        raise BaselineError(f"{path} is not a fuzz baseline (write one with --write-baseline)")
    try:
        return frozenset(str(entry["signature"]) for entry in data["accepted"])
    except (KeyError, TypeError):
        raise BaselineError(f"{path}: every accepted entry needs a signature") from None


def write_baseline(path: str | Path, findings: Iterable[dict], keep: Iterable[str] = ()) -> Path:
    """Accept every finding in `findings` (`Finding.to_json()` objects, as a child process reports them)
    and the signatures in `keep` (e.g. the baseline the run read)."""
    path = Path(path)
    entries = {sig: {"signature": sig, "headline": ""} for sig in keep}
    for finding in findings:
        entries[finding["signature"]] = {"signature": finding["signature"], "oracle": finding["oracle"],
                                         "headline": finding["headline"]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({FORMAT_KEY: FORMAT, "accepted": sorted(entries.values(),
                                                                           key=lambda e: e["signature"])},
                                   indent=2) + "\n")
    except OSError as exc:
        raise BaselineError(f"cannot write the baseline {path}: {exc}") from None
    return path
