"""The static rules, in id order. Each module holds one rule and its examples."""

from __future__ import annotations

from mlx_invariants.checker.rule import Rule
from mlx_invariants.checker.rules.inv101_long_wait_in_request_path import LongWaitInRequestPath
from mlx_invariants.checker.rules.inv102_lock_as_admission_queue import LockAsAdmissionQueue
from mlx_invariants.checker.rules.inv103_undocumented_serialization_lock import UndocumentedSerializationLock
from mlx_invariants.checker.rules.inv104_nested_lock_reacquisition import NestedLockReacquisition
from mlx_invariants.checker.rules.inv105_lock_released_before_worker import LockReleasedBeforeWorker
from mlx_invariants.checker.rules.inv106_cancellation_drain_hides_errors import CancellationDrainHidesErrors
from mlx_invariants.checker.rules.inv107_mlx_off_owner_thread import MlxOffOwnerThread
from mlx_invariants.checker.rules.inv108_blocking_mlx_on_event_loop import BlockingMlxOnEventLoop
from mlx_invariants.checker.rules.inv109_ignored_readiness import IgnoredReadiness
from mlx_invariants.checker.rules.inv110_ready_signalled_on_failure import ReadySignalledOnFailure
from mlx_invariants.checker.rules.inv111_probe_leaked_on_error import ProbeLeakedOnError
from mlx_invariants.checker.rules.inv112_cancellation_swallowed import CancellationSwallowed
from mlx_invariants.checker.rules.inv113_task_reference_dropped import TaskReferenceDropped
from mlx_invariants.checker.rules.inv114_thread_lock_on_event_loop import ThreadLockOnEventLoop
from mlx_invariants.checker.rules.inv115_thread_join_unchecked import ThreadJoinUnchecked
from mlx_invariants.checker.rules.inv116_executor_never_shut_down import ExecutorNeverShutDown
from mlx_invariants.checker.rules.inv117_shield_reawaited_after_cancel import ShieldReawaitedAfterCancel
from mlx_invariants.checker.rules.inv118_stream_binding_skipped import StreamBindingSkipped
from mlx_invariants.checker.rules.inv119_mlx_callable_offloaded_and_inline import MlxCallableOffloadedAndInline
from mlx_invariants.checker.rules.inv120_mlx_on_loop_beside_worker import MlxOnLoopBesideWorker
from mlx_invariants.checker.rules.inv121_worker_loop_ignores_cancel import WorkerLoopIgnoresCancel
from mlx_invariants.checker.rules.inv122_worker_stops_without_waking_waiters import WorkerStopsWithoutWakingWaiters
from mlx_invariants.checker.rules.inv123_stream_deadline_from_start import StreamDeadlineFromStart
from mlx_invariants.checker.rules.inv124_state_locked_inconsistently import StateLockedInconsistently
from mlx_invariants.checker.rules.inv125_mlx_outside_declared_lock import MlxOutsideDeclaredLock
from mlx_invariants.checker.rules.inv126_busy_wait import BusyWait
from mlx_invariants.checker.rules.inv127_lazy_mlx_result_memoised import LazyMlxResultMemoised
from mlx_invariants.checker.rules.inv128_cleanup_skipped_on_cancel import CleanupSkippedOnCancel
from mlx_invariants.checker.rules.inv129_stop_flag_cannot_wake_wait import StopFlagCannotWakeWait
from mlx_invariants.checker.rules.inv130_blocking_wait_on_event_loop import BlockingWaitOnEventLoop
from mlx_invariants.checker.rules.inv131_stream_used_off_its_thread import StreamUsedOffItsThread
from mlx_invariants.checker.rules.inv132_generator_closed_while_stepped import GeneratorClosedWhileStepped
from mlx_invariants.checker.rules.inv133_loop_object_used_off_loop import LoopObjectUsedOffLoop
from mlx_invariants.checker.rules.inv134_offloaded_call_on_event_loop import OffloadedCallOnEventLoop
from mlx_invariants.checker.rules.inv135_timeout_outlived_by_pool_exit import TimeoutOutlivedByPoolExit
from mlx_invariants.checker.rules.inv136_pipe_never_read import PipeNeverRead
from mlx_invariants.checker.rules.inv137_blocking_http_on_event_loop import BlockingHttpOnEventLoop
from mlx_invariants.checker.rules.inv138_blocking_inference_on_event_loop import BlockingInferenceOnEventLoop
from mlx_invariants.checker.rules.inv139_coupled_coroutines_gathered import CoupledCoroutinesGathered
from mlx_invariants.checker.rules.inv140_container_changed_across_await import ContainerChangedAcrossAwait
from mlx_invariants.checker.rules.inv141_lock_taken_by_abandoned_thread import LockTakenByAbandonedThread

RULES: list[type[Rule]] = [
    LongWaitInRequestPath,
    LockAsAdmissionQueue,
    UndocumentedSerializationLock,
    NestedLockReacquisition,
    LockReleasedBeforeWorker,
    CancellationDrainHidesErrors,
    MlxOffOwnerThread,
    BlockingMlxOnEventLoop,
    IgnoredReadiness,
    ReadySignalledOnFailure,
    ProbeLeakedOnError,
    CancellationSwallowed,
    TaskReferenceDropped,
    ThreadLockOnEventLoop,
    ThreadJoinUnchecked,
    ExecutorNeverShutDown,
    ShieldReawaitedAfterCancel,
    StreamBindingSkipped,
    MlxCallableOffloadedAndInline,
    MlxOnLoopBesideWorker,
    WorkerLoopIgnoresCancel,
    WorkerStopsWithoutWakingWaiters,
    StreamDeadlineFromStart,
    StateLockedInconsistently,
    MlxOutsideDeclaredLock,
    BusyWait,
    LazyMlxResultMemoised,
    CleanupSkippedOnCancel,
    StopFlagCannotWakeWait,
    BlockingWaitOnEventLoop,
    StreamUsedOffItsThread,
    GeneratorClosedWhileStepped,
    LoopObjectUsedOffLoop,
    OffloadedCallOnEventLoop,
    TimeoutOutlivedByPoolExit,
    PipeNeverRead,
    BlockingHttpOnEventLoop,
    BlockingInferenceOnEventLoop,
    CoupledCoroutinesGathered,
    ContainerChangedAcrossAwait,
    LockTakenByAbandonedThread,
]

__all__ = ["RULES", *(r.__name__ for r in RULES)]
