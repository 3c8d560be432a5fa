"""The trace itself: a record made while the same thread is recording (a finalizer the collector runs
there) neither deadlocks nor numbers events out of the order they are stored in."""

from __future__ import annotations

import threading

from mlx_invariants.fuzz.trace import Trace


def test_recording_from_inside_a_record_on_the_same_thread_neither_hangs_nor_misorders():
    trace = Trace()

    class Finalizing:
        """An info mapping whose reading records into the trace, as a finalizer collected mid-record would."""

        def keys(self):
            trace.record("stale", "SLOT_RELEASED", "r9~1")
            return ["step"]

        def __getitem__(self, key):
            return 1

    worker = threading.Thread(target=trace.record, args=("point", "BEFORE_DECODE", "r0"),
                              kwargs={"info": Finalizing()}, daemon=True)
    worker.start()
    worker.join(5.0)
    assert not worker.is_alive(), "recording from inside a record waited on the trace's own lock"
    assert [(e.seq, e.name) for e in trace.events] == [(1, "SLOT_RELEASED"), (2, "BEFORE_DECODE")]
