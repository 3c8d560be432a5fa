"""Wait for a worker to finish even while the waiting task is being cancelled."""

from __future__ import annotations

import asyncio


async def wait_through_cancellation(done: asyncio.Future) -> None:
    """Return once `done` is resolved; if cancelled meanwhile (any number of times), re-raise after.

    The caller holds a slot that must outlive the worker: leaving early on the
    first `CancelledError` would free it while the thread is still inside MLX,
    and leaving on the second (a double cancel during the drain) just as badly.
    `BaseException`-level cancellation is caught on purpose; a worker error is
    not ours to raise here, the owner logs it and reports it to the stream.
    """
    cancelled = False
    while not done.done():
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError()
