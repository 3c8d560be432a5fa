"""Standalone reproducer: vllm-mlx's SimpleEngine frees its generation slot while a cancelled
stream's step is still running on the generation thread.

No fuzzer and no mlx-invariants: plain asyncio and vllm-mlx's public engine API, run by a
python that has vllm-mlx. A streaming request is cancelled twice while its first step
(the prefill of a long prompt) runs on the engine's generation thread. The first cancel
lands in the await of that step; the engine's `finally` then awaits the stream's close on
the same thread, and the second cancel lands there, so the `async with` that holds the
generation slot unwinds at once. The script then looks, without touching the engine, at
what a caller can see: the request has ended, `get_stats()` reports nothing running, and
yet the generation thread's Python stack (`sys._current_frames()`) is still inside
mlx-lm's generation for the cancelled request. A second request is admitted into that
window. The engine has one generation thread, so the second request's MLX work queues
behind the cancelled step instead of racing it on another thread; what breaks is what the
slot promises: the engine reports itself idle and admits new work while a cancelled
request still computes, and the stream's cleanup (its close, which the engine's `finally`
was awaiting) is no longer covered by the slot. Exit status: 1 the bug shows in at least
one of the tries, 0 it does not.

    python vllm_simple_double_cancel.py --model DIR [--tries 10] [--cancels 1]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading

GENERATION = ("generate_step", "stream_generate", "_step", "_prefill")  # mlx-lm's generation frames


def generation_frames() -> list[str]:
    """Function names of mlx-lm generation frames on any non-main thread, right now."""
    main = threading.main_thread().ident
    found = []
    for ident, frame in sys._current_frames().items():
        if ident == main:
            continue
        while frame is not None:
            if "mlx_lm" in frame.f_code.co_filename and frame.f_code.co_name in GENERATION:
                found.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename.rsplit('/', 2)[-2]})")
            frame = frame.f_back
    return found


async def consume(stream) -> None:
    async for _ in stream:
        pass


async def one_try(engine, prompt: str, delay_s: float, cancels: int) -> bool:
    task = asyncio.ensure_future(consume(engine.stream_generate(prompt=prompt, max_tokens=64, temperature=0.0)))
    await asyncio.sleep(delay_s)           # the first step (prefill) is now running on the generation thread
    task.cancel()
    if cancels == 2:
        await asyncio.sleep(0)             # the first cancel lands; the engine's finally awaits the close
        task.cancel()                      # the second lands in that await
    await asyncio.gather(task, return_exceptions=True)
    stats = engine.get_stats()
    inside = generation_frames()
    follow = asyncio.ensure_future(consume(engine.stream_generate(prompt="hi", max_tokens=2, temperature=0.0)))
    await asyncio.sleep(0)
    admitted = engine.get_stats().get("num_running")
    await follow
    if inside and not stats.get("num_running"):
        print(f"request ended and get_stats() says num_running={stats.get('num_running')}, "
              f"but the generation thread is still in {inside[0]}; the next request was admitted "
              f"(num_running={admitted}) while it ran")
        return True
    return False


async def main_async(args: argparse.Namespace) -> int:
    from vllm_mlx.engine import SimpleEngine

    engine = SimpleEngine(args.model)
    await engine.start()
    try:
        prompt = " ".join(["the owner thread keeps every command buffer to itself"] * 45)
        await consume(engine.stream_generate(prompt=prompt, max_tokens=4, temperature=0.0))  # warm-up
        shown = 0
        for attempt in range(args.tries):
            shown += await one_try(engine, prompt + f" {attempt}", 0.002 * (attempt % 5 + 1), args.cancels)
        print(f"{shown}/{args.tries} tries showed the slot freed while the cancelled step still ran")
        if shown:
            print("BUG: SimpleEngine released its generation slot while a cancelled request was still in MLX")
            return 1
        print("ok: never saw the slot freed under a running step")
        return 0
    finally:
        await engine.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a local mlx-lm model folder")
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--cancels", type=int, choices=(1, 2), default=2,
                        help="1 is the control: a single cancel waits for the step, and nothing shows")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
