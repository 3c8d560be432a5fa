"""Names resolve through imports; async context ends at def, lambda and executor callables."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from mlx_invariants.checker import config
from mlx_invariants.checker.rules import RULES
from mlx_invariants.checker.runner import check_source


def _rules(code: str, *opt_in: str) -> list[tuple[int, str]]:
    """The findings on `code` of the default rules and the opt-in ones named."""
    settings = config.from_table({"select": ["INV", *opt_in]}, Path("."), "test", RULES)
    return [(f.line, f.rule) for f in check_source(textwrap.dedent(code).lstrip("\n"), settings)]


@pytest.mark.parametrize("imports, call", [
    ("import asyncio", "asyncio.wait_for"),
    ("import asyncio as aio", "aio.wait_for"),
    ("from asyncio import wait_for", "wait_for"),
    ("from asyncio import wait_for as wf", "wf"),
    ("from asyncio import tasks", "tasks.wait_for"),
])
def test_every_spelling_of_wait_for_resolves(imports: str, call: str) -> None:
    code = f"""
        {imports}

        async def handle(x):
            return await {call}(x.generate(), timeout=60)
    """
    assert _rules(code, "INV101") == [(4, "INV101")]


def test_a_function_local_import_counts_only_in_its_function() -> None:
    assert _rules("""
        async def handle(x):
            from asyncio import wait_for
            return await wait_for(x.generate(), timeout=60)

        async def other(x, wait_for):
            return await wait_for(x.generate(), timeout=60)
    """, "INV101") == [(3, "INV101")]


def test_a_local_name_shadowing_nothing_is_not_resolved() -> None:
    assert _rules("""
        def wait_for(x, timeout):
            return x

        async def handle(x):
            return await wait_for(x.generate(), timeout=60)
    """) == []


def test_a_module_import_below_the_function_still_counts() -> None:
    assert _rules("""
        async def step(logits):
            mx.eval(logits)

        import mlx.core as mx
    """) == [(2, "INV108")]


@pytest.mark.parametrize("body, flagged", [
    ("mx.eval(logits)", True),
    ("[mx.eval(x) for x in logits]", True),
    ("def run():\n        mx.eval(logits)", False),
    ("run = lambda: mx.eval(logits)", False),
    ("class Later:\n        def run(self):\n            mx.eval(logits)", False),
    ("await asyncio.to_thread(list, (mx.eval(x) for x in logits))", False),
    ("total = sum(mx.eval(x) for x in logits)", True),
    ("await asyncio.to_thread(consume, mx.eval(logits))", True),
])
def test_async_context_ends_at_nested_defs_lambdas_and_executor_callables(body: str, flagged: bool) -> None:
    code = f"""
        import asyncio
        import mlx.core as mx

        async def step(logits, consume):
            {body}
    """
    rules = [rule for _, rule in _rules(code)]
    assert ("INV108" in rules) is flagged, rules


def test_an_async_def_nested_in_a_sync_def_is_async_again() -> None:
    assert _rules("""
        import mlx.core as mx

        def outer():
            async def inner(logits):
                mx.eval(logits)
            return inner
    """) == [(5, "INV108")]


def test_self_attributes_are_keyed_by_class() -> None:
    """Engine._lock is a lock; Other._lock is a pool: only Engine's block is judged a lock."""
    assert _rules("""
        import asyncio
        from concurrent.futures import ThreadPoolExecutor

        class Engine:
            def __init__(self):
                self._worker_lock = asyncio.Lock()

            async def run(self, step):
                async with self._worker_lock:
                    return await asyncio.to_thread(step)

        class Other:
            def __init__(self):
                self._worker_lock = ThreadPoolExecutor()

            async def run(self, step):
                async with self._worker_lock:
                    return await asyncio.to_thread(step)
    """) == [(10, "INV105")]


def test_the_prefilter_sees_through_aliases() -> None:
    """Each rule's trigger words survive `import ... as`: the last part of every name is in the text."""
    assert _rules("""
        from asyncio import wait as settle

        async def start(owner):
            await settle({owner.ready}, timeout=30)
    """, "INV109") == [(4, "INV109")]
    assert _rules("""
        import asyncio as aio
        from mlx.core import eval as force

        async def step(logits):
            force(logits)
    """) == [(5, "INV108")]
