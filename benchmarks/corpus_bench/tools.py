"""The checkers compared: this project's `invariants check`, flake8-async, and ruff's asyncio rules.

Each runs once over every materialised file as its own command line would, with no
configuration file of its own read, and its findings come back keyed by file.
flake8-async and ruff live in a throwaway venv at pinned versions, never in the
project's: they are benchmark-only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from corpus_bench.checker_at import CheckerTree

PINS = {"flake8": "7.5.0", "flake8-async": "26.8.1", "ruff": "0.17.6"}
# Ruff: its port of flake8-async (ASYNC) plus RUF006, the one other rule about asyncio
# (a create_task whose result is dropped). Preview-only rules stay off.
RUFF_SELECT = "ASYNC,RUF006"
# flake8-async: every rule except ASYNC9xx, which are opt-in and trio-only (checkpoints).
FLAKE8_SELECT, FLAKE8_IGNORE = "ASYNC", "ASYNC9"
TOOLS = ("invariants", "flake8-async", "ruff")


class ToolError(Exception):
    """A checker could not run, or said something this benchmark cannot read."""


@dataclass(frozen=True, order=True)
class Finding:
    line: int
    rule: str
    message: str


Findings = dict[Path, list[Finding]]


def _run(cmd: list[str], cwd: Path, name: str, env: dict[str, str] | None = None) -> str:
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    except OSError as exc:
        raise ToolError(f"{name}: cannot start {cmd[0]} ({exc.strerror or exc})") from None
    if done.returncode != 0:
        raise ToolError(f"{name} failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")
    return done.stdout


def _collect(pairs: list[tuple[Path, Finding]], paths: list[Path]) -> Findings:
    """Findings by resolved file path; every path asked about is there, with none if none."""
    found: Findings = {p: [] for p in paths}
    for path, finding in pairs:
        found.setdefault(path, []).append(finding)
    return {p: sorted(f) for p, f in found.items()}


def run_invariants(files: list[Path], root: Path, checker: CheckerTree | None = None) -> Findings:
    """`invariants check --format json` of this checkout (or of `checker`'s commit), with the default configuration.

    `files` may name folders too, as on its command line; findings come back by file.
    """
    config = root / "pyproject.toml"
    config.write_text("[tool.invariants]\n", encoding="utf-8")
    args = ["check", "--format", "json", "--no-cache", "-q", "--exit-zero", "--config", str(config), *map(str, files)]
    if checker is None:
        out = _run([sys.executable, "-m", "mlx_invariants", *args], root, "invariants check")
    else:
        out = _run(checker.command(args), root, f"invariants check at {checker.short}",
                   checker.env(dict(os.environ)))
    pairs = [((root / f["path"]).resolve(), Finding(f["line"], f["rule"], f["message"])) for f in json.loads(out)]
    return _collect(pairs, files)


def run_flake8_async(venv: Path, files: list[Path], root: Path) -> Findings:
    out = _run([str(venv / "bin" / "flake8"), "--isolated", "--select", FLAKE8_SELECT, "--extend-ignore",
                FLAKE8_IGNORE, "--asyncio", "--exit-zero", "--format", "%(path)s\t%(row)d\t%(code)s\t%(text)s",
                *map(str, files)], root, "flake8")
    pairs = []
    for line in out.splitlines():
        try:
            path, row, code, text = line.split("\t", 3)
            pairs.append(((root / path).resolve(), Finding(int(row), code, text)))
        except ValueError:
            raise ToolError(f"flake8 printed a line this benchmark cannot read: {line!r}") from None
    return _collect(pairs, files)


def run_ruff(venv: Path, files: list[Path], root: Path) -> Findings:
    out = _run([str(venv / "bin" / "ruff"), "check", "--isolated", "--select", RUFF_SELECT, "--output-format",
                "json", "--no-cache", "--exit-zero", *map(str, files)], root, "ruff")
    pairs = [((root / f["filename"]).resolve(), Finding(f["location"]["row"], f["code"] or "syntax-error", f["message"]))
             for f in json.loads(out)]
    return _collect(pairs, files)


def ensure_venv(venv: Path) -> Path:
    """A venv holding exactly PINS, created (or re-pinned) on first use."""
    stamp = venv / ".corpus-pins"
    wanted = " ".join(f"{name}=={version}" for name, version in PINS.items())
    if stamp.is_file() and stamp.read_text() == wanted:
        return venv
    print(f"installing {wanted} into {venv} ...", file=sys.stderr)
    for cmd in ([sys.executable, "-m", "venv", str(venv)],
                [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *wanted.split()]):
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise ToolError(f"could not set up {venv} for flake8-async and ruff: {done.stderr.strip()[-800:]}; "
                            f"run `{' '.join(cmd)}` by hand, or pass --tools invariants")
    stamp.write_text(wanted)
    return venv


def run(tool: str, files: list[Path], root: Path, venv: Path | None, checker: CheckerTree | None = None) -> Findings:
    """`tool`'s findings in `files`, which are resolved paths under `root` (the working folder);
    the checker of this checkout, or of `checker`'s commit."""
    if not files:
        return {}
    if tool == "invariants":
        return run_invariants(files, root, checker)
    assert venv is not None, "the baselines need their venv"
    return run_flake8_async(venv, files, root) if tool == "flake8-async" else run_ruff(venv, files, root)
