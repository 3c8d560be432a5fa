"""Plants of the tests' own: a copy of the reference engine with a few edits, importable by a name, for a test
that shows an oracle or a scenario finds a bug class (the catalogue's and the planted benchmark's mutants are
kept apart from these)."""

from __future__ import annotations

import dataclasses

import pytest

from mlx_invariants.mutants import CATALOGUE
from mlx_invariants.mutants.copies import import_copy
from mlx_invariants.mutants.mutant import Edit


def plant(factory: pytest.TempPathFactory, name: str, route: str, *edits: Edit) -> str:
    """A copy of the engine with `edits`, fuzzed on `route`, importable by the package name returned."""
    base = next(m for m in CATALOGUE if route in m.routes)
    return import_copy(dataclasses.replace(base, id=name, edits=edits, routes=(route,)), factory.mktemp("plants"))
