"""The MLX access sentinel on real (CPU) MLX: what it sees, what it refuses, and that it leaves no trace."""

from __future__ import annotations

import sys
import threading

import mlx.core as mx
import pytest

from mlx_invariants.fuzz.oracles import judge, mlx_never_concurrent, mlx_only_on_owner, no_stream_errors
from mlx_invariants.fuzz.sentinel import DEFAULT_TARGETS, Sentinel, SentinelError
from mlx_invariants.fuzz.trace import thread_token
from tests.fuzz import mlx_work

TARGETS = DEFAULT_TARGETS + ("tests.fuzz.mlx_work:hold", "tests.fuzz.mlx_work:nested",
                             "tests.fuzz.mlx_work:steps", "tests.fuzz.mlx_late:work")


def kinds(found) -> list[str]:
    return [v.kind for v in found]


def inside_on_thread(sentinel_release: threading.Event, errors: list) -> threading.Thread:
    """A thread that enters MLX and stays inside until `sentinel_release` is set."""
    entered = threading.Event()

    def run() -> None:
        try:
            mlx_work.hold(entered, sentinel_release)
        except Exception as exc:  # surfaced by the test
            errors.append(exc)
    thread = threading.Thread(target=run, name="holder")
    thread.start()
    assert entered.wait(10)
    return thread


def test_two_threads_inside_mlx_are_reported_with_both_stacks():
    release, errors = threading.Event(), []
    with Sentinel(TARGETS) as sentinel:
        holder = inside_on_thread(release, errors)
        mx.eval(mx.ones(2) + 1)  # the main thread enters while the holder is inside
        release.set()
        holder.join()
    found = list(mlx_never_concurrent(sentinel.trace))
    assert kinds(found) == ["mlx-concurrent"]
    first, second = found[0].stacks
    assert any("in hold" in line for line in first) or any("in run" in line for line in first)
    assert any("test_two_threads_inside_mlx" in line for line in second)
    assert errors == []


def test_strict_mode_refuses_the_second_entrant():
    release, errors = threading.Event(), []
    with Sentinel(TARGETS, strict=True) as sentinel:
        holder = inside_on_thread(release, errors)
        with pytest.raises(SentinelError, match="holder"):
            mx.eval(mx.ones(2))
        release.set()
        holder.join()
    refused = [e for e in sentinel.trace.of("mlx") if e.info.get("refused")]
    assert len(refused) == 1 and kinds(mlx_never_concurrent(sentinel.trace)) == ["mlx-concurrent"]


def test_entry_off_a_named_owner_is_reported():
    with Sentinel(TARGETS, owner="mlx-owner*") as sentinel:
        mx.eval(mx.ones(2))
    assert kinds(mlx_only_on_owner(sentinel.trace)) == ["mlx-off-owner"]
    with Sentinel(TARGETS, owner="MainThread") as sentinel:
        mx.eval(mx.ones(2))
    assert kinds(mlx_only_on_owner(sentinel.trace)) == []


def test_declared_owner_by_thread_token():
    with Sentinel(TARGETS) as sentinel:
        def owner() -> None:
            sentinel.declare_owner()
            mx.eval(mx.ones(2))
        thread = threading.Thread(target=owner)
        thread.start()
        thread.join()
        mx.eval(mx.ones(2))  # the main thread is not the owner
    found = list(mlx_only_on_owner(sentinel.trace))
    assert kinds(found) == ["mlx-off-owner"] and "MainThread" in found[0].message


def test_array_built_on_one_thread_and_evaluated_on_another_is_a_no_stream_error():
    stream = mx.new_thread_local_stream(mx.default_device())
    with mx.stream(stream):
        lazy = mx.ones(3) * 2  # not evaluated: bound to this thread's stream
    errors = []
    with Sentinel(TARGETS) as sentinel:
        thread = threading.Thread(target=lambda: _eval_catching(lazy, errors))
        thread.start()
        thread.join()
    assert errors and "There is no Stream" in str(errors[0])
    assert kinds(no_stream_errors(sentinel.trace)) == ["mlx-no-stream"]


def _stream_used_elsewhere(maker: str) -> tuple[list, Sentinel]:
    """A stream made on this thread by `mx.<maker>`, then used on a thread named request-worker."""
    errors: list = []
    with Sentinel(TARGETS) as sentinel:
        stream = getattr(mx, maker)(mx.default_device())

        def elsewhere() -> None:
            with mx.stream(stream):
                _eval_catching(mx.ones(3) * 2, errors)
        thread = threading.Thread(target=elsewhere, name="request-worker")
        thread.start()
        thread.join()
    return errors, sentinel


def test_a_no_stream_error_names_the_thread_that_made_the_stream():
    errors, sentinel = _stream_used_elsewhere("new_stream")
    [found] = no_stream_errors(sentinel.trace)
    assert errors and "(request-worker)" in found.message
    assert "made on MainThread (" in found.message and "test_sentinel.py" in found.message, found.message
    assert not hasattr(mx.new_stream, "__mlx_sentinel__")  # put back at uninstall


def test_a_thread_local_stream_may_be_shared_between_threads():
    """MLX >= 0.31.2: each thread that uses it gets its own instance, so nothing raises or is reported."""
    errors, sentinel = _stream_used_elsewhere("new_thread_local_stream")
    assert errors == [] and list(no_stream_errors(sentinel.trace)) == []


def _eval_catching(array, errors: list) -> None:
    try:
        mx.eval(array)
    except RuntimeError as exc:
        errors.append(exc)


def test_reentrant_calls_on_one_thread_count_once():
    with Sentinel(TARGETS) as sentinel:
        assert mlx_work.nested() == 3
    spans = sentinel.trace.of("mlx")
    assert [s.name for s in spans] == ["mlx_work.nested"]
    assert judge(sentinel.trace) == []


def test_every_resume_of_a_generator_is_an_entry():
    with Sentinel(TARGETS) as sentinel:
        assert list(mlx_work.steps(3)) == [0, 1, 2]
    assert [s.name for s in sentinel.trace.of("mlx")] == ["mlx_work.steps"] * 4  # three yields and the end


def test_modules_imported_later_are_wrapped_on_import():
    sys.modules.pop("tests.fuzz.mlx_late", None)
    with Sentinel(TARGETS) as sentinel:
        from tests.fuzz import mlx_late
        assert mlx_late.work() == 2.0
    assert [s.name for s in sentinel.trace.of("mlx")] == ["mlx_late.work"]


def test_uninstall_restores_every_entry_point_and_alias():
    import mlx_lm
    import mlx_lm.generate  # noqa: F401
    generate_module = sys.modules["mlx_lm.generate"]
    before = (mx.eval, mx.array.item, generate_module.stream_generate, mlx_lm.stream_generate,
              generate_module.BatchGenerator.next)
    with Sentinel(TARGETS):
        assert mx.eval is not before[0] and mlx_lm.stream_generate is not before[3]
    after = (mx.eval, mx.array.item, generate_module.stream_generate, mlx_lm.stream_generate,
             generate_module.BatchGenerator.next)
    assert all(a is b for a, b in zip(after, before))
    assert "item" not in vars(mx.array) or vars(mx.array)["item"] is before[1]


def test_thread_tokens_are_never_reused():
    tokens = []
    for _ in range(3):
        thread = threading.Thread(target=lambda: tokens.append(thread_token()))
        thread.start()
        thread.join()
    assert len(set(tokens)) == 3 and thread_token() not in tokens


def test_the_fixture_passes_a_clean_test(mlx_sentinel):
    mlx_sentinel.owner = "MainThread"
    mx.eval(mx.ones(2))
    assert len(mlx_sentinel.trace.of("mlx")) == 1


def test_aliases_bound_while_installed_are_restored_too():
    for name in [m for m in sys.modules if m == "mlx_lm" or m.startswith("mlx_lm.")]:
        sys.modules.pop(name)
    with Sentinel(TARGETS):
        import mlx_lm  # binds mlx_lm.stream_generate to the wrapper while the sentinel is in
        assert getattr(mlx_lm.stream_generate, "__mlx_sentinel__", None) is not None
    assert getattr(mlx_lm.stream_generate, "__mlx_sentinel__", None) is None
    assert mlx_lm.stream_generate is sys.modules["mlx_lm.generate"].stream_generate


@pytest.mark.parametrize("read", [float, int, bool], ids=["float", "int", "bool"])
def test_a_value_read_out_of_an_array_off_the_owner_is_reported(read):
    # float(a), int(a) and `if a:` evaluate a lazy array on the thread that asks, as a.item() does.
    with Sentinel(owner="mlx-owner*", observe=False) as sentinel:
        read(mx.array(1) + 1)
    found = list(mlx_only_on_owner(sentinel.trace))
    assert kinds(found) == ["mlx-off-owner"] and f"__{read.__name__}__" in found[0].message, found
