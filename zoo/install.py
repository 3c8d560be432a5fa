"""Install each zoo recipe into its own venv under a cache folder, never into ours.

The servers pull in torch, transformers and their own mlx-lm pins, which must not meet
the project's venv. uv (itself pinned, bootstrapped with pip into the cache) installs each
recipe's pinned requirements; it is used rather than pip because one recipe needs a
dependency's pin overridden (`--override`), which pip cannot do. A stamp named after the
requirements makes a second install a no-op; `versions.json` in each venv records what
resolved (mlx, mlx-lm, the server), for docs/zoo.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterable

from zoo.recipes import Recipe

UV = "uv==0.13.9"
CHECKOUT = Path(__file__).resolve().parents[1]  # zoo/install.py -> the repository root
CACHE_ENV = "MLX_INVARIANTS_ZOO_CACHE"
REPORTED = ("mlx", "mlx-cpu", "mlx-lm", "mlx-vlm", "torch", "transformers")


class InstallError(Exception):
    """A recipe did not install; the message ends with the log's last lines."""


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "mlx-invariants" / "zoo")


def venv_dir(recipe: Recipe) -> Path:
    return cache_dir() / recipe.venv_name


def stamp(recipe: Recipe) -> Path:
    key = hashlib.sha256(json.dumps([recipe.requirements, recipe.overrides, recipe.in_process]).encode()).hexdigest()[:16]
    return venv_dir(recipe) / f".zoo-installed-{key}"


def installed(recipe: Recipe) -> bool:
    return stamp(recipe).exists()


def _run(argv: list[str], log: Path) -> None:
    with open(log, "ab") as out:
        out.write(f"$ {' '.join(argv)}\n".encode())
        out.flush()
        code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT).returncode
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise InstallError(f"`{' '.join(argv[:4])} ...` exited with {code}; last lines of {log}:\n{tail}")


def uv() -> Path:
    """The pinned uv, in its own small venv in the cache (made on first use)."""
    tools = cache_dir() / ".uv"
    binary = tools / "bin" / "uv"
    if not (tools / f".{UV}").exists():
        tools.parent.mkdir(parents=True, exist_ok=True)
        log = cache_dir() / "uv-install.log"
        _run([sys.executable, "-m", "venv", str(tools)], log)
        _run([str(tools / "bin" / "python"), "-m", "pip", "install", "-q", UV], log)
        (tools / f".{UV}").touch()
    return binary


def install(recipe: Recipe) -> Path:
    """The recipe's venv, installed if its stamp is missing. Raises InstallError."""
    venv = venv_dir(recipe)
    if installed(recipe):
        return venv
    tool = uv()
    log = cache_dir() / f"{recipe.venv_name}.install.log"
    log.write_text("")
    _run([str(tool), "venv", "-q", "--clear", "-p", sys.executable, str(venv)], log)
    argv = [str(tool), "pip", "install", "-p", str(venv / "bin" / "python")]
    if recipe.overrides:
        overrides = venv / "zoo-overrides.txt"
        overrides.write_text("\n".join(recipe.overrides) + "\n")
        argv += ["--override", str(overrides)]
    _run(argv + list(recipe.requirements), log)
    if recipe.in_process:
        if not (CHECKOUT / "pyproject.toml").exists():
            raise InstallError(f"{recipe.name} installs mlx-invariants from a checkout; {CHECKOUT} is not one")
        _run(argv + ["--no-deps", "-e", str(CHECKOUT)], log)
    _run([str(venv / "bin" / "python"), "-c", "import mlx.core as mx; print(mx.default_device())"], log)
    freeze = subprocess.run([str(tool), "pip", "freeze", "-p", str(venv / "bin" / "python")],
                            capture_output=True, text=True, check=True).stdout
    (venv / "versions.json").write_text(json.dumps(resolved(freeze.splitlines(), recipe), indent=1) + "\n")
    stamp(recipe).touch()
    return venv


def resolved(freeze: Iterable[str], recipe: Recipe) -> dict[str, str]:
    """The versions worth reporting out of `pip freeze` lines: the server's and MLX's."""
    wanted = set(REPORTED) | {recipe.package}
    versions = {}
    for line in freeze:
        name, sep, version = line.partition("==")
        if sep and name.strip().lower() in wanted:
            versions[name.strip().lower()] = version.strip()
    return versions


def versions(recipe: Recipe) -> dict[str, str]:
    try:
        return json.loads((venv_dir(recipe) / "versions.json").read_text())
    except (OSError, ValueError):
        return {}
