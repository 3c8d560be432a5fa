"""Turn `--engine simple|batched|MODULE:FACTORY` into an adapter factory.

FACTORY is a zero-argument callable returning either an adapter (anything
with `set_point_hook`, see `fuzz/adapters/base.py`) or an engine with the
reference API (`start`, `submit(Pending)`, `shutdown`, `status`), which is
wrapped in `ReferenceAdapter`. It is called once per scenario: every
scenario gets a fresh engine.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from mlx_invariants.fuzz.adapters.base import Adapter
from mlx_invariants.fuzz.adapters.reference import ReferenceAdapter, reference_engine

AdapterFactory = Callable[[], Adapter]


class EngineSpecError(ValueError):
    """The --engine value names nothing that can be built."""


def resolve_engine(spec: str) -> AdapterFactory:
    if spec in ("simple", "batched"):
        return reference_engine(spec)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise EngineSpecError(f"--engine {spec!r}: use simple, batched or MODULE:FACTORY (e.g. mypkg.fuzzing:make)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EngineSpecError(f"--engine {spec!r}: cannot import {module_name} ({exc}); is it on PYTHONPATH?") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise EngineSpecError(f"--engine {spec!r}: {module_name} has no callable {attr}")

    def make() -> Adapter:
        made: Any = factory()
        if hasattr(made, "set_point_hook"):
            return made
        return ReferenceAdapter(lambda: made, name=spec)
    make.engine_label = spec  # type: ignore[attr-defined]
    return make


def engine_label(factory: AdapterFactory) -> str:
    return getattr(factory, "engine_label", getattr(factory, "__name__", "engine"))
