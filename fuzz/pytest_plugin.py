"""pytest plugin (entry point `mlx_invariants`): the `mlx_sentinel` fixture and the ci/runner profiles.

Loaded by pytest in every project that installs mlx-invariants, with or
without the fuzz extra, so it imports nothing heavy until a test asks for it.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Register the profiles before Hypothesis's own plugin loads `--hypothesis-profile`."""
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        return
    from mlx_invariants.fuzz.profiles import register_hypothesis_profiles

    register_hypothesis_profiles()


@pytest.fixture
def mlx_sentinel() -> Iterator[Any]:
    """A `Sentinel` installed for the test (no owner declared: call `declare_owner()` or set `.owner`).

    The test fails if, by its end, two threads were inside MLX at once, MLX
    was entered off the owner, or MLX raised "There is no Stream".
    """
    from mlx_invariants.fuzz.oracles import mlx_never_concurrent, mlx_only_on_owner, no_stream_errors
    from mlx_invariants.fuzz.sentinel import Sentinel

    sentinel = Sentinel().install()
    try:
        yield sentinel
    finally:
        sentinel.uninstall()
    found = [v for oracle in (mlx_never_concurrent, mlx_only_on_owner, no_stream_errors)
             for v in oracle(sentinel.trace)]
    if found:
        details = "\n".join(f"{v.kind}: {v.message}\n  " + "\n  ".join(v.stacks[-1][-6:]) for v in found)
        pytest.fail(f"MLX sentinel: {len(found)} violation(s)\n{details}", pytrace=False)
