"""The shell command that replays a case file, as it must be printed to work when pasted.

`invariants fuzz --replay FILE` needs no flag (the file names its target),
but the replaying process must be able to import what the target names: a
module factory defined in a user's project (`myproject.fuzzing:make`, or a
test module) is importable in the test run because pytest put its folder on
`sys.path`, and not in a fresh shell. So the command runs this interpreter
(the one with mlx-invariants installed) and, for a module factory outside
site-packages, puts the folder its module is imported from on PYTHONPATH.
"""

from __future__ import annotations

import shlex
import site
import sys
import sysconfig
from pathlib import Path
from typing import Optional

from mlx_invariants.fuzz.target import Target, TargetKind


def replay_shell_command(scenario_path: str | Path, target: Target) -> str:
    """A command line that replays `scenario_path` on `target` from any directory; exits 1 if it reproduces."""
    words = [sys.executable, "-m", "mlx_invariants", "fuzz", "--replay", str(Path(scenario_path).resolve())]
    command = " ".join(shlex.quote(word) for word in words)
    root = factory_root(target)
    return f"PYTHONPATH={shlex.quote(str(root))} {command}" if root is not None else command


def factory_root(target: Target) -> Optional[Path]:
    """The folder a module factory's module is imported from, if a fresh interpreter would not find it
    by itself (anything outside site-packages); None for other targets or an unloaded module."""
    if target.kind is not TargetKind.FACTORY:
        return None
    module_name = target.name.partition(":")[0]
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if path is None:
        return None
    root = Path(path).resolve().parent
    for _ in range(module_name.count(".") + (Path(path).stem == "__init__")):
        root = root.parent
    installed = {Path(p).resolve() for p in (*site.getsitepackages(), sysconfig.get_paths()["purelib"],
                                             sysconfig.get_paths()["platlib"])}
    return None if root in installed else root
