"""One refusal, two transports, over real HTTP: a server that refuses a busy plain request with 503 but answers
a busy stream HTTP 200 with only an error frame (vllm-mlx 0.6.0's SimpleEngine) is found, with a headline
that names both answers; servers that answer both transports alike (a 429 on both, the reference server's
503 on both, a server that waits instead of refusing) are not."""

from __future__ import annotations

import asyncio
import sys

import pytest

from mlx_invariants.fuzz.driver import DriverSettings
from mlx_invariants.fuzz.oracles import judge
from mlx_invariants.fuzz.runner import run_fuzz
from mlx_invariants.fuzz.scenario import At, RequestSpec, Scenario
from mlx_invariants.fuzz.session import run_scenario
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.target import Target
from mlx_invariants.fuzz.trace import Trace
from tests.conftest import BACKSTOP_S

ERROR_FRAME_SERVER = f"{sys.executable} tests/fuzz/error_frame_server.py {{port}}"
REFERENCE_SERVER = f"{sys.executable} -m mlx_invariants serve --engine simple --host 127.0.0.1 --port {{port}}"
# r0 streams 200 tokens; at its first chunk a plain request and a streaming one arrive: both find it busy
# (with 40, the reference server was once done before they arrived).
BOTH_BUSY = Scenario((RequestSpec("r0", 3, 200, True),
                      RequestSpec("r1", 3, 4, False, arrival=At("r0", "CHUNK_SENT", 0)),
                      RequestSpec("r2", 3, 4, True, arrival=At("r0", "CHUNK_SENT", 0))), followup=False)
# A server over HTTP is watched in another process: "stalled" counts only after stall_s.
REMOTE = DriverSettings(quiet_ticks=50, stall_s=10.0, step_s=0.01)


def _served(command: str, model: str = "default_model") -> Trace:
    """`BOTH_BUSY` on the server `command`, started for it."""
    engines = Target.server(command, model=model).build()
    try:
        return run_scenario(engines, BOTH_BUSY, settings=REMOTE)
    finally:
        engines.close()


def _answers(trace: Trace) -> dict[str, tuple[int, str] | None]:
    """Per request: (status, where its error was) as the client read it, None for an answer without error."""
    answers = {}
    for end in trace.of("request", "end"):
        answer = end.info.get("answer")
        answers[end.rid] = (answer["status"], answer["carrier"]) if answer else None
    return answers


@pytest.mark.parametrize("flags, kind, frame", [
    ("--busy-frames", "busy-differs-by-transport", "InternalServerError: Internal server error"),
    ("--busy-frames --named", "refusal-differs-by-transport", "text_generation_busy: the server is busy"),
])
def test_busy_refused_503_to_a_plain_request_and_200_with_an_error_frame_to_a_stream_is_found(flags, kind, frame):
    trace = _served(f"{ERROR_FRAME_SERVER} {flags}")
    assert _answers(trace) == {"r0": None, "r1": (503, "status"), "r2": (200, "frame")}, _answers(trace)
    found = judge(trace)
    assert [v.kind for v in found] == [kind], found
    assert found[0].rid == "r2"
    assert found[0].message.startswith("busy: non-streaming r1 answered 503 text_generation_busy, streaming r2 "
                                       f"answered 200 with only an error frame ({frame}"), found[0].message


@pytest.mark.parametrize("command, model, answers", [
    (ERROR_FRAME_SERVER, "default_model", {"r0": None, "r1": None, "r2": None}),  # it waits instead of refusing
    (f"{ERROR_FRAME_SERVER} --refuses", "default_model", {"r0": None, "r1": (429, "status"), "r2": (429, "status")}),
    (REFERENCE_SERVER, "mlx-invariants-tiny", {"r0": None, "r1": (503, "status"), "r2": (503, "status")}),
])
def test_servers_that_answer_both_transports_alike_are_clean(command, model, answers):
    trace = _served(command, model)
    assert _answers(trace) == answers
    assert judge(trace) == []


def test_the_fuzzer_confirms_the_planted_server_and_reports_both_answers():
    """The busy kind judges concurrency, so it counts once it replays: each re-run meets a new server."""
    command = f"{ERROR_FRAME_SERVER} --busy-frames --mlx"
    engines = Target.server(command).build()  # one server, each re-run on a new process
    try:
        result = run_fuzz(engines, FuzzSettings(examples=1, budget_s=BACKSTOP_S, explicit=(BOTH_BUSY,),
                                                debug_run=False, replays=2, shrink=False))
    finally:
        engines.close()
    assert not result.ok, result.new_findings
    assert result.failure.headline.startswith("busy-differs-by-transport: busy: non-streaming r1 answered 503"), \
        result.failure.headline
    assert result.new_findings[0].confirmation == (2, 2), result.new_findings[0].confirmation


def test_a_cancel_at_a_streams_admitted_point_lands_where_the_driver_closes_the_stream():
    """A cancel delivered at a stream's ADMITTED must land once the handle is the caller's to close: landing
    inside `submit`, it left the response open, and a correct server streamed on to a client that was gone
    (two correct servers of the false-alarm benchmark read as computing after a disconnect so)."""
    from mlx_invariants.fuzz.adapters.http import HttpAdapter

    engines = Target.server(f"{sys.executable} tests/fuzz/slow_server.py {{port}}").build()

    async def main() -> int:
        adapter: HttpAdapter = engines()
        await adapter.start()
        task = asyncio.current_task()

        def cancel_at_admitted(point, rid, info) -> None:  # as the fuzzer delivers a cancel there
            if point.name == "ADMITTED":
                task.cancel()

        adapter.set_point_hook(cancel_at_admitted)
        handle = None
        try:
            handle = await adapter.submit(RequestSpec("r0", 1, 50, True))
            async for _ in handle:
                pass
        except asyncio.CancelledError:
            if handle is not None:
                await handle.close()  # what the driver does with a cancelled client's handle
        opened = len(adapter._client._transport._pool.connections)
        await adapter.shutdown()
        return opened

    try:
        engines.prepare()
        assert asyncio.run(main()) == 0
    finally:
        engines.close()
