"""The MLX locks the package model infers where none is declared (model/locks.py), and what it needs
from the summaries for them: a model-named call by name, an executor of one worker."""

from __future__ import annotations

import textwrap

from mlx_invariants.checker.config import SHARED_DEFAULTS
from mlx_invariants.checker.model.collect import summarize
from mlx_invariants.checker.model.graph import Package
from mlx_invariants.checker.model.locks import identity
from mlx_invariants.checker.model.summary import EXECUTOR, MODEL, ONE_THREAD, FileSummary

_SHARED = {**SHARED_DEFAULTS}


def _summary(code: str) -> FileSummary:
    return summarize(textwrap.dedent(code).lstrip("\n"), _SHARED)


def _package(files: dict[str, str]) -> Package:
    """A model of `files` ({"app/mod.py": code}, `app/__init__.py` added), every module an entry."""
    files = {"app/__init__.py": "", **files}
    modules = {}
    for path, code in files.items():
        parts = path[:-3].split("/")
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (is_package, code)
    package = Package({m: p for m, (p, _) in modules.items()}, lambda m: _summary(modules[m][1]), _SHARED)
    package.prepare(list(modules))
    return package


_UTILS = """
    import threading

    MLX_LOCK = threading.Lock()
"""


def _holder(cls: str, lock_import: str, lock: str) -> str:
    return f"""
        import mlx.core as mx
        {lock_import}

        class {cls}:
            def __init__(self, model):
                self.model = model

            def process(self, x):
                with {lock}:
                    return self.model(x)
    """


def test_a_lock_two_modules_hold_around_mlx_is_inferred_by_what_it_names() -> None:
    package = _package({
        "app/utils.py": _UTILS,
        "app/stt.py": _holder("Transcriber", "from .utils import MLX_LOCK", "MLX_LOCK"),
        "app/llm.py": _holder("Responder", "from . import utils", "utils.MLX_LOCK"),
    })
    assert list(package.inferred_locks) == ["app.utils:MLX_LOCK"]
    assert package.inferred_locks["app.utils:MLX_LOCK"][1] == [("app.llm", "Responder.process"),
                                                               ("app.stt", "Transcriber.process")]


def test_a_lock_one_module_holds_is_that_modules_own() -> None:
    package = _package({"app/stt.py": """
        import threading

        import mlx.core as mx

        MLX_LOCK = threading.Lock()

        class Transcriber:
            def process(self, x):
                with MLX_LOCK:
                    mx.eval(x)

        def transcribe(x):
            with MLX_LOCK:
                mx.eval(x)
    """})
    assert len({key[1].split(".")[0] for key, fn in package.functions.items() if fn.guards}) == 2
    assert package.inferred_locks == {}


def test_an_instance_lock_is_no_process_wide_lock_but_an_alias_of_one_is() -> None:
    package = _package({
        "app/utils.py": _UTILS,
        "app/stt.py": """
            import threading
            from .utils import MLX_LOCK

            class Own:
                def __init__(self):
                    self._lock = threading.Lock()

                def run(self):
                    with self._lock:
                        pass

            class Shared:
                def __init__(self):
                    self._lock = MLX_LOCK

                def run(self, lock):
                    with self._lock:
                        pass
                    with lock:
                        pass
        """,
    })
    assert identity(package, ("app.stt", "Own.run"), "self._lock") is None
    assert identity(package, ("app.stt", "Shared.run"), "self._lock") == "app.utils:MLX_LOCK"
    assert identity(package, ("app.stt", "Shared.run"), "lock") is None  # a parameter


def test_a_lock_held_only_around_loading_is_no_mlx_lock() -> None:
    loader = """
        from mlx_lm import load
        from .utils import MLX_LOCK

        class {cls}:
            def start(self, path):
                with MLX_LOCK:
                    self.model = load(path)
    """
    package = _package({"app/utils.py": _UTILS, "app/a.py": loader.format(cls="A"), "app/b.py": loader.format(cls="B")})
    assert package.inferred_locks == {}


def test_declared_locks_leave_nothing_to_infer() -> None:
    package = Package({}, lambda m: None, {**_SHARED, "mlx-locks": ["MLX_LOCK"]})
    package.prepare([])
    assert package.mlx_locks == ["MLX_LOCK"] and package.inferred_locks == {}


def test_a_model_named_attribute_call_is_mlx_by_name_and_still_a_call() -> None:
    summary = _summary("""
        import mlx.core as mx

        class Speaker:
            def __init__(self, model, helper):
                self.model = model
                self.helper = Helper()

            def process(self, text):
                self.helper.run(text)
                return self.model.generate(text)

        class Helper:
            def run(self, text):
                pass
    """)
    fn = summary.functions["Speaker.process"]
    assert [(t.kind, t.text) for t in fn.mlx] == [(MODEL, "self.model.generate")]
    assert [c.target for c in fn.calls] == [":Speaker().helper.run", ":Speaker().model.generate"]


def test_an_executor_built_with_one_worker_is_told_apart() -> None:
    summary = _summary("""
        from concurrent.futures import ThreadPoolExecutor

        POOL = ThreadPoolExecutor(4)

        class Engine:
            def __init__(self):
                self._mlx = ThreadPoolExecutor(max_workers=1)

            def run(self, loop, f):
                self._mlx.submit(f)
                POOL.submit(f)
                loop.run_in_executor(self._mlx, f)
    """)
    assert [o.pool for o in summary.functions["Engine.run"].offloads] == [ONE_THREAD, EXECUTOR, ONE_THREAD]
