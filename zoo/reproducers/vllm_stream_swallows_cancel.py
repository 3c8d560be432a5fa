"""Standalone reproducer: a vllm-mlx stream swallows the cancellation of the task reading it.

No fuzzer and no mlx-invariants: plain asyncio and vllm-mlx's public engine API, run by a
python that has vllm-mlx. A task reads `engine.stream_generate(...)` inside
`asyncio.timeout()`; the timeout expires while the task waits for the next token. asyncio
delivers the timeout as a CancelledError into that wait, and expects it back, to turn it
into TimeoutError. A stream that catches the CancelledError and just ends instead makes the
`async for` finish as if the answer were complete: the caller gets a truncated answer whose
last output has no finish reason, and no TimeoutError. The same happens to any
`task.cancel()` while a stream is awaited (a server cancels the task of a client that has
gone): the cancelled task returns normally. `--engine simple` is the control: SimpleEngine's
stream lets the CancelledError through. Exit status: 1 the cancellation was swallowed in at
least one try, 0 every try ended in TimeoutError.

    python vllm_stream_swallows_cancel.py --model DIR [--engine batched|simple] [--tries 3]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time


async def one_try(engine, timeout_s: float, tokens: int) -> tuple[bool, int, object]:
    """Whether a read cut by asyncio.timeout raised TimeoutError, the outputs it read, and the
    last output's finish reason (None: the answer was not finished)."""
    outputs, last_reason = 0, None
    try:
        async with asyncio.timeout(timeout_s):
            async for output in engine.stream_generate(prompt="tell me a long story about the sea",
                                                       max_tokens=tokens, temperature=0.0):
                outputs += 1
                last_reason = output.finish_reason
    except TimeoutError:
        return True, outputs, last_reason
    return False, outputs, last_reason


async def main_async(args: argparse.Namespace) -> int:
    from vllm_mlx.engine import BatchedEngine, SimpleEngine

    engine = (BatchedEngine if args.engine == "batched" else SimpleEngine)(args.model)
    await engine.start()
    try:
        await engine.generate(prompt="warm up", max_tokens=2, temperature=0.0)
        swallowed = 0
        for attempt in range(args.tries):
            # Each try runs in its own task, so one try's unconsumed cancellation does not touch the next.
            started = time.monotonic()
            timed_out, outputs, reason = await asyncio.ensure_future(one_try(engine, args.timeout_s, args.tokens))
            elapsed = time.monotonic() - started
            if timed_out:
                print(f"try {attempt}: asyncio.timeout({args.timeout_s:g}) raised TimeoutError after {outputs} "
                      f"output(s), {elapsed:.2f}s")
            elif reason is None:
                swallowed += 1
                print(f"try {attempt}: no TimeoutError: the stream just ended after {outputs} output(s), "
                      f"{elapsed:.2f}s, its last output unfinished (finish_reason None)")
            else:
                print(f"try {attempt}: the answer finished ({reason!r}, {outputs} outputs) before the timeout; "
                      "raise --tokens or lower --timeout-s")
            await asyncio.sleep(1.0)  # let the engine settle the aborted request
    finally:
        await engine.stop()
    if swallowed:
        print(f"BUG: {swallowed}/{args.tries} tries: the stream swallowed the CancelledError of its reader "
              "(no TimeoutError; the answer ended early as if complete)")
        return 1
    print("ok: every timed-out read raised TimeoutError")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a local mlx-lm model folder")
    parser.add_argument("--engine", choices=("batched", "simple"), default="batched")
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=0.5)
    parser.add_argument("--tokens", type=int, default=2000, help="max_tokens: more than the timeout lets through")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
