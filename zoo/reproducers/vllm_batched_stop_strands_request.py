"""Standalone reproducer: vllm-mlx's BatchedEngine.stop() leaves a request that was just handed
to it waiting forever.

No fuzzer and no mlx-invariants: plain asyncio and vllm-mlx's public engine API, run by a
python that has vllm-mlx. A non-streaming `generate()` is handed to a started engine, and
the engine is stopped right away (as a server's shutdown does while a request arrives).
After `stop()` returns, every request must end: with its answer, or with an error that
says the engine stopped. The script waits `--wait-s` seconds for the request to end.
Exit status: 1 the request was still waiting, 0 it ended.

    python vllm_batched_stop_strands_request.py --model DIR [--before-stop-s 5]
"""

from __future__ import annotations

import argparse
import asyncio
import sys


async def main_async(args: argparse.Namespace) -> int:
    from vllm_mlx.engine import BatchedEngine

    engine = BatchedEngine(args.model)
    await engine.start()
    await engine.generate(prompt="warm up", max_tokens=2, temperature=0.0)
    request = asyncio.ensure_future(engine.generate(prompt="the owner thread", max_tokens=1, temperature=0.0))
    await asyncio.sleep(args.before_stop_s)  # 0: the request is just handed over when stop() comes
    await engine.stop()
    done, _ = await asyncio.wait({request}, timeout=args.wait_s)
    if done:
        error = request.exception()
        print(f"after stop() the request ended: {'error ' + repr(error) if error else 'answered'}")
        print("ok: stop() left nothing waiting")
        return 0
    request.cancel()
    print(f"after stop() returned, the request was still waiting {args.wait_s:g}s later")
    print("BUG: BatchedEngine.stop() stranded a request that had been handed to it")
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a local mlx-lm model folder")
    parser.add_argument("--wait-s", type=float, default=10.0)
    parser.add_argument("--before-stop-s", type=float, default=0.0,
                        help="the control: a few seconds let the request finish before stop(), and nothing shows")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
