"""The false-alarm benchmark's engines work, each twin is one small diff from its correct engine, and the
benchmark's table says what its runs found. No fuzzing here: benchmarks/bench_false_alarms.py does that."""

from __future__ import annotations

import asyncio
import difflib
import importlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_false_alarms as bench  # noqa: E402
from false_alarms.pairs import PAIRS, Pair  # noqa: E402

ENGINES = [pair for pair in PAIRS if pair.kind == "engine"]
SERVERS = [pair for pair in PAIRS if pair.kind == "server"]
MOST_CHANGED_LINES = 12  # a twin is one mistake: a few lines, never a rewrite


def _variants(pairs: list[Pair]) -> list:
    return [pytest.param(pair, twin, id=f"{pair.name}{'-twin' if twin else ''}") for pair in pairs
            for twin in (False, True)]


def _needs(pair: Pair) -> None:
    if pair.needs and importlib.util.find_spec(pair.needs.split("==")[0]) is None:
        pytest.skip(f"{pair.name} needs pip install '{pair.needs}'")


@pytest.mark.parametrize("pair, twin", _variants(ENGINES))
def test_engine_streams_real_tokens(pair: Pair, twin: bool) -> None:
    from mlx_invariants.fuzz.scenario import RequestSpec

    adapter = importlib.import_module(pair.twin_module if twin else pair.module).make()

    async def one_request() -> tuple[list[str], str, dict]:
        await adapter.start()
        try:
            handle = await adapter.submit(RequestSpec(rid="r0", prompt_len=4, max_tokens=6, stream=True))
            try:
                pieces = [piece async for piece in handle]
            finally:
                await handle.close()
            return pieces, handle.outcome().kind, adapter.status()
        finally:
            await adapter.shutdown()

    pieces, outcome, status = asyncio.run(one_request())
    assert outcome == "completed"
    assert len(pieces) == 6 and "".join(pieces), pieces
    assert not any(status.values()), status  # nothing held once the request ended


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    """Every server variant whose dependencies are installed, started side by side: module -> URL."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "benchmarks"),
                                                                     os.environ.get("PYTHONPATH")])))
    started: dict[str, tuple[subprocess.Popen, int]] = {}
    for pair in SERVERS:
        if pair.needs and importlib.util.find_spec(pair.needs.split("==")[0]) is None:
            continue
        for module in (pair.module, pair.twin_module):
            port = _free_port()
            started[module] = (subprocess.Popen([sys.executable, "-m", module, "--port", str(port)], env=env,
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), port)
    try:
        deadline = time.monotonic() + 120
        for module, (process, port) in started.items():
            while True:
                assert process.poll() is None, f"{module} exited with status {process.returncode} before listening"
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, f"{module} never listened on {port}"
                    time.sleep(0.1)  # polling a process we started, not ordering scenario events
        yield {module: f"http://127.0.0.1:{port}" for module, (_, port) in started.items()}
    finally:
        for process, _ in started.values():
            process.terminate()
        for process, _ in started.values():
            process.wait(timeout=30)


@pytest.mark.parametrize("pair, twin", _variants(SERVERS))
def test_server_answers_one_request_with_real_tokens(pair: Pair, twin: bool, servers: dict[str, str]) -> None:
    _needs(pair)
    url = servers[pair.twin_module if twin else pair.module]
    plain = httpx.post(f"{url}/v1/completions", json={"prompt": "hello world", "max_tokens": 6}, timeout=60)
    assert plain.status_code == 200, plain.text
    assert plain.json()["choices"][0]["text"]
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=60,
                      json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data:")]
    assert r.status_code == 200
    assert lines[-1] == "data: [DONE]" and len(lines) >= 2, lines


@pytest.mark.parametrize("pair", [pytest.param(pair, id=pair.name) for pair in PAIRS])
def test_twin_is_one_small_diff_from_its_correct_engine(pair: Pair) -> None:
    correct, twin = pair.path().read_text().splitlines(), pair.path(twin=True).read_text().splitlines()
    changed = [line for line in difflib.unified_diff(correct, twin, lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert 0 < len(changed) <= MOST_CHANGED_LINES, "\n".join(changed)
    assert twin[0].startswith('"""TWIN of ' + pair.name + ":"), twin[0]  # the twin names its mistake


def test_table_counts_false_alarms_and_twin_finds() -> None:
    bug = bench.Finding("slot-leaked", "violation", "r0 held its slot", 4.0)
    noise = bench.Finding("stalled", "unconfirmed", "nothing ran for 5 s")
    results = [
        bench.RunResult("pool_owner", False, 1, 0),
        bench.RunResult("pool_owner", False, 2, 1, (bug,)),
        bench.RunResult("pool_owner", False, 3, 0, (noise,)),
        bench.RunResult("pool_owner", True, 1, 1, (bench.Finding("lock-reentered", "violation", "lock-reentered: r0 re-entered", 2.0),)),
        bench.RunResult("pool_owner", True, 2, 1, (bench.Finding("lock-reentered", "violation", "lock-reentered: r0 re-entered", 6.0),)),
        bench.RunResult("pool_owner", True, 3, 0),
        bench.RunResult("queue_owner", False, 1, 0),
        bench.RunResult("queue_owner", True, 1, 0, (noise,)),
    ]
    pairs = [pair for pair in PAIRS if pair.name in ("pool_owner", "queue_owner", "aiohttp_server")]
    rows = {line.split(" | ")[0].strip("| "): line
            for line in bench.render_table(pairs, results, {"aiohttp_server": "needs aiohttp"}).splitlines()[2:]}
    pool = rows["pool_owner"].split(" | ")
    assert pool[2:6] == ["3 / 1", "1 (stalled)", "2/3", "4.0"]
    assert pool[6].startswith("lock-reentered: r0 re-entered")
    queue = rows["queue_owner"].split(" | ")
    assert queue[2:6] == ["1 / 0", "0", "0/1", "—"] and queue[6].startswith("missed (unconfirmed only: stalled)")
    assert "skipped: needs aiohttp" in rows["aiohttp_server"]
    assert "pool_owner seed 2 (violation, slot-leaked): r0 held its slot" in bench.render_false_alarms(results)


def test_a_run_folder_is_read_from_its_summary(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    summary.write_text('{"findings": [{"oracle": "lock-released-early", "status": "violation", '
                       '"headline": "released early", "found_after_s": 3.5}, '
                       '{"oracle": "stalled", "status": "unconfirmed", "headline": "quiet"}]}')
    result = bench.read_run("asyncio_raw", True, 1, 1, summary, 9.0)
    assert result.failing and result.first_find_s == 3.5
    assert [f.oracle for f in result.unconfirmed] == ["stalled"]
    summary.write_text('{"findings": [{"oracle": "stalled", "status": "unconfirmed", "headline": "quiet"}]}')
    clean = bench.read_run("asyncio_raw", False, 1, 0, summary, 9.0)
    assert not clean.failing and clean.first_find_s is None  # unconfirmed alone is no false alarm


def test_fuzz_command_targets_the_twin_module() -> None:
    server, engine = bench.BY_NAME["threading_server"], bench.BY_NAME["queue_owner"]
    command = bench.fuzz_command(server, True, 2, 60, Path("/tmp/r"))
    assert command[command.index("--server-cmd") + 1].endswith("-m false_alarms.threading_server_twin --port {port}")
    assert command[:4] == [sys.executable, "-m", "mlx_invariants", "fuzz"]
    assert ["--profile", "runner", "--keep-going", "--budget", "60", "--seed", "2"] == command[6:13]
    command = bench.fuzz_command(engine, False, 1, 600, Path("/tmp/r"))
    assert command[command.index("--engine") + 1] == "false_alarms.queue_owner:make"
