"""The checker is clean on this project's own engine, fuzzer and checker."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlx_invariants.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_invariants_check_is_clean_on_this_project(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(ROOT)
    code = main(["check", "engine", "fuzz", "invariants"])
    out = capsys.readouterr().out
    assert code == 0, out
