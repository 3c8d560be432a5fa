"""The fuzz adapter every in-process engine here shares, against the engines' small public API:

    await engine.start(); engine.stream(text, max_tokens, rid=..., chat=...) -> async iterator of text;
    await engine.shutdown(); engine.status() -> dict; engine.abort(rid) -> bool (optional);
    engine.on_point = hook (optional: the engine marks its worker points with it).

It marks the points a client sees (ADMITTED when a request is handed over, CHUNK_SENT per piece) and
passes the hook on, so each engine marks WORKER_STARTED and BEFORE_DECODE on its own MLX thread.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Callable, Optional

from mlx_invariants.fuzz.adapters.base import Outcome, prompt_text
from mlx_invariants.fuzz.scenario import RequestSpec

from false_alarms._common import RequestAborted


class EngineHandle:
    def __init__(self, adapter: "EngineAdapter", spec: RequestSpec):
        self.adapter, self.rid = adapter, spec.rid
        self.pieces = adapter.engine.stream(prompt_text(spec), spec.max_tokens, rid=spec.rid,
                                            chat=spec.route == "chat")
        self.ended = Outcome("completed", reason="length")

    async def __aiter__(self) -> AsyncIterator[str]:
        index = 0
        try:
            async for piece in self.pieces:
                self.adapter.reach("CHUNK_SENT", self.rid, index=index)
                index += 1
                await asyncio.sleep(0)  # a fault delivered at this chunk lands here
                yield piece
        except RequestAborted as exc:
            self.ended = Outcome("aborted", message=str(exc))
        except Exception as exc:  # EngineClosed, or an MLX error out of the worker: this request failed
            self.ended = Outcome("error", message=f"{type(exc).__name__}: {exc}")

    async def wait_ended(self) -> None:
        async for _ in self:
            pass

    def outcome(self) -> Outcome:
        return self.ended

    def abort(self) -> bool:
        abort = getattr(self.adapter.engine, "abort", None)
        return bool(abort(self.rid)) if abort is not None else False

    async def close(self) -> None:
        await self.pieces.aclose()


class EngineAdapter:
    owner: Optional[str] = None   # no owner promised: MLX belongs to the thread that loaded the model
    busy_bound_s = 5.0            # none of these engines refuses: requests wait their turn

    def __init__(self, name: str, engine: Any):
        self.name, self.engine = name, engine
        self._hook: Optional[Callable[[Any, str, dict], None]] = None

    def set_point_hook(self, hook: Optional[Callable[[Any, str, dict], None]]) -> None:
        self._hook = hook
        self.engine.on_point = hook

    def reach(self, point: str, rid: str, **info: Any) -> None:
        if self._hook is not None:
            self._hook(point, rid, info)

    async def start(self) -> None:
        await self.engine.start()

    async def submit(self, spec: RequestSpec) -> EngineHandle:
        handle = EngineHandle(self, spec)
        self.reach("ADMITTED", spec.rid)
        return handle

    async def shutdown(self) -> None:
        await self.engine.shutdown()

    def status(self) -> dict[str, int]:
        return self.engine.status()

    @property
    def healthy(self) -> bool:
        return bool(getattr(self.engine, "healthy", True))
