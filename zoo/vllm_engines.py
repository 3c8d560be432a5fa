"""In-process adapters for vllm-mlx's engines (`SimpleEngine`, `BatchedEngine`), public API only.

`invariants fuzz --engine zoo.vllm_engines:simple` (or `:batched`), run by the python of
a venv that holds both vllm-mlx and mlx-invariants (`bash ci/zoo.sh install
vllm-mlx-simple-inproc` makes one) with the repository root on PYTHONPATH (run.py sets it),
fuzzes the engine without its HTTP server: the fuzzer's own sentinel and drop-in
observation see its threads and locks directly.

Only what vllm-mlx documents as the engine interface (`vllm_mlx.engine.BaseEngine`) is
used: the constructor with a model folder, `start`, `stream_generate`, `stream_chat`,
`generate`, `chat`, `stop` and `get_stats`; nothing private, nothing patched. The engines
mark no points, so faults land where a caller sees them: `ADMITTED` when a request is
handed over and `CHUNK_SENT(k)` when its k-th output arrives, the two the adapter declares
(`points`), so the fuzzer aims at nothing else. vllm-mlx is imported when
an engine starts, so this module imports anywhere.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Optional

from mlx_invariants.fuzz.adapters.base import Outcome, PointHook, prompt_text
from mlx_invariants.fuzz.errors import Refused
from mlx_invariants.fuzz.scenario import RequestSpec

MODEL_ENV = "MLX_INVARIANTS_ZOO_MODEL"  # a local mlx-lm model folder; default: the embedded tiny model


class _Point:
    """A client-side point, shaped like an engine's Point member (the hook reads `.name`)."""

    def __init__(self, name: str):
        self.name = name


class _Output:
    """One request: streamed outputs as they come, or one awaited answer."""

    def __init__(self, adapter: "VllmMlxAdapter", rid: str, stream: Any = None, answer: Optional[asyncio.Task] = None):
        self.adapter, self.rid = adapter, rid
        self.stream, self.answer = stream, answer
        self.finish_reason = ""
        self.error = ""
        self._chunks = 0

    def __aiter__(self) -> "_Output":
        return self

    async def __anext__(self) -> str:
        if self.stream is None:
            raise StopAsyncIteration
        try:
            output = await self.stream.__anext__()
        except StopAsyncIteration:
            raise
        except Exception as exc:  # the engine's own error ends this request; the fuzzer judges how
            self.error = f"{type(exc).__name__}: {exc}"
            raise StopAsyncIteration from None
        self.finish_reason = output.finish_reason if output.finished else self.finish_reason
        self.adapter.reach("CHUNK_SENT", self.rid, index=self._chunks)
        self._chunks += 1
        return output.new_text

    async def wait_ended(self) -> None:
        if self.answer is None:
            async for _ in self:
                pass
            return
        try:
            output = await self.answer
            self.finish_reason = output.finish_reason or ""
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def outcome(self) -> Outcome:
        if self.error:
            return Outcome("error", message=self.error)
        return Outcome("completed", reason=self.finish_reason)

    def abort(self) -> bool:
        return False  # the engine's abort takes its own request id, which the public calls do not return

    async def close(self) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.cancel()
            await asyncio.gather(self.answer, return_exceptions=True)
        if self.stream is not None:
            await self.stream.aclose()


class VllmMlxAdapter:
    """One vllm-mlx engine (`kind` "simple" or "batched") on the model folder `model`."""

    owner = "sticky"        # the first thread into MLX owns it (the engine's generation thread)
    points = ("ADMITTED", "CHUNK_SENT")  # all it reaches (marked here, as a client sees them): faults aim there alone
    busy_bound_s = 5.0

    def __init__(self, kind: str, model: str):
        self.kind, self.model = kind, model
        self.name = f"vllm-mlx {kind}"
        self.engine: Any = None
        self._hook: Optional[PointHook] = None

    def set_point_hook(self, hook: Optional[PointHook]) -> None:
        self._hook = hook

    def reach(self, point: str, rid: str, **info: Any) -> None:
        if self._hook is not None:
            self._hook(_Point(point), rid, info)

    async def start(self) -> None:
        from vllm_mlx.engine import BatchedEngine, SimpleEngine

        self.engine = (SimpleEngine if self.kind == "simple" else BatchedEngine)(self.model)
        await self.engine.start()

    async def submit(self, spec: RequestSpec) -> _Output:
        if self.engine is None:  # a request that arrives after shutdown: this adapter has no engine to hand it to
            raise Refused("stopped", f"{self.name} was shut down")
        text = prompt_text(spec)
        options = {"max_tokens": spec.max_tokens, "temperature": 0.0}
        messages = [{"role": "user", "content": text}]
        if spec.stream:
            stream = (self.engine.stream_chat(messages=messages, **options) if spec.route == "chat"
                      else self.engine.stream_generate(prompt=text, **options))
            handle = _Output(self, spec.rid, stream=stream)
        else:
            call = (self.engine.chat(messages=messages, **options) if spec.route == "chat"
                    else self.engine.generate(prompt=text, **options))
            handle = _Output(self, spec.rid, answer=asyncio.ensure_future(call))
            await asyncio.sleep(0)  # the request is on its way before ADMITTED is reached
        self.reach("ADMITTED", spec.rid)
        return handle

    async def shutdown(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            await engine.stop()

    def status(self) -> dict[str, int]:
        if self.engine is None:
            return {}
        stats = self.engine.get_stats()
        return {"active": int(stats.get("num_running") or 0), "queued": int(stats.get("num_waiting") or 0)}


def _model() -> str:
    if os.environ.get(MODEL_ENV):
        return os.environ[MODEL_ENV]
    from mlx_invariants.engine import tiny_model_path

    return str(tiny_model_path())


def simple() -> VllmMlxAdapter:
    return VllmMlxAdapter("simple", _model())


def batched() -> VllmMlxAdapter:
    return VllmMlxAdapter("batched", _model())
