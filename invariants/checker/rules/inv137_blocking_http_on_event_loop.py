from __future__ import annotations

from mlx_invariants.checker.model.queries import HTTP_ON_LOOP_MESSAGE
from mlx_invariants.checker.rule import PACKAGE_ONLY, Invalid, Rule, Valid

# An upstream client module, the kind a router or an agent runtime keeps one of: a sync httpx client made once.
_UPSTREAM = {"app/upstream.py": '''
    import httpx


    class Upstream:
        def __init__(self, base):
            self.base = base
            self._client = httpx.Client(timeout=30)

        def list_models(self):
            return self._client.get(f"{self.base}/v1/models").json()["data"]

        def stream(self, body):
            with self._client.stream("POST", f"{self.base}/v1/chat/completions", json=body) as response:
                yield from response.iter_lines()
'''}


class BlockingHttpOnEventLoop(Rule):
    """An `async def` runs on the event loop's one thread: a sync HTTP call made there holds that thread until
    the other end answers, and meanwhile no other request, stream or timer of the server moves. An upstream
    that takes a minute to stream a completion, a registry that is down, a download: each is every client
    of the server waiting. Linters see `requests.get` written in the `async def`; the clients servers keep are
    made once (`self._client = httpx.Client()` in `__init__`) and called from a coroutine through a sync
    method, often of another module, which is where this rule follows them. open-jarvis/OpenJarvis's
    OpenAI-compatible engine streamed completions with a sync `httpx.Client.stream(...)` inside the async
    generator its route iterated (src/openjarvis/engine/_openai_compat.py@2623f9e:173, 217; fixed in 0b14011 with
    an `httpx.AsyncClient`), and its model routes pulled an Ollama model through a sync client with a 600 s
    timeout (src/openjarvis/server/routes.py@c686517:870; fixed in d865b4b); menaje/mlx-serve fetches the image
    URLs of a chat request with `urlopen` in its chat handler (src/mlx_serve/routers/chat.py@a773868:970, graded
    true blind).

    The calls it knows (model/blocking.py): requests' and httpx's request functions, `urllib.request.urlopen`,
    and the request methods of `requests.Session`, `httpx.Client`, `urllib3.PoolManager` and
    `http.client.HTTP(S)Connection` objects, typed as the package model types receivers (an attribute its
    class assigns, a local, a `with httpx.Client() as client:` target, an annotated parameter). Not judged,
    as INV130 leaves its waits: start-up and teardown coroutines (a lifespan, an `async def` named for starting,
    loading or shutting down), a coroutine on an event loop of its own, the arm of a mode `if` whose other arm
    hands the work to a thread, set-up a start-up hook has run, tests, scripts and command lines, a call reached
    through a constructor or a model load, and a callable handed to a thread."""

    id = "INV137"
    catches = "a sync HTTP call (requests, httpx.Client, urllib) in an async def, itself or through the package's sync calls"
    message = HTTP_ON_LOOP_MESSAGE
    known_problems = (
        "A client the model cannot type is not seen: one passed around untyped, kept in a container, or an SDK "
        "built on these libraries (OpenAI's, Anthropic's sync clients). A call the code knows is fast (a local "
        "health probe with a short timeout) is reported all the same: it still holds the loop that long. Like "
        "every rule of the package model, it reads a module only if it mentions MLX or imports from its package "
        "(model/phase.py)."
    )
    # Opt-in: on the HEADs of the 281 repositories mirrored here (issue 23), 53 findings outside tests and benchmark
    # folders in 22 repositories, graded blind by three reviewers: 18 true, 25 arguable, 10 false. The false ones
    # are coroutines of command-line and job scripts under `asyncio.run(main())`, whose loop serves nothing else,
    # which the model cannot tell from a server's (smg serves gRPC on the loop of `asyncio.run(serve_grpc(args))`,
    # private_loops.py); the arguable ones are mostly a cache-miss branch that start-up fills first
    # (transformerlab-api's gallery files, transformerlab/galleries.py@5a8f71e:182), a probe of a local service that
    # answers in milliseconds, or code nothing calls. True: mlx-serve fetching a client's image URL with `urlopen`
    # inside its chat handler (src/mlx_serve/routers/chat.py@a773868:970), omlx's mirror probes from admin routes
    # (omlx/admin/hf_downloader.py@0b0b68c:311), whisper-mlx-api-server's audio download (whisper_api.py@943300b:706).
    default_enabled = False
    triggers = PACKAGE_ONLY

    INVALID = [
        Invalid('''
            import httpx


            def model_card(repo):
                with httpx.Client(timeout=10) as client:
                    return client.get(f"https://huggingface.co/api/models/{repo}").json()


            async def describe(request):
                card = model_card(request["model"])  # expect: INV137
                return {"license": card.get("license")}
        '''),
        Invalid('''
            from fastapi import FastAPI

            from .upstream import Upstream

            app = FastAPI()
            upstream = Upstream("http://127.0.0.1:8080")


            @app.get("/v1/models")
            async def models():
                return {"data": upstream.list_models()}  # expect: INV137
        ''', files=_UPSTREAM),
        Invalid('''
            import httpx


            class Proxy:
                def __init__(self, base):
                    self.base = base
                    self._client = httpx.Client()

                async def stream(self, body):
                    with self._client.stream("POST", f"{self.base}/generate", json=body) as response:  # expect: INV137
                        for line in response.iter_lines():
                            yield line
        '''),
        Invalid('''
            import requests


            def fetch_adapter(url, dest):
                with open(dest, "wb") as out:
                    out.write(requests.get(url, timeout=600).content)


            async def add_adapter(request):
                fetch_adapter(request["url"], "/tmp/adapter.safetensors")  # expect: INV137
                return {"status": "ready"}
        '''),
    ]
    VALID = [
        Valid('''
            import asyncio

            from fastapi import FastAPI

            from .upstream import Upstream

            app = FastAPI()
            upstream = Upstream("http://127.0.0.1:8080")


            @app.get("/v1/models")
            async def models():
                return {"data": await asyncio.to_thread(upstream.list_models)}
        ''', files=_UPSTREAM),
        Valid('''
            import httpx


            class Proxy:
                def __init__(self, base):
                    self.base = base
                    self._client = httpx.AsyncClient()

                async def stream(self, body):
                    async with self._client.stream("POST", f"{self.base}/generate", json=body) as response:
                        async for line in response.aiter_lines():
                            yield line
        '''),
        Valid('''
            import httpx


            async def model_card(repo):
                async with httpx.AsyncClient(timeout=10) as client:
                    return (await client.get(f"https://huggingface.co/api/models/{repo}")).json()


            async def describe(request):
                card = await model_card(request["model"])
                return {"license": card.get("license")}
        '''),
        # Start-up: nothing is served yet, so nothing waits behind the probe.
        Valid('''
            from contextlib import asynccontextmanager

            import requests
            from fastapi import FastAPI


            def upstream_ready(url):
                return requests.get(f"{url}/health", timeout=2).ok


            @asynccontextmanager
            async def lifespan(app):
                if not upstream_ready("http://127.0.0.1:8080"):
                    raise RuntimeError("upstream is down")
                yield


            app = FastAPI(lifespan=lifespan)
        '''),
    ]
