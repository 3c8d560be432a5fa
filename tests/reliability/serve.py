"""Run `invariants serve` in this process with planted faults installed first.

    python -m tests.reliability.serve [--fault JSON]... -- [serve options]

The engine has no runtime switches for faults, and must not get any: this
bootstrap installs them from outside, then hands over to the `invariants`
CLI. The MLX sentinel, when wanted, comes in through fuzz's sitecustomize
injection like in any other child (see `process.py`).

A fault is a JSON object. At a named point (`engine/points.py`):
    {"point": "BEFORE_DECODE", "rid": "chatcmpl-x", "step": 2, "action": "raise"}
or at an mlx-lm entry the engine reaches before any point exists (load, warmup):
    {"call": "mlx_lm:load", "nth": 1, "action": "block"}
`rid`, `step` and `nth` narrow the match (default: any rid, any step, the first
call). "raise" raises RuntimeError there, which the engine must treat as an MLX
error at that spot. "block" holds the thread until the file `gate` exists
(bounded by `max_block_s`, so an abandoned run still ends). Every fault that
fires first creates the file `reached` when one is given, so a test can wait
for it instead of guessing with a sleep.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

POLL_S = 0.01  # how often a blocked fault looks for its gate file


@dataclass
class Fault:
    action: str                     # "raise" or "block"
    point: Optional[str] = None     # a Point member name
    call: Optional[str] = None      # "module:qualname" of an mlx-lm entry
    rid: Optional[str] = None
    step: Optional[int] = None
    nth: int = 1
    gate: Optional[str] = None
    reached: Optional[str] = None
    max_block_s: float = 120.0
    seen: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self) -> bool:
        """Count one matching arrival; True for the one this fault fires on."""
        with self.lock:
            self.seen += 1
            return self.seen == self.nth

    def fire(self, where: str) -> None:
        if self.reached:
            open(self.reached, "w").close()
        if self.action == "raise":
            raise RuntimeError(f"injected fault at {where}")
        deadline = time.monotonic() + self.max_block_s
        while not (self.gate and os.path.exists(self.gate)) and time.monotonic() < deadline:
            time.sleep(POLL_S)


def parse_fault(text: str) -> Fault:
    fields = json.loads(text)
    fault = Fault(**fields)
    if fault.action not in ("raise", "block") or (fault.point is None) == (fault.call is None):
        raise SystemExit(f"bad fault {text!r}: give \"point\" or \"call\", and action raise|block")
    return fault


def install_point_faults(faults: list[Fault]) -> None:
    from mlx_invariants.engine.points import set_hook

    def hook(point: Any, rid: str, info: dict[str, Any]) -> None:
        for fault in faults:
            if (fault.point == point.name and fault.rid in (None, rid)
                    and fault.step in (None, info.get("step")) and fault.take()):
                fault.fire(f"{point.name} of {rid}")

    set_hook(hook)


def install_call_fault(fault: Fault) -> None:
    """Wrap an mlx-lm entry so that its nth call fires the fault before the real call runs."""
    module_name, qualname = fault.call.split(":", 1)
    owner: Any = importlib.import_module(module_name)
    *path, attr = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    original: Callable[..., Any] = getattr(owner, attr)

    @functools.wraps(original)
    def faulty(*args: Any, **kwargs: Any) -> Any:
        if fault.take():
            fault.fire(fault.call)
        return original(*args, **kwargs)

    setattr(owner, attr, faulty)


def main(argv: list[str]) -> int:
    if "--" in argv:
        split = argv.index("--")
        ours, theirs = argv[:split], argv[split + 1:]
    else:
        ours, theirs = argv, []
    parser = argparse.ArgumentParser(prog="python -m tests.reliability.serve")
    parser.add_argument("--fault", action="append", default=[], type=parse_fault, metavar="JSON")
    args = parser.parse_args(ours)
    install_point_faults([f for f in args.fault if f.point])
    for fault in args.fault:
        if fault.call:
            install_call_fault(fault)

    from mlx_invariants.cli import main as invariants

    return invariants(["serve", *theirs])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
