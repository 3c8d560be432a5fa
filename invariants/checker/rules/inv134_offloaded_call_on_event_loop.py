from __future__ import annotations

from mlx_invariants.checker.model.queries import OFFLOADED_ON_LOOP_MESSAGE
from mlx_invariants.checker.rule import PACKAGE_ONLY, Invalid, Rule, Valid

# An audio helper module and an effects route that keeps its decoding off the loop.
_AUDIO = {
    "app/audio.py": '''
        import soundfile


        def load_audio(path):
            return soundfile.read(path)


        def save_audio(samples, path, rate):
            soundfile.write(path, samples, rate)
    ''',
    "app/effects.py": '''
        import asyncio

        from .audio import load_audio, save_audio


        async def apply_effects(source, target, chain):
            samples, rate = await asyncio.to_thread(load_audio, source)
            await asyncio.to_thread(save_audio, chain(samples), target, rate)
    ''',
}
# A backend getter whose first call probes the hardware, and a peek that never builds one.
_BACKENDS = {"app/backends.py": '''
    import time

    _backend = None


    def get_backend():
        global _backend
        if _backend is None:
            time.sleep(2)  # the hardware probe
            _backend = object()
        return _backend


    def peek_backend():
        return _backend
'''}
# A generation stream binding, restored where the generating thread is done with it.
_STREAMS = {"app/streams.py": '''
    _bound = {}


    def restore_streams(saved):
        _bound.clear()
        _bound.update(saved or {})
'''}
# A cheap lookup of a backend's chat-template options.
_TEMPLATES = {"app/templates.py": '''
    def template_kwargs(backend):
        return {"enable_thinking": getattr(backend, "thinking", False)}
'''}
# A model backend got from a getter with no return annotation, unloaded on a thread by an idle timer.
_KEEPWARM = {
    "app/backends.py": '''
        _backend = None


        def get_backend():
            return _backend
    ''',
    "app/keepwarm.py": '''
        import asyncio

        from .backends import get_backend


        async def unload_when_idle(idle_seconds):
            await asyncio.sleep(idle_seconds)
            await asyncio.to_thread(get_backend().unload_model)
    ''',
}
# A transcriber whose streaming route steps its segments on a worker thread.
_TRANSCRIBER = {
    "app/engine.py": '''
        class Transcriber:
            def __init__(self, backend):
                self.backend = backend

            def segments(self, path):
                for segment in self.backend.decode(path):
                    yield segment.text
    ''',
    "app/streaming.py": '''
        import asyncio

        from .engine import Transcriber


        async def stream(transcriber: Transcriber, path):
            segments = transcriber.segments(path)
            while (text := await asyncio.to_thread(next, segments, None)) is not None:
                yield text
    ''',
}


class OffloadedCallOnEventLoop(Rule):
    """A package that hands a call to a thread in one place (`await asyncio.to_thread(load_audio, path)`) has
    said, in its own code, that the call is too slow for the event loop. The same call made inline in another
    coroutine holds the loop for as long as it runs: no other request, stream, health check or timer of that
    loop moves meanwhile. Nothing at that call site says it blocks (the callee names no MLX, no sleep, no
    network call a linter knows), so the evidence this rule uses is the package's own: its handoffs elsewhere.
    jamiepine/voicebox's effects routes decoded and wrote audio with `await asyncio.to_thread(load_audio, ...)`
    while its profile upload called `load_audio` and `save_audio` inline in the route
    (backend/services/profiles.py@b1069b4:133-134, the handoffs in backend/routes/effects.py:199, 204);
    fblissjr/heylookitsanllm's jspace route asked `router_instance.get_provider()` inline, the call that loads
    and warms a model on first use, which its chat routes hand to `asyncio.to_thread`
    (src/heylook_llm/jspace_api.py@4222495:80, the handoff in api.py:648; graded true blind).

    The same call: a function of the package (resolved across its modules as the package model resolves
    calls), a function of a third-party library by its dotted name (`librosa.load`), or a method of an object
    the model cannot type, by its text in one module (`self.pipeline.transcribe` in the methods of one class).
    Handed over: to the default pool, by `asyncio.to_thread`, `run_in_executor(None, ...)` or a package helper
    that forwards its parameter there (a handoff to an executor or a thread of the package's own may be made for
    that thread's sake, not for speed: a stream restore queued behind the work on the one generating thread), inside a lambda handed over (`lambda:
    engine.transcribe(path)`), and a generator stepped on a thread (`to_thread(next, gen)` of `gen =
    engine.stream()`: iterating `engine.stream()` on the loop is then the same work). Only the
    coroutine's own calls are judged, not those of the sync helpers it calls (a helper may make the call only on
    a branch that never runs in service); a handoff in the same function as the inline call is no evidence (`if executor is not None: await loop.run_in_executor(executor,
    f)` / `else: f()` is a mode the function picks, as is a runtime check of the current thread).

    Not judged, as INV130 leaves them: start-up and teardown coroutines (a lifespan, a start-up hook, an `async
    def` named for starting, loading or shutting down), where nothing is being served; the arm of a mode `if`
    whose other arm hands work to a thread; a lazy set-up branch that runs once; tests, benchmarks, scripts and
    command lines, as the call site and as evidence. A call INV108 reports (it reaches blocking MLX) is left to
    it, and one INV138 reports (a model's inference) to that rule."""

    id = "INV134"
    catches = "a call made inline in a serving coroutine that the same package hands to a worker thread elsewhere"
    message = OFFLOADED_ON_LOOP_MESSAGE
    known_problems = (
        "An argument can make the call cheap at one site and slow at the other (`allow_scan=False`, a cache "
        "the same request has just filled): the summary does not compare arguments. "
        "The standard library and builtins are no evidence (`json.dumps`, `shutil.rmtree` and `open` are "
        "offloaded for a large argument in one place and called for a small one in another); a third-party call "
        "can be so too, and an argument that makes the call cheap here (a short clip, a cached entry) is not "
        "seen. A call the model cannot name is not matched, and neither is a method of an untyped object written "
        "differently in another module. Like every rule of the package model, it reads a module only if it "
        "mentions MLX or imports from its package (model/phase.py)."
    )
    # Opt-in: on the HEADs of the 281 repositories mirrored here it made 13 findings outside tests, graded blind
    # (2026-11-29): 2 true (heylookitsanllm's jspace route loading a model inline; Unsloth Studio's /validate
    # running `llama-server --help` through `_effective_parallel_slots`), 9 arguable (a one-row SQLite update on
    # a failure path, one model folder sized once per pull, a cache the same request has just warmed, start-up
    # code the model did not see as such), 2 false (an argument that makes the call a dictionary lookup there:
    # `resolve_local_gguf(base, allow_scan=False)`, `_resolves_to_resident(..., llama_only=True)`). The
    # package's handoff says the call can be slow somewhere, not that it is slow at every call site.
    default_enabled = False
    triggers = PACKAGE_ONLY

    INVALID = [
        Invalid('''
            import asyncio

            import librosa

            from .engine import transcribe


            async def transcribe_file(path):
                audio, _ = await asyncio.to_thread(librosa.load, path, sr=16000)
                return await transcribe(audio)


            async def audio_duration(path):
                audio, rate = librosa.load(path, sr=16000)  # expect: INV134
                return len(audio) / rate
        '''),
        Invalid('''
            from .audio import load_audio, save_audio


            async def upload_sample(profile, source, target):
                samples, rate = load_audio(source)  # expect: INV134
                save_audio(samples, target, rate)  # expect: INV134
                profile.samples.append(target)
        ''', files=_AUDIO),
        Invalid('''
            from .engine import Transcriber


            async def transcribe_all(transcriber: Transcriber, path):
                return [text for text in transcriber.segments(path)]  # expect: INV134
        ''', files=_TRANSCRIBER),
        Invalid('''
            import asyncio

            from .audio import load_audio


            class Service:
                def __init__(self, pipeline):
                    self.pipeline = pipeline

                async def transcribe_file(self, path):
                    audio = await asyncio.to_thread(load_audio, path)
                    return await asyncio.get_running_loop().run_in_executor(
                        None, lambda: self.pipeline.transcribe(audio))

                async def transcribe_websocket(self, websocket):
                    audio = await websocket.receive_bytes()
                    await websocket.send_json(self.pipeline.transcribe(audio))  # expect: INV134
        ''', files=_AUDIO),
        Invalid('''
            from .backends import get_backend


            async def unload(request):
                get_backend().unload_model()  # expect: INV134
                return {"status": "unloaded"}
        ''', files=_KEEPWARM),
        Invalid('''
            import os

            from .hub import download


            def folder_size(path):
                return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


            async def pull(model, dest):
                await download(model, dest)
                return {"model": model, "bytes": folder_size(dest)}  # expect: INV134
        ''', files={"app/hub.py": "async def download(model, dest):\n    pass\n", "app/admin.py": '''
            import asyncio

            from .main import folder_size


            async def disk_usage(path):
                return await asyncio.to_thread(folder_size, path)
        '''}),
    ]
    VALID = [
        Valid('''
            import asyncio

            from . import backends
            from .backends import get_backend


            def current_backend():
                if get_backend is not backends.get_backend:  # a test patched the getter
                    return get_backend()
                return backends.peek_backend()


            async def status():
                return {"loaded": current_backend() is not None}


            async def generate(prompt):
                backend = await asyncio.to_thread(get_backend)
                return backend, prompt
        ''', files=_BACKENDS),
        Valid('''
            import asyncio

            from .audio import load_audio, save_audio


            async def upload_sample(profile, source, target):
                samples, rate = await asyncio.to_thread(load_audio, source)
                await asyncio.to_thread(save_audio, samples, target, rate)
                profile.samples.append(target)
        ''', files=_AUDIO),
        Valid('''
            import contextlib

            from .audio import load_audio


            async def read_sounds(app):
                app.state.chime = load_audio("chime.wav")


            async def init_state(app):
                await read_sounds(app)


            @contextlib.asynccontextmanager
            async def lifespan(app):
                app.state.click = load_audio("click.wav")
                await init_state(app)
                yield
        ''', files=_AUDIO),
        Valid('''
            import asyncio
            import json

            from .audio import load_audio


            async def export_all(records, path):
                samples = await asyncio.to_thread(load_audio, path)
                return samples, await asyncio.to_thread(json.dumps, records)


            async def export_one(record):
                return json.dumps(record)
        ''', files=_AUDIO),
        Valid('''
            import asyncio

            from .audio import load_audio


            class Reader:
                def __init__(self, offload=True):
                    self.offload = offload  # False in the command line tool, which has no other request to serve

                async def read_all(self, paths):
                    samples = []
                    for path in paths:
                        if self.offload:
                            samples.append(await asyncio.to_thread(load_audio, path))
                        else:
                            samples.append(load_audio(path))
                    return samples
        ''', files={"app/audio.py": _AUDIO["app/audio.py"]}),
        Valid('''
            from concurrent.futures import ThreadPoolExecutor

            from .streams import restore_streams


            class Engine:
                def __init__(self):
                    self.worker = ThreadPoolExecutor(max_workers=1)
                    self.saved = None

                async def retire_worker(self):
                    self.worker.submit(restore_streams, self.saved)  # after the work still on that thread

                async def finish_request(self):
                    restore_streams(self.saved)
        ''', files=_STREAMS),
        Valid('''
            import asyncio

            from .templates import template_kwargs


            async def count_tokens(backend, messages):
                return await asyncio.to_thread(lambda: backend.count(messages, **template_kwargs(backend)))


            async def render(backend, messages):
                return backend.render_prompt(messages, **template_kwargs(backend))
        ''', files=_TEMPLATES),
    ]
