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
