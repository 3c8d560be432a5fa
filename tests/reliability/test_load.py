"""Load with disconnects against `invariants serve` in a child process with the MLX sentinel injected.

Steady clients (stream or not, some hanging up early, mid-generation or
mid-stream) plus bursts beyond capacity, for a fixed time per route. Then:
every attempt was a completion, a busy 503 or the client's own hang-up; the
sentinel saw no MLX entry off the owner thread or concurrent; `/v1/status`
shows nothing active, queued or relayed; the server counted no 5xx; it still
serves; it exits 0 on SIGTERM. Resident memory growth is reported.
"""

from __future__ import annotations

import asyncio
import signal

import httpx
import pytest

from . import load
from .process import ServerProcess

ROUTES = {
    "simple": ["--engine", "simple"],                        # capacity 1: almost every burst request is busy
    "batched": ["--engine", "batched", "--max-batch", "4"],  # capacity 4 + 16 queued: a burst of 24 overflows
}
MB = 1024 * 1024


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_load_with_disconnects_loses_nothing(route, tmp_path, load_seconds, report):
    """Steady and bursting clients, random stream/non-stream and hang-ups, against the real server process."""
    with ServerProcess(ROUTES[route], sentinel=tmp_path / "mlx.jsonl") as server:
        assert server.wait_listening(), server.output()
        model = server.get("/v1/models").json()["data"][0]["id"]
        warm = httpx.post(server.url + load.ROUTE, timeout=30, json={
            "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
        assert warm.status_code == 200, warm.text
        rss_before = server.rss_bytes()

        # Every outcome is checked below: the run goes on past its time until each has happened once.
        plan = load.Plan(seconds=load_seconds, seed=len(route),
                         until_seen=frozenset({"completed", "busy", "disconnected"}))
        result = asyncio.run(load.run(server.url, model, plan))

        idle = server.wait_idle()
        status = server.status()
        rss_after = server.rss_bytes()
        violations = server.sentinel_violations()
        entries = server.mlx_entries()
        five_xx = {k: v for k, v in status["server"]["responses"].items() if int(k) >= 500 and k != "503"}
        report.outcome = (f"{result.line()}; sentinel: {len(violations)} violations in {entries} MLX entries; "
                          f"leaked: active {status['active']}, queued {status['queued']}")
        report.add(attempts=result.attempts, **dict(result.outcomes), left=dict(result.left),
                   sentinel_entries=entries, sentinel_violations=len(violations),
                   server_disconnects=status["server"]["client_disconnects"], server_5xx=sum(five_xx.values()),
                   rss_before_mb=round(rss_before / MB, 1), rss_after_mb=round(rss_after / MB, 1),
                   rss_growth_mb=round((rss_after - rss_before) / MB, 1), seconds=round(result.seconds, 1))
        print(f"{route}: {report.outcome}; RSS {rss_before / MB:.0f} -> {rss_after / MB:.0f} MB")

        assert not result.unexpected, "\n".join(result.unexpected)
        assert idle, f"a slot leaked after the load: {status}"
        assert not violations, "\n".join(violations)
        assert not five_xx, f"the server answered 5xx: {five_xx}"
        assert result.outcomes["completed"] and result.outcomes["busy"] and result.outcomes["disconnected"], \
            f"the run did not exercise every outcome: {result.line()}"
        assert status["server"]["client_disconnects"] > 0, "the server noticed none of the hang-ups"
        assert server.get("/health").status_code == 200
        server.signal(signal.SIGTERM)
        assert server.wait_exit(120) == 0, server.output()
