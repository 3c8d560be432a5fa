"""Drop-in observation: an engine that marks nothing is still judged on its locks, threads and cancels.

The toy engine (`toy_engine.py`) imports nothing of ours and calls no point hooks; its adapter
(`toy_adapter.py`) uses its public API only. The fuzzer must find its seed-000 bug (the lock let go while
the worker is still in MLX) and the double-cancel variant, and pass the fixed engine.
"""

from __future__ import annotations

import ast
import asyncio
import concurrent.futures
import gc
import json
import subprocess
import sys
import threading
from pathlib import Path

import mlx.core as mx
import pytest

from mlx_invariants.fuzz.injection import sentinel_env
from mlx_invariants.fuzz.observe import ObservedThreadLock
from mlx_invariants.fuzz.ownership import (cancel_is_honoured, lock_kept_over_its_work, loop_never_waits_for_mlx,
                                           mlx_finalized_where_it_lives, mlx_only_on_loader, mlx_stays_off_the_loop)
from mlx_invariants.fuzz.runner import run_fuzz
from mlx_invariants.fuzz.sentinel import DEFAULT_TARGETS, Sentinel, read_records
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.strategies import scenarios
from mlx_invariants.fuzz.trace import Event, Trace
from tests.conftest import BACKSTOP_S
from tests.fuzz import mlx_work, toy_adapter

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SINGLE = ("cancel", "disconnect", "cancel-in-call")  # what a client can do once; in-call waits for MLX
TWICE = ("cancel-twice",)  # two cancels of one request, the second while the first is drained


def kinds(oracle, trace: Trace) -> list[str]:
    return [v.kind for v in oracle(trace)]


def fuzz(factory: str, fault_kinds: tuple[str, ...], tmp_path: Path, examples: int = 40, strategy=None):
    return run_fuzz(toy_adapter.target(factory, fault_kinds),
                    FuzzSettings(examples=examples, budget_s=BACKSTOP_S, explicit=(), replays=0, shrink=False,
                                 debug_run=False, report_dir=tmp_path), strategy=strategy)


# -- the toy third-party engine, fuzzed -----------------------------------------------------------
def test_the_toy_engine_is_unmodified_third_party_code():
    source = (HERE / "toy_engine.py").read_text()
    imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(source))
                if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])}
    assert imported <= {"__future__", "asyncio", "concurrent", "time", "typing", "mlx"}, imported
    assert "hook" not in source and "reach" not in source and "Point" not in source


def test_the_seed_000_bug_is_found_in_an_unmodified_engine(tmp_path: Path):
    result = fuzz("make_plain", SINGLE, tmp_path)
    assert result.failure is not None, f"clean after {result.examples} examples"
    assert result.failure.violations[0].kind == "lock-released-early", result.failure.headline


def test_the_drained_engine_is_clean_even_under_double_cancels(tmp_path: Path):
    result = fuzz("make_drain", TWICE, tmp_path, examples=25)
    assert result.ok, result.failure and result.failure.headline
    assert result.examples >= 25


def test_a_drain_that_survives_one_cancel_but_not_two_is_found(tmp_path: Path):
    """Only double cancels drawn: among every kind the search took about 200 examples to land one in the drain."""
    result = fuzz("make_drain_once", TWICE, tmp_path, examples=300)
    assert result.failure is not None, f"clean after {result.examples} examples"
    assert result.failure.violations[0].kind == "lock-released-early", result.failure.headline
    assert "cancel-twice" in json.dumps(result.failure.scenario.to_json())


@pytest.mark.parametrize("factory, found", [("make_prepped_drain_once", ["lock-released-early"]),
                                            ("make_prepped_drain", [])])
def test_a_double_cancel_reached_before_the_work_starts_waits_for_it_and_lands_in_the_drain(factory, found):
    """ADMITTED comes while the worker still tokenizes: two cancels at once land before the decode job was
    handed over, and the drain they test has no MLX to wait for. The first waits for MLX off the loop, so
    every run lands in the drain (a vllm-mlx replay whose job had not started missed 3 of 3 in one process)."""
    from mlx_invariants.fuzz.oracles import judge
    from mlx_invariants.fuzz.scenario import At, FaultSpec, RequestSpec, Scenario
    from mlx_invariants.fuzz.session import run_scenario

    # eight tokens in one job: long enough to be met inside it (a one-token job may end before the loop looks)
    twice = Scenario((RequestSpec("r0", 1, 8, False),), (FaultSpec("cancel-twice", At("r0", "ADMITTED")),))
    engines = toy_adapter.target(factory, TWICE).build()
    try:
        runs = [[v.kind for v in judge(run_scenario(engines, twice))] for _ in range(5)]
    finally:
        engines.close()
    assert runs == [found] * 5, runs


def test_the_drain_once_engine_passes_single_cancels(tmp_path: Path):
    """So the double-cancel variant is found by the second cancel, not by anything else. One fault a scenario
    and none across requests: two single cancels of one request (a cancel, then a disconnect) are a double
    cancel too, which this engine rightly fails (a loaded box once landed the second inside the drain)."""
    one = scenarios(kinds=SINGLE, points=toy_adapter.target("make_drain_once", SINGLE).points, max_faults=1,
                    across=False)
    result = fuzz("make_drain_once", SINGLE, tmp_path, examples=25, strategy=one)
    assert result.ok, result.failure and result.failure.headline


# -- what is observed ----------------------------------------------------------------------------
def test_uninstall_puts_every_patched_attribute_back():
    import asyncio.locks
    import asyncio.tasks

    places = [(asyncio.locks.Lock, "acquire"), (asyncio.locks.Lock, "release"), (asyncio.locks.Semaphore, "acquire"),
              (asyncio.locks.Semaphore, "release"), (threading, "Lock"), (threading.Thread, "start"),
              (concurrent.futures.ThreadPoolExecutor, "submit"), (asyncio.tasks, "Task")]
    before = [vars(owner)[attr] for owner, attr in places]
    with Sentinel(observe=True):
        assert all(vars(owner)[attr] is not was for (owner, attr), was in zip(places, before))
    assert [vars(owner)[attr] for owner, attr in places] == before
    with Sentinel(observe=False):
        assert [vars(owner)[attr] for owner, attr in places] == before


def _spin(started: threading.Event, gate: threading.Event) -> None:
    """Inside MLX before and after the gate opens."""
    mx.eval(mx.ones(4) * 2)
    started.set()
    gate.wait(10)
    mx.eval(mx.ones(4) * 3)


async def _hold_and_cancel(drain: bool) -> None:
    lock, started, gate = asyncio.Lock(), threading.Event(), threading.Event()

    async def holder() -> None:
        async with lock:
            job = asyncio.ensure_future(asyncio.to_thread(_spin, started, gate))
            try:
                await asyncio.shield(job)
            except asyncio.CancelledError:
                if drain:
                    gate.set()
                    await asyncio.wait({job})
                raise

    task = asyncio.get_running_loop().create_task(holder())
    while not started.is_set():
        await asyncio.sleep(0.001)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    gate.set()
    await asyncio.sleep(0.05)  # the undrained worker finishes its last MLX call


@pytest.mark.parametrize("drain", [False, True])
def test_a_lock_let_go_while_its_worker_is_in_mlx(drain: bool):
    with Sentinel() as sentinel:
        asyncio.run(_hold_and_cancel(drain))
    trace = sentinel.trace
    submit = trace.first("work", "submit")
    release = trace.first("sync", "release")
    assert submit.info["via"] == "to_thread"  # in a task of its own, which the holder created
    assert submit.info["under"] == [{"lock": release.info["lock"], "holder": release.info["holder"]}]
    assert release.info["unwinding"] == "CancelledError"
    assert kinds(lock_kept_over_its_work, trace) == ([] if drain else ["lock-released-early"])


def test_work_handed_to_threads_is_recorded_where_it_runs():
    with Sentinel() as sentinel:
        made = threading.Lock()
        with made:
            thread = threading.Thread(target=lambda: None, name="engine-thread")
            thread.start()
            thread.join()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(int, "1").result()

        async def main() -> None:
            await asyncio.to_thread(int, "2")
            await asyncio.get_running_loop().run_in_executor(None, int, "3")
        asyncio.run(main())
    trace = sentinel.trace
    assert isinstance(made, ObservedThreadLock) and not isinstance(threading.Event()._cond._lock, ObservedThreadLock)
    submits = trace.of("work", "submit")
    assert [s.info["via"] for s in submits] == ["thread", "submit", "to_thread", "run_in_executor"]
    assert [held["lock"] for held in submits[0].info["under"]] == [trace.first("sync", "acquire").info["lock"]]
    for submit in submits:
        work = submit.info["work"]
        start = next(e for e in trace.of("work", "start") if e.info["work"] == work)
        finish = next(e for e in trace.of("work", "finish") if e.info["work"] == work)
        assert submit.seq < start.seq < finish.seq and start.thread == finish.thread != submit.thread


async def _ends(body) -> None:
    task = asyncio.get_running_loop().create_task(body())
    await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _swallows() -> None:
    try:
        await asyncio.sleep(1)
    except asyncio.CancelledError:
        return


async def _shields() -> None:
    await asyncio.shield(asyncio.sleep(0.02))


async def _drains() -> None:
    inner = asyncio.ensure_future(asyncio.sleep(0.02))
    try:
        await asyncio.shield(inner)
    except asyncio.CancelledError:
        await inner
        raise


async def _uncancels() -> None:
    try:
        await asyncio.sleep(1)
    except asyncio.CancelledError:
        asyncio.current_task().uncancel()  # taken on purpose, as asyncio.timeout and TaskGroup do


@pytest.mark.parametrize("body,found", [(_swallows, ["cancel-swallowed"]), (_shields, []), (_drains, []),
                                        (_uncancels, [])])
def test_a_swallowed_cancel_is_told_from_shield_drain_and_uncancel(body, found):
    with Sentinel() as sentinel:
        asyncio.run(_ends(body))
    assert sentinel.trace.of("task", "cancel") and sentinel.trace.of("task", "end")
    assert kinds(cancel_is_honoured, sentinel.trace) == found


async def _left_alone(body) -> None:
    """Run `body` as a server runs a connection handler: a task nobody awaits, with a cleanup callback."""
    task = asyncio.get_running_loop().create_task(body())
    task.add_done_callback(lambda _: None)
    while not task.done():
        await asyncio.sleep(0.001)


async def _watcher_cancels_its_handler() -> None:
    me = asyncio.current_task()

    async def watch() -> None:  # as a handler's watcher does when it reads EOF from its client
        await asyncio.sleep(0.005)
        me.cancel()

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.sleep(1)
    except asyncio.CancelledError:
        await watcher
        return  # cleaned up; nobody waits on this handler


async def _timer_cancels_its_handler() -> None:
    asyncio.get_running_loop().call_later(0.005, asyncio.current_task().cancel)
    try:
        await asyncio.sleep(1)
    except asyncio.CancelledError:
        return


async def _caller_times_out_a_swallower() -> None:
    try:
        await asyncio.wait_for(_swallows(), 0.005)  # the caller's timeout: the swallowed cancel was its
    except TimeoutError:
        pass


@pytest.mark.parametrize("run,found", [(lambda: _left_alone(_watcher_cancels_its_handler), []),
                                       (lambda: _left_alone(_timer_cancels_its_handler), []),
                                       (lambda: _left_alone(_swallows_outside_cancel), ["cancel-swallowed"]),
                                       (_caller_times_out_a_swallower, ["cancel-swallowed"])],
                         ids=["watcher-cancels-own-handler", "timer-cancels-own-handler",
                              "other-task-cancels-handler", "caller-timeout"])
def test_a_cancel_counts_as_swallowed_only_when_it_came_from_outside(run, found):
    with Sentinel() as sentinel:
        asyncio.run(run())
    assert sentinel.trace.of("task", "cancel") and sentinel.trace.of("task", "end")
    assert kinds(cancel_is_honoured, sentinel.trace) == found


async def _swallows_outside_cancel() -> None:
    """Cancelled by a task it did not start (a server shutting its handlers down), then returns."""
    me = asyncio.current_task()
    asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(_cancel(me)))
    await _swallows()


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()


def test_asyncio_timeout_is_not_a_swallowed_cancel():
    async def main() -> None:
        try:
            async with asyncio.timeout(0.005):
                await asyncio.sleep(1)
        except TimeoutError:
            pass

    with Sentinel() as sentinel:
        asyncio.run(main())
    assert sentinel.trace.of("task", "uncancel")
    assert kinds(cancel_is_honoured, sentinel.trace) == []


@pytest.mark.parametrize("owner,second_thread,version,found", [
    (None, True, "0.30.6", ["mlx-off-loader"]), (None, False, "0.30.6", []), ("declared*", True, "0.30.6", []),
    # Per-thread streams: another thread is no bug by itself (what goes wrong there raises, mlx-no-stream).
    (None, True, "0.31.2", []), (None, True, "", [])])
def test_mlx_off_the_thread_that_loaded_the_model(owner, second_thread, version, found, monkeypatch):
    def touch() -> None:
        mx.eval(mx.ones(3))

    monkeypatch.setattr("mlx_invariants.fuzz.sentinel.mlx_version", lambda: version)
    with Sentinel(owner=owner) as sentinel:
        with concurrent.futures.ThreadPoolExecutor(1) as loader:
            loader.submit(touch).result()
            if second_thread:
                other = threading.Thread(target=touch)
                other.start()
                other.join()
            else:
                loader.submit(touch).result()
    assert kinds(mlx_only_on_loader, sentinel.trace) == found


STEPS = DEFAULT_TARGETS + ("tests.fuzz.mlx_work:steps",)  # the sentinel's targets, with a generator to wrap


def _start_one(held: list) -> None:
    """Make a wrapped MLX generator on this thread and leave it suspended mid-body, kept in `held`."""
    generator = mlx_work.steps(3)
    next(generator)
    held.append(generator)


def _start_one_on_another_thread(held: list) -> None:
    maker = threading.Thread(target=_start_one, args=(held,))
    maker.start()
    maker.join()


def test_an_mlx_generator_finalized_off_the_thread_that_made_it():
    held: list = []
    with Sentinel(STEPS) as sentinel:
        _start_one_on_another_thread(held)
        held.clear()  # the last reference goes here, on the main thread, mid-generation
        _start_one(held)
        held.clear()  # made and dropped on the same thread
    assert kinds(mlx_finalized_where_it_lives, sentinel.trace) == ["mlx-finalized-off-thread"]


@pytest.mark.parametrize("same_scenario, found", [(True, ["mlx-finalized-off-thread"]), (False, [])])
def test_a_generator_made_in_an_earlier_scenario_is_not_judged_in_a_later_one(same_scenario, found):
    """One sentinel records a whole fuzz run, a fresh trace per scenario (`Sentinel.attach`). A generator an
    earlier scenario left alive (a cycle no collection reached yet) may be finalized while a later one runs, on
    whichever thread that scenario's collection falls: its thread says nothing about the later scenario."""
    held: list = []
    with Sentinel(STEPS) as sentinel:
        _start_one_on_another_thread(held)
        if not same_scenario:
            sentinel.attach(Trace())
        held.clear()  # the last reference goes here, on the main thread, mid-generation
    assert kinds(mlx_finalized_where_it_lives, sentinel.trace) == found
    assert [e.name for e in sentinel.trace.of("mlx-gc")] == \
        ["finalized-off-thread" if same_scenario else "outlived-its-scenario"]


@pytest.mark.parametrize("collector, found", [("the engine's", ["mlx-finalized-off-thread"]),
                                              ("the harness's", [])])
def test_a_generator_finalized_in_a_collection_is_judged_only_where_the_harness_did_not_collect(collector, found):
    """A generator left suspended in a reference cycle is finalized by whichever thread collects: in the
    harness's own `gc.collect()` (its rest sample) that thread is the harness's choice, recorded apart and not
    judged (a vllm-mlx stream generator read as finalized on MainThread so, in every run). The last reference
    goes in the collection's start callback, so the finalization falls inside it whatever order the collector
    would finalize a cycle's objects in."""
    from mlx_invariants.fuzz.collect import harness_collect

    held: list = []

    def drop(phase: str, info: dict) -> None:
        if phase == "start":
            held.clear()

    with Sentinel(STEPS) as sentinel:
        _start_one_on_another_thread(held)
        gc.callbacks.append(drop)
        try:
            harness_collect() if collector == "the harness's" else gc.collect()
        finally:
            gc.callbacks.remove(drop)
    assert kinds(mlx_finalized_where_it_lives, sentinel.trace) == found
    assert len(sentinel.trace.of("mlx-gc")) == 1, sentinel.trace.of("mlx-gc")


# -- injected into a launched process ---------------------------------------------------------------
SEED_000 = """
import asyncio
from tests.fuzz.toy_engine import ToyEngine

async def main():
    engine = ToyEngine("plain")
    await engine.start()
    request = asyncio.ensure_future(engine.generate("a b c", 300))
    await asyncio.sleep(0.05)
    request.cancel()
    await asyncio.gather(request, return_exceptions=True)
    await engine.shutdown()

asyncio.run(main())
"""


def test_an_injected_process_is_observed_too(tmp_path: Path):
    out = tmp_path / "records.jsonl"
    done = subprocess.run([sys.executable, "-c", SEED_000], cwd=ROOT, env=sentinel_env(out, None), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    events, _ = read_records(str(out))
    trace = Trace()
    trace.merge(events)
    assert {e.kind for e in events} >= {"mlx", "sync", "work", "task"}
    assert kinds(lock_kept_over_its_work, trace) == ["lock-released-early"]


DECODE = ("mlx.core:eval", "mlx.core:array.item", "tests.fuzz.mlx_work:generate_step")


@pytest.mark.parametrize("where,found", [("loop", ["mlx-on-loop"]), ("thread", [])])
def test_decode_on_the_event_loop_is_found_and_off_it_is_not(where, found):
    with Sentinel(DECODE) as sentinel:
        async def main() -> None:
            mlx_work.generate_step(2)  # warm-up on the loop, before any request: not judged
            sentinel.trace.record("request", "submit", "r0")
            if where == "loop":
                mlx_work.generate_step(3)
            else:
                await asyncio.to_thread(mlx_work.generate_step, 3)
            assert mx.array([7]).item() == 7  # reading a token on the loop is no decode
        asyncio.run(main())
    assert any(span.info.get("on_loop") for span in sentinel.trace.of("mlx"))
    assert kinds(mlx_stays_off_the_loop, sentinel.trace) == found


HOLD = ("mlx.core:eval", "tests.fuzz.mlx_work:hold")


@pytest.mark.parametrize("holder_does,found", [("mlx", ["loop-waits-for-mlx"]), ("bookkeeping", [])])
def test_the_loop_waiting_for_a_lock_held_across_mlx_is_found_and_one_held_for_bookkeeping_is_not(holder_does, found):
    """The loop's `with lock:` waits while another thread holds the lock: across its MLX work that is the whole
    loop standing still for it; across plain bookkeeping, with the MLX done after the release, it is not."""
    with Sentinel(HOLD, observe=True) as sentinel:
        lock, entered, release = threading.Lock(), threading.Event(), threading.Event()

        def worker() -> None:
            with lock:
                if holder_does == "mlx":
                    mlx_work.hold(entered, release)
                else:
                    entered.set()
                    release.wait(10)
            mlx_work.hold(threading.Event(), release)  # after the release: nobody waits for it

        async def main() -> None:
            sentinel.trace.record("request", "submit", "r0")
            thread = threading.Thread(target=worker, name="owner")
            thread.start()
            assert await asyncio.to_thread(entered.wait, 10)
            threading.Timer(0.2, release.set).start()
            with lock:  # on the loop's thread
                pass
            await asyncio.to_thread(thread.join, 10)
        asyncio.run(main())
    assert sentinel.trace.of("sync", "wait"), "the loop's wait was not recorded"
    assert kinds(loop_never_waits_for_mlx, sentinel.trace) == found


def test_a_holder_that_let_go_before_its_mlx_kept_nobody_waiting_for_it():
    """The loop found the lock taken and waited 6 ms; the owner let it go at once and went into a prefill while
    the loop waited for a CPU: the wait is not the owner's MLX (seen on the served batched route, 0 of 3 replays).
    Only the part of the wait the hold still covered counts."""
    def trace_with(release_at: float) -> Trace:
        trace = Trace()
        trace.record("request", "submit", "r0")
        events = [Event(0, "sync", "acquire", thread=2, t=0.100, info={"lock": 7, "hold": 3}),
                  Event(0, "sync", "release", thread=2, t=release_at, info={"lock": 7, "hold": 3}),
                  Event(0, "mlx", "BatchGenerator.next", thread=2, t=0.102, t_end=0.110),
                  Event(0, "sync", "wait", thread=1, t=0.106, info={
                      "lock": 7, "since": 0.1005, "holder_thread": 2, "holder_hold": 3, "holder": "thread #2"})]
        for seq, event in enumerate(sorted(events, key=lambda e: e.t), 2):
            event.seq = seq
            trace.events.append(event)
        return trace
    assert kinds(loop_never_waits_for_mlx, trace_with(release_at=0.101)) == []
    assert kinds(loop_never_waits_for_mlx, trace_with(release_at=0.105)) == ["loop-waits-for-mlx"]
