"""The environment that injects the MLX sentinel into a process we launch.

`inject/sitecustomize.py` runs at the child's start-up. It finds this package
by the folders named in its configuration, not through PYTHONPATH, so the
child sees exactly one extra folder on its path (the one holding
sitecustomize) and never this venv's site-packages: a third-party server
keeps its own imports, and an editable install (whose folders do not sit
under one parent) works the same as a wheel.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping, Optional

import mlx_invariants
import mlx_invariants.fuzz

INJECT_DIR = Path(__file__).resolve().parent / "inject"
ENV_VAR = "MLX_INVARIANTS_SENTINEL"


def sentinel_env(out: Path, owner: Optional[str], base: Optional[Mapping[str, str]] = None,
                 observe: bool = True, control: Optional[Path] = None) -> dict[str, str]:
    """`base` (default: this process's environment) with the sentinel injected, recording into `out`;
    `observe` adds the drop-in observation (locks, work handed to threads, cancellation); `control` the
    worker switch, whose port the child writes there (fuzz/worker_switch.py)."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(INJECT_DIR), env.get("PYTHONPATH")]))
    packages = [[name, list(module.__path__)] for name, module in (("mlx_invariants", mlx_invariants),
                                                                   ("mlx_invariants.fuzz", mlx_invariants.fuzz))]
    config = {"out": str(out), "owner": owner, "observe": observe, "packages": packages}
    if control is not None:
        config["control"] = str(control)
    env[ENV_VAR] = json.dumps(config)
    return env
