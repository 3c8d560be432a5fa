"""Run the real `invariants` CLI in-process on real files in a temporary project."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from mlx_invariants.cli import main

# Bug-shaped code for test_fixtures.py, never tests themselves.
collect_ignore = ["fixtures"]


@dataclass
class Run:
    code: int
    out: str
    err: str

    def lines(self) -> list[str]:
        return self.out.splitlines()

    def json(self) -> list[dict]:
        return json.loads(self.out)

    def rules(self) -> list[str]:
        return [line.split(": ", 1)[1].split(" ", 1)[0] for line in self.lines()]


class Project:
    """A folder with a pyproject.toml; `run(...)` is `invariants ...` with it as the current folder."""

    def __init__(self, root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self._capsys = capsys
        monkeypatch.chdir(root)
        self.config("")

    def write(self, name: str, code: str | bytes) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(code, bytes):
            path.write_bytes(code)
        else:
            path.write_text(textwrap.dedent(code).lstrip("\n"), encoding="utf-8")
        return path

    def config(self, table: str) -> None:
        self.write("pyproject.toml", "[project]\nname = 'demo'\n\n[tool.invariants]\n" + textwrap.dedent(table))

    def run(self, *args: str) -> Run:
        self._capsys.readouterr()
        code = main(list(args))
        captured = self._capsys.readouterr()
        return Run(code, captured.out, captured.err)


@pytest.fixture
def project(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Project:
    root = tmp_path / "project"
    root.mkdir()
    return Project(root, capsys, monkeypatch)


BAD_LOCK = '''
import asyncio


class Engine:
    def __init__(self):
        # Serializes MLX (Metal command buffer) access; not an admission gate.
        self._mlx_lock = asyncio.Lock()

    async def generate(self, step):
        async with self._mlx_lock:
            return await asyncio.to_thread(step)
'''
