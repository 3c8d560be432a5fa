"""Serve the reference engine over an OpenAI-compatible HTTP API (see docs/http.md).

The engine is started (model loaded, generator built, warmed up) before the
port is opened; a startup failure prints one line and exits 1. SIGTERM or
SIGINT stops admitting, drains for --shutdown-grace seconds, ends what is left
with finish reason "abort", and exits 0.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from mlx_invariants.engine.base import EngineConfig  # loads no MLX; the defaults live in one place

    config = EngineConfig()
    parser.add_argument("--model", metavar="PATH", help="a local mlx-lm model folder (default: the embedded tiny model)")
    parser.add_argument("--engine", choices=["simple", "batched"], default="simple",
                        help="simple: one request at a time; batched: continuous batching (default: simple)")
    parser.add_argument("--admission", choices=["fail-fast", "wait"], default="fail-fast",
                        help="when busy: answer 503 at once, or wait briefly in a bounded queue (default: fail-fast)")
    parser.add_argument("--max-queue", type=int, default=config.max_queue, metavar="N",
                        help="wait mode: requests allowed to wait for the serialized slot (default: %(default)s)")
    parser.add_argument("--max-wait-ms", type=int, default=config.max_wait_ms, metavar="MS",
                        help="wait mode: longest wait before the same 503 (default: %(default)s)")
    parser.add_argument("--max-batch", type=int, default=config.max_batch, metavar="N",
                        help="batched: sequences decoded together (default: %(default)s)")
    parser.add_argument("--pad-prefill", choices=["auto", "on", "off"], default="auto",
                        help="batched: prefill at power-of-two lengths, so a new prompt length builds no new GPU "
                             "kernels mid-stream (default: auto, on where MLX runs on CUDA)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on; 0 picks a free one (default: 8000)")
    parser.add_argument("--shutdown-grace", type=float, default=5.0, metavar="S",
                        help="on SIGTERM/SIGINT, seconds running requests may finish before being aborted (default: 5)")
    parser.add_argument("--stall-timeout", type=float, default=config.stall_timeout_s, metavar="S",
                        help="seconds without owner progress, requests held, before /health says engine_stalled "
                             f"and they fail (default: {config.stall_timeout_s:g})")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                        help="server log level (default: warning)")


def run(args: argparse.Namespace) -> int:
    from mlx_invariants.extras import require

    require("engine", "mlx.core", "mlx_lm", "starlette", "uvicorn")

    import logging
    import os
    import sys

    from mlx_invariants.engine import ENGINES
    from mlx_invariants.engine.base import EngineConfig
    from mlx_invariants.engine.http.server import Server, run_until_stopped

    for name, minimum in (("--max-queue", 0), ("--max-wait-ms", 0), ("--max-batch", 1), ("--port", 0)):
        if getattr(args, name[2:].replace("-", "_")) < minimum:
            print(f"invariants serve: {name} must be at least {minimum}", file=sys.stderr)
            return 2
    if args.stall_timeout <= 0:
        print("invariants serve: --stall-timeout must be positive", file=sys.stderr)
        return 2
    if args.shutdown_grace < 0:
        print("invariants serve: --shutdown-grace must not be negative", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    config = EngineConfig(model=args.model, admission=args.admission, max_queue=args.max_queue,
                          max_wait_ms=args.max_wait_ms, max_batch=args.max_batch,
                          pad_prefill={"auto": None, "on": True, "off": False}[args.pad_prefill],
                          stall_timeout_s=args.stall_timeout)
    engine_class = ENGINES[args.engine]

    def announce(line: str) -> None:
        print(line, flush=True)

    server = Server(engine_class(config), args.host, args.port, args.shutdown_grace, args.log_level, announce)
    code = run_until_stopped(server)
    if server.abandoned or server.start_failed:
        # The owner thread is stuck mid-request, or died with MLX state after load: MLX's exit-time
        # destructors would abort the process (SIGABRT, "terminate called without an active
        # exception") and hide the exit code, so leave without running them.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
