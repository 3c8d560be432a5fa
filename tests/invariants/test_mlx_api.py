"""What the checker takes for MLX work by a call's name (checker/mlx_api.py)."""

from __future__ import annotations

import pytest

from mlx_invariants.checker import mlx_api


@pytest.mark.parametrize("text, loads", [
    ("load_model", True),
    ("self.engine.load_model", True),
    ("provider.load_model_with_fallback", True),
    ("reload_model", True),
    ("engine.unload_model", False),       # frees what a load made: `*load_model*` matched it before
    ("self._offload_model_to_disk", False),
    ("load_tokenizer", False),
])
def test_a_call_named_like_a_model_loader_is_a_load_and_one_that_unloads_is_not(text: str, loads: bool) -> None:
    assert mlx_api.named_loader(text) is loads
    assert mlx_api.is_load_name(text, None) is loads  # the package model asks the same question


def test_every_name_of_the_installed_mlx_core_is_known() -> None:
    """A name a newer MLX adds must be listed, or its calls would stop counting as MLX work."""
    core = pytest.importorskip("mlx.core")
    from mlx_invariants.checker.mlx_core_names import CORE_NAMES

    from mlx_invariants.checker.mlx_core_names import SUBMODULE_NAMES

    missing = sorted(n for n in dir(core) if not n.startswith("_") and n not in CORE_NAMES)
    missing += sorted(f"{module}.{n}" for module, names in SUBMODULE_NAMES.items()
                      for n in dir(getattr(core, module)) if not n.startswith("_") and n not in names)
    assert not missing, f"add to invariants/checker/mlx_core_names.py: {missing}"


@pytest.mark.parametrize(("qual", "work"), [
    ("mlx.core.eval", True), ("mlx.core.random.normal", True), ("mlx.core.linalg.norm", True),
    ("mlx.core.time", False), ("mlx.core.get_active_memory", False), ("mlx.core.clear_cache", False),
    ("mlx.core.metal.sync", False), ("mlx.core.random.normal_", False),
])
def test_core_work_is_a_name_mlx_core_has_that_does_array_work(qual: str, work: bool) -> None:
    assert mlx_api.core_work(qual) is work
