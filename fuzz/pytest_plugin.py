"""pytest plugin (entry point `mlx_invariants`): the `mlx_fuzz` and `mlx_sentinel` fixtures, the
`--fuzz-reports` option, and the ci/runner profiles.

Loaded by pytest in every project that installs mlx-invariants, with or
without the fuzz extra, so it imports nothing heavy until a test asks for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("mlx-invariants").addoption(
        "--fuzz-reports", metavar="DIR", default=None,
        help="where the mlx_fuzz fixture writes its run folders (default: fuzz-reports under the rootdir)")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Register the profiles before Hypothesis's own plugin loads `--hypothesis-profile`."""
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        return
    from mlx_invariants.errors import UsageError
    from mlx_invariants.fuzz.profiles import register_hypothesis_profiles

    try:
        register_hypothesis_profiles()
    except UsageError as exc:  # MLX_INVARIANTS_FUZZ_DB names a Redis server, and the redis client is missing
        raise pytest.UsageError(str(exc)) from None


@pytest.fixture
def mlx_fuzz(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """`mlx_fuzz(engine, **settings)`: fuzz `engine` (a factory function, "module:function", a route, a
    server command with {port}, a URL or a Target) with `fuzz.api.fuzz_engine`; returns the `FuzzResult`.

    Reports go to `--fuzz-reports` (default: fuzz-reports under the rootdir) unless `report_dir=` is
    given. A finding fails the test with no traceback: the headline, the shrunk scenario, the report
    path and a replay command that works when pasted.
    """
    def fuzz(engine: Any, **overrides: Any) -> Any:
        from mlx_invariants.fuzz.api import FuzzFailure, fuzz_engine

        reports = request.config.getoption("fuzz_reports") or Path(request.config.rootpath) / "fuzz-reports"
        overrides.setdefault("report_dir", str(reports))
        try:
            return fuzz_engine(engine, **overrides)
        except FuzzFailure as failure:
            message = str(failure)
        pytest.fail(message, pytrace=False)  # outside the except: no "during handling" traceback
    return fuzz


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
        pytest.fail(distinct_violations(found), pytrace=False)


def distinct_violations(found: list[Any]) -> str:
    """One entry per distinct violation (the fuzz runner's signature: the oracle and the code frames of
    the offending stack, `fuzz.findings.signature`), with how often it happened and the first
    occurrence's stacks, so a loop that raced a hundred times reads as one bug."""
    from mlx_invariants.fuzz.findings import signature

    groups: dict[str, list[Any]] = {}
    for violation in found:
        groups.setdefault(signature(violation), []).append(violation)
    lines = [f"MLX sentinel: {len(groups)} distinct violation(s) ({len(found)} in all)"]
    for number, same in enumerate(groups.values(), 1):
        first = same[0]
        times = f" (x{len(same)})" if len(same) > 1 else ""
        lines.append(f"[{number}] {first.kind}{times}: {first.message}")
        for label, stack in zip(("first", "second"), first.stacks):
            if stack:
                lines.append(f"    {label} stack:")
                lines.extend(f"      {frame}" for frame in stack[-6:])
    return "\n".join(lines)
