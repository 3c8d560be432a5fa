"""The package model: per-file summaries, names resolved across modules, reach to MLX, findings."""

from __future__ import annotations

import marshal
import re
import textwrap
from pathlib import Path

from mlx_invariants.checker import config
from mlx_invariants.checker.cache import Cache
from mlx_invariants.checker.config import SHARED_DEFAULTS
from mlx_invariants.checker.model import collect
from mlx_invariants.checker.model.collect import summarize
from mlx_invariants.checker.model.graph import BLOCKING, RUN, Package
from mlx_invariants.checker.model.queries import OFF_OWNER_MESSAGE
from mlx_invariants.checker.model.summary import DEFAULT_POOL, FileSummary
from mlx_invariants.checker.rules import RULES
from mlx_invariants.checker.rules.inv107_mlx_off_owner_thread import MlxOffOwnerThread
from mlx_invariants.checker.runner import check_paths
from tests.invariants.conftest import Project


def _summary(code: str) -> FileSummary:
    return summarize(textwrap.dedent(code).lstrip("\n"), SHARED_DEFAULTS)


def _package(files: dict[str, str]) -> Package:
    """A model of `files` ({"pkg/mod.py": code}), every module an entry."""
    modules = {}
    for path in files:
        parts = path[:-3].split("/")
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (is_package, files[path])
    package = Package({m: p for m, (p, _) in modules.items()}, lambda m: _summary(modules[m][1]))
    package.prepare(list(modules))
    return package


def _check(project: Project) -> list[tuple[str, int, str]]:
    settings = config.load(None, project.root, RULES)
    return [(f.path.rsplit("/", 1)[-1], f.line, f.rule) for f in check_paths(["."], settings).findings]


def test_relative_imports_and_module_level_names_become_references() -> None:
    summary = _summary("""
        from . import engine
        from .engine import Engine as E
        from ..util.helpers import run
        import mlx.core as mx

        ENGINE = E()

        def f():
            engine.generate_all()
            run()
            ENGINE.step()
            mx.eval(1)
    """)
    assert summary.names == {"engine": ".engine", "E": ".engine.Engine", "run": "..util.helpers.run",
                             "mx": "mlx.core", "ENGINE": ".engine.Engine()"}
    f = summary.functions["f"]
    assert [c.target for c in f.calls] == [".engine.generate_all", "..util.helpers.run", ".engine.Engine().step"]
    assert [(t.kind, t.text) for t in f.mlx] == [("block", "mx.eval")]
    assert summary.imports_mlx


def test_self_attributes_are_typed_by_what_the_class_assigns_them() -> None:
    summary = _summary("""
        from .engine import Engine
        from .cache import Cache

        class Handler:
            def __init__(self, cache: Cache | None, other):
                self.engine = Engine()
                self.cache = cache
                self.other = other
                self.maybe = None

            def start(self):
                self.maybe = Engine()
                self.other = Engine()

            def use(self):
                self.engine.run()
                self.other.run()
    """)
    assert summary.classes["Handler"].attrs == {"engine": ".engine.Engine()", "cache": ".cache.Cache()",
                                                "maybe": ".engine.Engine()"}
    # `other` holds an untyped parameter in one method and an Engine in another: unknown, never guessed.
    engine = _summary("""
        class Engine:
            def run(self):
                pass
    """)
    package = Package({"app": True, "app.server": False, "app.engine": False},
                      {"app": FileSummary(), "app.server": summary, "app.engine": engine}.get)
    calls = summary.functions["Handler.use"].calls
    assert [package.callee("app.server", c.target)[0] for c in calls] == [("app.engine", "Engine.run"), None]


def test_a_helper_that_hands_its_callable_parameter_to_a_thread_forwards_it() -> None:
    summary = _summary("""
        import asyncio
        import functools

        class Engine:
            async def run_blocking(self, fn, *args):
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(None, fn, *args)

            async def run_partial(self, work, value):
                return await asyncio.to_thread(functools.partial(work, value))

            async def run_nested(self, func):
                def bound():
                    return func()
                return await asyncio.to_thread(bound)

            async def run_through(self, fn):
                return await self.run_blocking(lambda: fn())
    """)
    offloads = {name: [(o.param, o.pool) for o in fn.offloads] for name, fn in summary.functions.items() if fn.offloads}
    assert offloads == {"Engine.run_blocking": [("fn", DEFAULT_POOL)], "Engine.run_partial": [("work", DEFAULT_POOL)],
                        "Engine.run_nested": [("func", DEFAULT_POOL)]}
    through = summary.functions["Engine.run_through"].calls[0]
    assert through.target == ":Engine().run_blocking" and through.args == ((0, "$fn"),)
    package = Package({"app": True, "app.engine": False}, {"app": FileSummary(), "app.engine": summary}.get)
    package.prepare(["app.engine"])
    assert set(package.forwards[("app.engine", "Engine.run_through")]) == {"fn"}  # through another helper


def test_reach_follows_plain_calls_through_three_modules_and_names_the_chain() -> None:
    package = _package({
        "app/__init__.py": "",
        "app/server.py": """
            from .engine import Engine

            class Handler:
                def __init__(self):
                    self.engine = Engine()

                async def handle(self, prompt):
                    return self.engine.generate_all(prompt)
        """,
        "app/engine.py": """
            from app.kernels import decode

            class Engine:
                def generate_all(self, prompt):
                    return [decode(prompt) for _ in range(4)]
        """,
        "app/kernels.py": """
            import mlx.core as mx

            def decode(tokens):
                out = mx.array(tokens)
                mx.eval(out)
                return out
        """,
    })
    assert package.chain(BLOCKING, (("app.engine", "Engine.generate_all"), RUN)) == [
        "engine.Engine.generate_all", "kernels.decode", "mx.eval"]
    assert package.chain(BLOCKING, (("app.server", "Handler.handle"), RUN)) is None  # async: judged where it calls


def test_offloads_unresolved_calls_and_uniterated_generators_reach_nothing() -> None:
    package = _package({
        "app/__init__.py": "",
        "app/engine.py": """
            import asyncio
            import mlx.core as mx

            def step():
                mx.eval(1)

            def tokens():
                yield step()

            def hands_off():
                asyncio.get_event_loop().run_in_executor(None, step)

            def makes_a_generator():
                gen = tokens()
                return gen

            def unknown(client):
                client.generate()

            def iterates():
                return list(tokens())
        """,
    })
    reached = {name for name in ("hands_off", "makes_a_generator", "unknown", "iterates", "step")
               if package.chain(BLOCKING, (("app.engine", name), RUN))}
    assert reached == {"step", "iterates"}


def test_a_function_that_loads_weights_is_start_up_work(project: Project) -> None:
    project.write("app/__init__.py", "")
    project.write("app/engine.py", """
        import mlx.core as mx
        from mlx_lm import load

        class Engine:
            def prepare(self, path):
                self.model, self.tokenizer = load(path)
                mx.eval(self.model.parameters())

            def warm(self):
                mx.eval(self.model.parameters())
    """)
    project.write("app/server.py", """
        from .engine import Engine

        ENGINE = Engine()

        async def startup(path):
            ENGINE.prepare(path)
            ENGINE.warm()
    """)
    assert _check(project) == [("server.py", 7, "INV108")]


def test_mlx_whispers_transcribe_is_blocking_mlx_across_modules(project: Project) -> None:
    """mlx_api.LIBRARY_TASKS in the package model: a helper that transcribes, called on the loop, is INV108;
    handed to the default pool, INV107."""
    project.write("app/__init__.py", "")
    project.write("app/stt.py", """
        import mlx_whisper

        def transcribe(path):
            return mlx_whisper.transcribe(path)["text"]
    """)
    project.write("app/server.py", """
        import asyncio

        from .stt import transcribe

        async def inline(path):
            return transcribe(path)

        async def pooled(path):
            return await asyncio.to_thread(transcribe, path)
    """)
    assert _check(project) == [("server.py", 6, "INV108"), ("server.py", 9, "INV107")]


def test_a_line_inv108_reports_as_mlx_is_not_reported_again_as_a_models_inference(project: Project) -> None:
    """An MLX model's `generate` on the loop is INV108's (it knows the model is MLX); INV138, which guesses a
    model's inference from the method's name, leaves that line to it, and reports the untyped one beside it."""
    project.write("app/__init__.py", "")
    project.write("app/server.py", """
        from mlx_audio.stt import load

        model = load("mlx-community/parakeet-tdt-0.6b-v2")


        async def transcribe(audio, stt_backend):
            result = model.generate(audio)
            return result.text, stt_backend.transcribe(audio)
    """)
    assert _check(project) == [("server.py", 7, "INV108"), ("server.py", 8, "INV138")]


def test_a_generation_handed_over_under_a_lock_is_inv107_only_where_its_stream_is_the_importing_threads(
        project: Project) -> None:
    """One at a time under a lock, two threads are never in Metal together, the hazard before MLX 0.31.2; from
    0.31.2 a generation library's stream made at import (mlx-lm before 0.31.3) still raises on a pool thread.
    So a project that runs only MLX 0.31.0 has no INV107 there (tts-router, precision set o, graded false and
    arguable blind), and one that admits 0.31.2 with mlx-lm 0.31.2 has (the lock's early release on a cancel is
    INV105's either way)."""
    project.write("app/__init__.py", "")
    project.write("app/engine.py", """
        from mlx_lm import stream_generate

        def generate_text(model, tokenizer, prompt):
            return "".join(response.text for response in stream_generate(model, tokenizer, prompt))
    """)
    project.write("app/server.py", """
        import asyncio

        from .engine import generate_text

        _gen_lock = asyncio.Lock()

        async def complete(model, tokenizer, prompt):
            async with _gen_lock:
                return await asyncio.to_thread(generate_text, model, tokenizer, prompt)
    """)
    project.write("pyproject.toml", """
        [project]
        name = "app"
        dependencies = ["mlx==0.31.0", "mlx-lm==0.31.0"]
    """)
    assert _check(project) == [("server.py", 9, "INV105")]
    project.write("pyproject.toml", """
        [project]
        name = "app"
        dependencies = ["mlx>=0.31.2", "mlx-lm==0.31.2"]
    """)
    assert _check(project) == [("server.py", 9, "INV105"), ("server.py", 9, "INV107")]
    # The same in one file, where the per-file rule sees the generation itself.
    project.write("app/server.py", """
        import asyncio

        from mlx_lm import stream_generate

        _gen_lock = asyncio.Lock()

        def generate_text(model, tokenizer, prompt):
            return "".join(response.text for response in stream_generate(model, tokenizer, prompt))

        async def complete(model, tokenizer, prompt):
            async with _gen_lock:
                return await asyncio.to_thread(generate_text, model, tokenizer, prompt)
    """)
    assert _check(project) == [("server.py", 12, "INV105"), ("server.py", 12, "INV107")]
    project.write("pyproject.toml", """
        [project]
        name = "app"
        dependencies = ["mlx==0.31.0", "mlx-lm==0.31.0"]
    """)
    assert _check(project) == [("server.py", 12, "INV105")]


def test_a_constructor_is_set_up_work(project: Project) -> None:
    """MLX an `__init__` runs (and what it calls) builds the object's own arrays once: INV108 leaves the
    construction out, as it leaves loads out; the object's methods that run MLX are still judged."""
    project.write("app/__init__.py", "")
    project.write("app/cache.py", """
        import mlx.core as mx

        class Rotation:
            def __init__(self, dim):
                self.matrix = self._orthogonal(dim)

            def _orthogonal(self, dim):
                q = mx.linalg.qr(mx.random.normal((dim, dim)), stream=mx.cpu)[0]
                mx.eval(q)
                return q

            def rotate(self, keys):
                out = keys @ self.matrix
                mx.eval(out)
                return out
    """)
    project.write("app/server.py", """
        from .cache import Rotation

        async def handle(keys):
            rotation = Rotation(64)
            return rotation.rotate(keys)
    """)
    assert _check(project) == [("server.py", 5, "INV108")]


def test_a_lifespan_before_its_yield_is_start_up_and_its_shutdown_half_is_judged(project: Project) -> None:
    """checker/startup.py in the package model: the helper's MLX reached from the lifespan's start-up half is
    not reported (nothing is served yet), from its shutdown half and from a route it is; the span survives
    the cache."""
    project.write("app/__init__.py", "")
    project.write("app/probe.py", """
        import mlx.core as mx

        def warm_up(model):
            mx.eval(model(mx.zeros((1, 4))))
    """)
    project.write("app/server.py", """
        from contextlib import asynccontextmanager

        from fastapi import FastAPI

        from .probe import warm_up

        @asynccontextmanager
        async def lifespan(app):
            warm_up(app.state.model)
            yield
            warm_up(app.state.model)

        app = FastAPI(lifespan=lifespan)

        @app.post("/v1/completions")
        async def complete(request):
            warm_up(app.state.model)
    """)
    expected = [("server.py", 11, "INV108"), ("server.py", 17, "INV108")]
    assert _check(project) == expected
    assert _check(project) == expected  # from the cache


def test_a_package_helper_that_forwards_to_the_default_pool_is_a_handoff(project: Project) -> None:
    project.write("app/__init__.py", "")
    project.write("app/runner.py", """
        import asyncio

        async def run_blocking(fn, *args):
            return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
    """)
    project.write("app/engine.py", """
        import mlx.core as mx

        class Engine:
            def generate(self, prompt):
                mx.eval(prompt)
    """)
    project.write("app/server.py", """
        from .engine import Engine
        from .runner import run_blocking

        async def handle(engine: Engine, owner, prompt):
            await run_blocking(engine.generate, prompt)
            await owner.run(engine.generate, prompt)
    """)
    assert _check(project) == [("server.py", 5, "INV107")]


def test_a_handoff_to_the_default_pool_at_start_up_is_not_inv107(project: Project) -> None:
    """A lifespan that preloads a model on a pool thread before its `yield` serves nobody yet: no request's
    MLX can be inside Metal beside it. The same handoff after the `yield` and in a route is reported."""
    project.write("app/__init__.py", "")
    project.write("app/engine.py", """
        import mlx.core as mx

        def preload(model):
            mx.eval(model.parameters())
    """)
    project.write("app/server.py", """
        import asyncio
        from contextlib import asynccontextmanager

        from fastapi import FastAPI

        from .engine import preload

        @asynccontextmanager
        async def lifespan(app):
            await asyncio.to_thread(preload, app.state.model)
            yield
            await asyncio.to_thread(preload, app.state.model)

        app = FastAPI(lifespan=lifespan)

        @app.post("/v1/reload")
        async def reload(request):
            await asyncio.to_thread(preload, app.state.model)
    """)
    assert _check(project) == [("server.py", 12, "INV107"), ("server.py", 18, "INV107")]


def test_work_whose_mlx_all_runs_under_the_packages_mlx_lock_is_not_inv107(project: Project) -> None:
    """Two modules hold one process-wide lock around their MLX (an inferred MLX lock, model/locks.py): handing
    a function whose MLX is all under it to the default pool cannot put two threads in Metal at once. The same
    handoff of a function that runs MLX outside the lock is reported."""
    project.write("app/__init__.py", "")
    project.write("app/utils.py", """
        import threading

        MLX_LOCK = threading.Lock()
    """)
    project.write("app/stt.py", """
        import mlx_whisper

        from .utils import MLX_LOCK

        def transcribe(path):
            with MLX_LOCK:
                return mlx_whisper.transcribe(path)["text"]

        def transcribe_unlocked(path):
            return mlx_whisper.transcribe(path)["text"]
    """)
    project.write("app/llm.py", """
        import mlx.core as mx

        from .utils import MLX_LOCK

        def respond(model, x):
            with MLX_LOCK:
                out = model(x)
                mx.eval(out)
                return out
    """)
    project.write("app/server.py", """
        import asyncio

        from .llm import respond
        from .stt import transcribe, transcribe_unlocked

        async def locked(path):
            return await asyncio.to_thread(transcribe, path)

        async def reply(model, x):
            return await asyncio.to_thread(respond, model, x)

        async def unlocked(path):
            return await asyncio.to_thread(transcribe_unlocked, path)
    """)
    assert [f for f in _check(project) if f[2] == "INV107"] == [("server.py", 13, "INV107")]


def test_handoffs_that_cannot_put_two_threads_in_metal_are_not_inv107(project: Project) -> None:
    """INV107, per file and through the model: an `async def` handed to a thread only makes a coroutine there;
    a def that returns an MLX generator runs none of it; a handoff awaited under an `async with` lock runs one
    at a time; a def that takes the module's lock around all its MLX too. A plain handoff is still reported."""
    project.write("app/__init__.py", "")
    project.write("app/engine.py", """
        import threading

        import mlx.core as mx
        from mlx_lm import load, stream_generate

        _LOAD_LOCK = threading.Lock()

        def embed(model, x):
            out = model(x)
            mx.eval(out)
            return out

        def load_once(path):
            with _LOAD_LOCK:
                return load(path)

        def make_stream(model, tokenizer, prompt):
            return stream_generate(model, tokenizer, prompt)
    """)
    project.write("app/server.py", """
        import asyncio

        from .engine import embed, load_once, make_stream

        class Server:
            def __init__(self):
                self._lock = asyncio.Lock()

            async def _embed_later(self, x):
                return x

            async def locked(self, model, x):
                async with self._lock:
                    return await asyncio.to_thread(embed, model, x)

            async def coroutine(self, x):
                return await asyncio.to_thread(self._embed_later, x)

            async def generator(self, model, tokenizer, prompt):
                return await asyncio.to_thread(make_stream, model, tokenizer, prompt)

            async def load(self, path):
                return await asyncio.to_thread(load_once, path)

            async def plain(self, model, x):
                return await asyncio.to_thread(embed, model, x)
    """)
    assert [f for f in _check(project) if f[2] == "INV107"] == [("server.py", 26, "INV107")]


def test_handoffs_of_defs_of_the_same_file_that_run_no_mlx_there_are_not_inv107(project: Project) -> None:
    """The per-file INV107 alike: the handed def is the file's own (a method, a nested def)."""
    project.write("app/__init__.py", "")
    project.write("app/server.py", """
        import asyncio
        import threading

        import mlx.core as mx
        from mlx_lm import generate, load, stream_generate

        _LOAD_LOCK = threading.Lock()

        def _load_once(path):
            with _LOAD_LOCK:
                return load(path)

        class Server:
            async def _generate(self, model, tokenizer, prompt):
                return await self.owner.run(generate, model, tokenizer, prompt)

            async def coroutine(self, model, tokenizer, prompt):
                return await asyncio.to_thread(self._generate, model, tokenizer, prompt)

            async def generator(self, model, tokenizer, prompt):
                def make():
                    return stream_generate(model, tokenizer, prompt)

                return await asyncio.to_thread(make)

            async def load(self, path):
                return await asyncio.to_thread(_load_once, path)

            async def plain(self, model, x):
                def embed():
                    out = model(x)
                    mx.eval(out)
                    return out

                return await asyncio.to_thread(embed)
    """)
    assert [f for f in _check(project) if f[2] == "INV107"] == [("server.py", 35, "INV107")]


def test_the_model_keeps_inv107s_message() -> None:
    assert OFF_OWNER_MESSAGE == MlxOffOwnerThread.message


def test_a_summary_survives_the_cache_as_plain_values(project: Project) -> None:
    code = """
        import asyncio
        from .engine import Engine

        class Handler:
            def __init__(self):
                self.engine = Engine()

            async def handle(self, prompt):
                for token in self.engine.stream(prompt):
                    await asyncio.to_thread(lambda: self.engine.generate(prompt))
    """
    summary = _summary(code)
    assert FileSummary.from_json(marshal.loads(marshal.dumps(summary.to_json()))) == summary
    project.write("app/__init__.py", "")
    project.write("app/server.py", code)
    project.write("app/engine.py", """
        import mlx.core as mx

        class Engine:
            def stream(self, prompt):
                yield mx.eval(prompt)

            def generate(self, prompt):
                mx.eval(prompt)
    """)
    first = _check(project)
    assert first == [("server.py", 9, "INV108"), ("server.py", 10, "INV107")]
    settings = config.load(None, project.root, RULES)
    again = check_paths(["."], settings)
    assert again.analyzed == 0 and [(f.path.rsplit("/", 1)[-1], f.line, f.rule) for f in again.findings] == first
    stored = marshal.loads(next((project.root / ".invariants_cache").glob("summaries-*")).read_bytes())
    assert summary.to_json() in stored.values()


def test_an_unchanged_rerun_reads_no_summary_and_an_edit_reads_them_back(project: Project, monkeypatch) -> None:
    """Summaries live apart from the results: a re-run of an unchanged package answers from its
    stored findings without reading them; after an edit the others' summaries come from the cache."""
    project.write("app/__init__.py", "")
    project.write("app/server.py", """
        import asyncio
        from .engine import Engine

        async def handle(engine: Engine, prompt):
            await asyncio.to_thread(engine.generate, prompt)
    """)
    project.write("app/engine.py", """
        import mlx.core as mx

        class Engine:
            def generate(self, prompt):
                mx.eval(prompt)
    """)
    first = _check(project)
    assert first == [("server.py", 5, "INV107")]
    summaries = next((project.root / ".invariants_cache").glob("summaries-*"))
    assert len(marshal.loads(summaries.read_bytes())) == 2

    def unread(self: Cache) -> dict:
        raise AssertionError("an unchanged re-run read the summaries")

    with monkeypatch.context() as patched:
        patched.setattr(Cache, "_summaries", unread)
        assert _check(project) == first
    made = []
    patched_summarize = collect.summarize
    monkeypatch.setattr(collect, "summarize", lambda text, *rest: made.append(text) or patched_summarize(text, *rest))
    (project.root / "app/server.py").write_text((project.root / "app/server.py").read_text() + "# edited\n")
    assert _check(project) == first
    assert len(made) == 1 and made[0].endswith("# edited\n")  # engine.py's summary came from the cache
    assert len(marshal.loads(summaries.read_bytes())) == 2  # the old server.py's summary is dropped


def test_the_arm_without_the_worker_survives_the_cache_and_a_per_request_arm_does_not_count(project: Project) -> None:
    """A mode `if` (the server's state) whose other arm hands the work to a thread: its inline arm is
    left alone on the first run and on the cached one; the same arms picked by the request are not."""
    code = """
        import asyncio
        from concurrent.futures import ThreadPoolExecutor
        from .engine import Engine

        POOL = ThreadPoolExecutor(max_workers=1)
        engine = Engine()

        async def by_mode(prompt):
            if POOL is not None:
                return await asyncio.get_running_loop().run_in_executor(POOL, engine.generate, prompt)
            else:
                return engine.generate(prompt)

        async def by_request(prompt, fast):
            if fast:
                return engine.generate(prompt)
            else:
                return await asyncio.get_running_loop().run_in_executor(POOL, engine.generate, prompt)
    """
    summary = _summary(code)
    assert summary.functions["by_mode"].fallbacks == ((12, 12),)
    assert summary.functions["by_request"].fallbacks == ()  # `fast` is the caller's: no mode
    assert FileSummary.from_json(marshal.loads(marshal.dumps(summary.to_json()))) == summary
    project.write("app/__init__.py", "")
    project.write("app/server.py", code)
    project.write("app/engine.py", """
        import mlx.core as mx

        class Engine:
            def generate(self, prompt):
                mx.eval(prompt)
    """)
    first = _check(project)
    assert first == [("server.py", 16, "INV108")]
    settings = config.load(None, project.root, RULES)
    again = check_paths(["."], settings)
    assert again.analyzed == 0 and [(f.path.rsplit("/", 1)[-1], f.line, f.rule) for f in again.findings] == first


def test_a_helper_that_serializes_its_handoff_under_a_lock_is_judged_at_the_helper_not_its_callers() -> None:
    summary = _summary("""
        import asyncio
        import contextlib

        class Engine:
            async def under_lock(self, fn):
                async with self._generation_lock:
                    return await asyncio.to_thread(fn)

            @contextlib.asynccontextmanager
            async def _slot(self):
                async with self._generation_lock:
                    yield

            async def under_slot(self, fn):
                async with self._slot():
                    return await asyncio.to_thread(fn)

            async def bare(self, fn):
                return await asyncio.to_thread(fn)
    """)
    serialized = {name: fn.offloads[0].serialized for name, fn in summary.functions.items() if fn.offloads}
    assert serialized == {"Engine.under_lock": True, "Engine.under_slot": True, "Engine.bare": False}
    package = Package({"app": True, "app.engine": False}, {"app": FileSummary(), "app.engine": summary}.get)
    package.prepare(["app.engine"])
    assert set(package.forwards) == {("app.engine", "Engine.bare")}


def test_storing_into_an_attribute_or_item_does_not_rebind_the_name() -> None:
    summary = _summary("""
        from .engine import Engine

        class Handler:
            def __init__(self):
                self.engine = Engine()

            def use(self, request_id):
                self.active[request_id] = {"state": "running"}
                first, self.last = request_id, request_id
                self.engine.run()
    """)
    assert [c.target for c in summary.functions["Handler.use"].calls] == [":Handler().engine.run"]


def test_the_docs_example_gives_the_output_the_docs_show(project: Project) -> None:
    """docs/checker.md, "The package model": its two files, checked, print its console block."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "checker.md").read_text(encoding="utf-8")
    section = text.split("### The package model", 1)[1].split("\n## ", 1)[0]
    engine, server = re.findall(r"```python\n(.*?)```", section, re.S)[:2]
    console = re.search(r"```console\n\$ invariants check app\n(.*?)```", section, re.S).group(1).splitlines()
    project.write("app/__init__.py", "")
    project.write("app/engine.py", engine)
    project.write("app/server.py", server)
    run = project.run("check", "app")
    assert run.code == 1
    assert run.lines() + run.err.splitlines() == console


def test_the_declared_roles_example_gives_the_output_the_docs_show(project: Project) -> None:
    """docs/checker.md, "Declared roles": its two files, without the declarations (the owner loop's
    INV108 it names) and with its config (the console block: INV125, and the owner loop silent)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "checker.md").read_text(encoding="utf-8")
    section = text.split("### Declared roles", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    engine, server = re.findall(r"```python\n(.*?)```", section, re.S)
    table = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    console = re.search(r"```console\n\$ invariants check app\n(.*?)```", section, re.S).group(1).splitlines()
    undeclared = re.search(r"With only `(select = .*?)` in `pyproject.toml`.*?\(`(app/server\.py:\d+:\d+: INV108) ",
                           section, re.S)
    project.write("app/__init__.py", "")
    project.write("app/engine.py", engine)
    project.write("app/server.py", server)
    (project.root / "pyproject.toml").write_text(f"[tool.invariants]\n{undeclared.group(1)}\n", encoding="utf-8")
    run = project.run("check", "app")
    assert run.code == 1 and [line.split(" ", 2)[:2] for line in run.lines()] == [undeclared.group(2).split(" ")]
    (project.root / "pyproject.toml").write_text(table, encoding="utf-8")
    run = project.run("check", "app")
    assert run.code == 1
    assert run.lines() + run.err.splitlines() == console


def test_a_module_that_becomes_a_package_with_the_same_text_is_modelled_again(project: Project) -> None:
    """The package's stored result is keyed by each module's digest and by whether it is a package: the same
    text as `pkg/eng.py` and as `pkg/eng/__init__.py` resolves `from .helpers import ...` to different modules."""
    project.write("pkg/__init__.py", "")
    project.write("pkg/helpers.py", "import mlx.core as mx\n\n\ndef work(x):\n    return mx.eval(x)\n")
    engine = "from .helpers import work\n\n\nasync def handle(x):\n    return work(x)\n"
    project.write("pkg/eng.py", engine)
    assert project.run("check").rules() == ["INV108"]  # pkg.helpers.work evaluates on the loop
    (project.root / "pkg/eng.py").unlink()
    project.write("pkg/eng/__init__.py", engine)  # now `.helpers` is pkg.eng.helpers, which does not exist
    assert project.run("check").code == 0


def test_modules_in_a_folder_of_benchmarks_or_tests_outside_a_package_serve_no_one(project: Project) -> None:
    """A load generator in `benchmarks/` (no `__init__.py`) blocks only its own loop: no package rule asks it,
    while the same two modules in a folder that serves are judged, and an HTTP client module with an async def
    is an entry once INV137 is asked, though it names neither MLX nor the package."""
    project.config('select = ["INV", "INV137"]\n')
    helpers = """
        import mlx.core as mx

        def step(x):
            mx.eval(x)
            return x
    """
    driver = """
        import requests

        from helpers import step

        async def run_once(x):
            step(x)
            return requests.get("http://127.0.0.1:8080/health", timeout=5).ok
    """
    for folder in ("benchmarks", "tests/load", "service"):
        project.write(f"{folder}/helpers.py", helpers)
        project.write(f"{folder}/run_load.py", driver)
    project.write("service/upstream.py", """
        import httpx

        async def models(base):
            return httpx.get(f"{base}/v1/models").json()
    """)
    assert sorted(_check(project)) == [("run_load.py", 6, "INV108"), ("run_load.py", 7, "INV137"),
                                       ("upstream.py", 4, "INV137")]
