"""Faults in a real `invariants serve` process: each ends with its documented outcome and nothing hangs.

Faults inside requests are planted at the engine's named points (a hook
raising there is an MLX error at that spot); warmup and load have no point yet,
so those faults wrap the mlx-lm entry the owner thread calls (see `serve.py`).
Documented outcomes are those of docs/http.md: a failed request is a 500 JSON
error (non-stream) or an error event then `[DONE]` (stream) and the server goes
on; a failed start prints one line and exits 1 without listening; SIGTERM ends
every open request with a terminal event and exits 0.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest

from . import load
from .answers import error_of
from .process import ServerProcess, wait_for

ENGINES = {"simple": ["--engine", "simple"], "batched": ["--engine", "batched", "--max-batch", "4"]}
WARMUP_ENTRY = {"simple": "mlx_lm:stream_generate", "batched": "mlx_lm.generate:BatchGenerator.next"}
# How long a test waits for the process to exit: a backstop for a hang, not a bound checked. Unloaded it
# takes about a second; with the owner stuck in a step, grace 0.5 + abort wait 1 + owner stop 6 + uvicorn
# close 5. How long it took is a figure the report fixture passes on to benchmarks/reliability.py.
EXIT_TIMEOUT_S = 120.0


def chat(model: str, max_tokens: int = 8, stream: bool = False) -> dict[str, Any]:
    """Greedy: the tiny model never samples end-of-sequence within 900 tokens, so only an abort ends it early."""
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens,
            "stream": stream, "temperature": 0}


def sse(text: str) -> list[Any]:
    """The data events of a stream, `[DONE]` kept as a string."""
    events = [e.removeprefix("data: ") for e in text.split("\n\n") if e.startswith("data: ")]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def finish_reasons(events: list[Any]) -> list[str]:
    return [c["finish_reason"] for e in events if isinstance(e, dict) for c in e.get("choices", [])
            if c.get("finish_reason")]


def started(server: ServerProcess) -> str:
    assert server.wait_listening(), server.output()
    return server.get("/v1/models").json()["data"][0]["id"]


def still_serves(server: ServerProcess, model: str) -> None:
    assert server.wait_idle(), f"a slot leaked: {server.status()}"
    assert server.get("/health").status_code == 200
    answer = httpx.post(server.url + "/v1/chat/completions", json=chat(model), timeout=30)
    assert answer.status_code == 200, answer.text


def stop(server: ServerProcess) -> int:
    server.signal(signal.SIGTERM)
    code = server.wait_exit(EXIT_TIMEOUT_S)
    assert code is not None, f"the server did not exit within {EXIT_TIMEOUT_S:g}s of SIGTERM\n{server.output()}"
    return code


# -- faults inside a request --------------------------------------------------------------

REQUEST_FAULTS = {  # X-Request-Id -> (point, step)
    "prefill-json": ("WORKER_STARTED", None),
    "prefill-sse": ("WORKER_STARTED", None),
    "decode-json": ("BEFORE_DECODE", 2),
    "decode-sse": ("BEFORE_DECODE", 2),
}


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_request_faults_fail_only_that_request(engine, tmp_path, report):
    """An exception inside prefill or a decode step, stream and non-stream: an error answer, then business as usual."""
    faults = [{"point": point, "step": step, "rid": f"chatcmpl-{rid}", "action": "raise"}
              for rid, (point, step) in REQUEST_FAULTS.items()]
    seen = {}
    with ServerProcess(ENGINES[engine], faults, sentinel=tmp_path / "mlx.jsonl") as server:
        model = started(server)
        for rid in REQUEST_FAULTS:
            stream = rid.endswith("sse")
            answer = httpx.post(server.url + "/v1/chat/completions", json=chat(model, 16, stream),
                                headers={"x-request-id": rid}, timeout=30)
            if stream:
                assert answer.status_code == 200, answer.text
                events = sse(answer.text)
                assert events[-1] == "[DONE]" and "error" in events[-2], f"{rid}: {events[-3:]}"
                assert not finish_reasons(events), f"{rid}: a failed stream also finished normally"
                seen[rid] = f"200 SSE error {events[-2]['error']['code']} + [DONE]"
            else:
                assert answer.status_code == 500, f"{rid}: {answer.status_code} {answer.text}"
                error = error_of(answer)
                assert error["type"] == "server_error" and "injected fault" in error["message"], error
                seen[rid] = f"500 {error['code']}"
            still_serves(server, model)
        violations = server.sentinel_violations()
        assert not violations, "\n".join(violations)
        assert stop(server) == 0, server.output()
    report.outcome = "; ".join(f"{rid}: {what}" for rid, what in seen.items()) + "; served after each; exit 0"
    report.add(faults=len(seen), sentinel_violations=0)


def test_engine_failure_is_in_the_openapi_document():
    """The 500 an engine failure answers with (docs/http.md) is listed for the generation routes."""
    from mlx_invariants.engine.http import openapi

    for path in ("/v1/chat/completions", "/v1/completions"):
        assert "500" in openapi.document()["paths"][path]["post"]["responses"], path


# -- faults while starting ------------------------------------------------------------------

def assert_failed_start(server: ServerProcess) -> str:
    code = server.wait_exit(EXIT_TIMEOUT_S)
    assert code == 1, f"exit code {code}\n{server.output()}"
    assert server.url is None and not any("listening on" in l for l in server.stdout), server.output()
    said = [l for l in server.stderr if l.startswith("invariants serve: the engine failed to start")]
    assert len(said) == 1, server.output()
    return said[0]


WARMUP_STARTS, WARMUP_AT_ONCE = 8, 4  # the abort below comes in about half the starts: 8 make it near-certain


def failed_start(engine: str) -> tuple[Optional[int], bool, list[str]]:
    """One start whose warmup raises: (exit code, listened?, stderr tail)."""
    fault = {"call": WARMUP_ENTRY[engine], "nth": 1, "action": "raise"}
    with ServerProcess(ENGINES[engine], [fault]) as server:
        listened = server.wait_listening()
        code = server.wait_exit(EXIT_TIMEOUT_S)
    return code, listened, server.stderr[-3:]


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_warmup_failure_exits_1_without_listening(engine, report):
    """The first generation step (warmup) raises, 8 starts: one line, exit 1, never listened, every time."""
    with ThreadPoolExecutor(WARMUP_AT_ONCE) as pool:
        runs = list(pool.map(lambda _: failed_start(engine), range(WARMUP_STARTS)))
    codes = collections.Counter(code for code, _, _ in runs)
    report.outcome = f"exit codes of {WARMUP_STARTS} starts: {dict(codes)}; listened: {sum(l for _, l, _ in runs)}"
    report.add(exit_codes=dict(codes))
    for code, listened, tail in runs:
        assert not listened, "the server listened although its warmup failed"
        assert code == 1, f"exit code {code}: {tail}"
        said = [l for l in tail if l.startswith("invariants serve: the engine failed to start")]
        assert said, tail


@pytest.mark.parametrize("broken", ["no-weights", "not-a-model"])
def test_model_load_failure_exits_1_without_listening(broken, tmp_path, tiny_model, report):
    """A model folder without weights, and a folder that is no model at all: one line, exit 1, never listened."""
    folder = tmp_path / broken
    folder.mkdir()
    if broken == "no-weights":
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(Path(tiny_model) / name, folder / name)
    with ServerProcess(["--model", str(folder)]) as server:
        assert not server.wait_listening(), "the server listened although its model did not load"
        line = assert_failed_start(server)
    report.outcome = f"exit 1, never listened: {line[:140]}"


# -- SIGTERM --------------------------------------------------------------------------------

def test_sigterm_during_model_load_exits_0_without_listening(tmp_path, report):
    """SIGTERM while the owner thread is inside the model load: exit 0, never listened, within the bound."""
    reached = tmp_path / "load.reached"
    fault = {"call": "mlx_lm:load", "action": "block", "gate": str(tmp_path / "never"), "reached": str(reached)}
    with ServerProcess([], [fault]) as server:
        assert wait_for(reached.exists, 60), f"the load never began\n{server.output()}"
        begun = time.monotonic()
        code = stop(server)
        took = time.monotonic() - begun
    assert code == 0, server.output()
    assert not any("listening on" in l for l in server.stdout), server.output()
    report.outcome = f"exit {code} {took:.1f}s after SIGTERM, never listened (the load itself never returned)"
    report.add(exit_s=round(took, 1))


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_sigterm_during_decode_aborts_the_stream_and_exits_0(engine, tmp_path, report):
    """SIGTERM while a stream decodes: it ends with finish_reason abort and [DONE], and the process exits 0."""
    gate, reached = tmp_path / "gate", tmp_path / "reached"
    fault = {"point": "BEFORE_DECODE", "rid": "chatcmpl-long", "step": 3, "action": "block",
             "gate": str(gate), "reached": str(reached)}
    with ServerProcess([*ENGINES[engine], "--shutdown-grace", "0.5"], [fault],
                       sentinel=tmp_path / "mlx.jsonl") as server:
        model = started(server)
        result: dict[str, Any] = {}

        async def read_stream() -> None:
            async with httpx.AsyncClient(timeout=60) as client:
                answer = await client.post(server.url + "/v1/chat/completions", json=chat(model, 900, True),
                                           headers={"x-request-id": "long"})
                result["status"], result["events"] = answer.status_code, sse(answer.text)

        async def scenario() -> float:
            reader = asyncio.ensure_future(read_stream())
            assert await asyncio.to_thread(wait_for, reached.exists, 60), server.output()
            server.signal(signal.SIGTERM)
            draining = await asyncio.to_thread(wait_for, lambda: server.get("/health").status_code == 503, 60)
            assert draining, "/health still 200 after SIGTERM"
            gate.touch()  # decoding resumes only now that the server is draining
            begun = time.monotonic()
            await reader
            return time.monotonic() - begun

        ended_s = asyncio.run(scenario())
        code = server.wait_exit(EXIT_TIMEOUT_S)
        violations = server.sentinel_violations()
    assert result["status"] == 200
    events = result["events"]
    assert events[-1] == "[DONE]" and finish_reasons(events) == ["abort"], \
        f"finish reasons {finish_reasons(events)}, ending {events[-2:]}"
    assert code == 0, server.output()
    assert not violations, "\n".join(violations)
    tokens = sum(1 for e in events if isinstance(e, dict) and e["choices"] and e["choices"][0]["delta"].get("content"))
    report.outcome = f"stream ended abort + [DONE] {ended_s:.1f}s after release ({tokens} tokens of 900); exit 0"
    report.add(tokens=tokens, stream_end_s=round(ended_s, 2))


def test_sigterm_with_the_owner_stuck_in_a_step_still_ends_every_client(tmp_path, report):
    """SIGTERM while the owner thread never returns from a decode step: the stream still ends, the process exits 0."""
    reached = tmp_path / "reached"
    fault = {"point": "BEFORE_DECODE", "rid": "chatcmpl-stuck", "step": 3, "action": "block",
             "gate": str(tmp_path / "never"), "reached": str(reached)}
    with ServerProcess(["--shutdown-grace", "0.5"], [fault]) as server:
        model = started(server)
        result: dict[str, Any] = {}

        async def scenario() -> None:
            async with httpx.AsyncClient(timeout=60) as client:
                request = asyncio.ensure_future(client.post(server.url + "/v1/chat/completions",
                                                            json=chat(model, 900, True),
                                                            headers={"x-request-id": "stuck"}))
                assert await asyncio.to_thread(wait_for, reached.exists, 60), server.output()
                server.signal(signal.SIGTERM)
                begun = result["signalled"] = time.monotonic()
                try:
                    answer = await request
                    result["events"] = sse(answer.text)
                except httpx.RemoteProtocolError as exc:
                    result["dropped"] = str(exc)
                result["took"] = time.monotonic() - begun

        asyncio.run(scenario())
        code = server.wait_exit(EXIT_TIMEOUT_S)
        exit_s = time.monotonic() - result["signalled"]
    report.add(exit_code=code, stream_end_s=round(result["took"], 2), exit_s=round(exit_s, 1))
    assert "dropped" not in result, (f"the stream was dropped {result['took']:.1f}s after SIGTERM without a "
                                     f"terminal event: {result['dropped']}; exit {code}")
    events = result["events"]
    assert events[-1] == "[DONE]" and (finish_reasons(events) == ["abort"] or "error" in events[-2]), events[-3:]
    assert code == 0, server.output()
    ending = "abort" if finish_reasons(events) else f"error {events[-2]['error']['code']}"
    report.outcome = f"stream ended ({ending}) + [DONE] {result['took']:.1f}s after SIGTERM; exit 0"


def test_sigterm_during_a_burst_ends_every_client(tmp_path, report):
    """SIGTERM while a burst beyond capacity decodes: every client gets a terminal answer; exit 0."""
    plan = load.Plan(seconds=0, max_tokens=300, finish_reasons=frozenset({"stop", "length", "abort"}))
    with ServerProcess([*ENGINES["batched"], "--shutdown-grace", "0.5"], sentinel=tmp_path / "mlx.jsonl") as server:
        model = started(server)

        async def burst() -> list[tuple[str, str]]:
            async with httpx.AsyncClient(base_url=server.url, timeout=60,
                                         limits=httpx.Limits(max_connections=plan.burst_size)) as client:
                rngs = [random.Random(i) for i in range(plan.burst_size)]
                attempts = [load.plan_attempt(plan, rng, steady=False) for rng in rngs]
                tasks = [asyncio.ensure_future(load.attempt_once(client, model, a, r, plan.finish_reasons))
                         for a, r in zip(attempts, rngs)]
                busy = await asyncio.to_thread(wait_for, lambda: server.status()["active"] >= 8, 30)
                assert busy, f"the burst never filled the batch: {server.status()}"
                server.signal(signal.SIGTERM)
                return await asyncio.gather(*tasks)

        outcomes = asyncio.run(burst())
        code = server.wait_exit(EXIT_TIMEOUT_S)
        violations = server.sentinel_violations()
    counts = collections.Counter(kind for kind, _ in outcomes)
    unexpected = [detail for kind, detail in outcomes if kind == "unexpected"]
    report.outcome = f"{dict(counts)} of {plan.burst_size}; exit {code}; sentinel violations {len(violations)}"
    report.add(**dict(counts), sentinel_violations=len(violations))
    assert not unexpected, "\n".join(unexpected)
    assert code == 0, server.output()
    assert not violations, "\n".join(violations)
