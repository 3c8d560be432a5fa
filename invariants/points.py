"""`Point`: the named facts of a request's life, shared by the engine that marks them and the fuzzer.

The one declaration of the points vocabulary (docs/fuzz-reference.md's point table is
generated from it). Each member says which side reaches it, whether a hook
may raise there, and whether it takes an index:

- `Side.LOOP`: the engine marks it on the event loop's thread. A hook there
  records or schedules work; it never blocks or raises.
- `Side.OWNER`: the engine marks it on the thread doing the request's MLX work
  (the owner). A hook may block there while the loop takes a fault, and, where
  `may_raise`, raise as if the MLX call at that spot failed.
- `Side.CLIENT`: only the fuzzer's own HTTP client reaches it
  (fuzz/adapters/http.py), on the event loop; no engine marks it. These live
  in the same enum so a scenario names every point the same way.

`over_http`: a client of a server reaches it too, so scenarios against a
server may aim there. `index`: the info key that numbers it (`step`, `index`),
counted from `first_index`.

Base layer: imports nothing of ours, so the checker-only install, the engine
and the fuzzer can all import it.
"""

from __future__ import annotations

import enum
from typing import Optional


class Side(enum.Enum):
    """Which thread reaches a point, which decides how a fault due there is delivered."""

    LOOP = "loop"
    OWNER = "owner"
    CLIENT = "client"


class Point(enum.Enum):
    """A fact an engine marks where it happens: `reach(Point.SLOT_ACQUIRED, rid)`.

    Simplest first: the fuzzer's shrinking moves a fault towards the front of this list.
    """

    # value, side, may_raise, index key, first index, over HTTP, where it is marked, what the fuzzer does there
    ADMITTED = ("admitted", Side.LOOP, False, None, 0, True,
                "the loop, once the engine has accepted the request (before it waits for a slot); an HTTP "
                "client: a streaming response began, or a non-streaming request's whole body was sent",
                "delivers the faults aimed there (an adapter that marks nothing else marks it in `submit`, as "
                "the walkthrough's does)")
    SLOT_ACQUIRED = ("slot_acquired", Side.LOOP, False, None, 0, False,
                     "the loop, once the request holds its slot (a serialised engine) or is queued for the "
                     "worker (a batching one)",
                     "delivers the faults aimed there")
    WORKER_STARTED = ("worker_started", Side.OWNER, True, None, 0, False,
                      "the worker, before the request's first MLX work",
                      "pauses the worker for the faults aimed there; a `raise` here stands for MLX failing on "
                      "the request's first call; with `FINISHED` and `SLOT_RELEASED`, `slot-freed-early`")
    PREFILL_DONE = ("prefill_done", Side.OWNER, True, None, 0, False,
                    "the worker, once the prompt is processed and the first token sampled",
                    "pauses, or raises as if the prefill failed")
    BEFORE_DECODE = ("before_decode", Side.OWNER, True, "step", 1, False,
                     "the worker, before decode step k: k tokens are out, so the first is step 1 (the prefill "
                     "samples token 0)",
                     "pauses, or raises as if step k failed; more than 2 of them after a delivered cancel, "
                     "disconnect or acknowledged abort: `abort-ignored`")
    CHUNK_SENT = ("chunk_sent", Side.LOOP, False, "index", 0, True,
                  "the loop, as chunk k (from 0) is handed to the client; an HTTP client: chunk k received",
                  "delivers the faults aimed at chunk k")
    FINISHED = ("finished", Side.OWNER, False, None, 0, False,
                "the worker, once the request's last MLX work is over: in a `finally`, so it comes exactly once "
                "on every path (completed, aborted, failed, raised)",
                "pauses (a fault here lands after the MLX work); missing or after `SLOT_RELEASED`: "
                "`slot-freed-early`; twice: `request-ended-twice`")
    SLOT_RELEASED = ("slot_released", Side.LOOP, False, None, 0, False,
                     "the loop, once the request's slot or seat is free again and handed to the next waiter, if one "
                     "waits (a cancel here meets a waiter granted in this very turn)",
                     "delivers the faults aimed there; before `FINISHED`: `slot-freed-early`")
    OWNER_IDLE = ("owner_idle", Side.OWNER, False, None, 0, False,
                  "the owner, once it found nothing to do and decided to sleep, before it waits for work: "
                  "marked with the request it ended last (never before its first)",
                  "pauses the owner there, between its check and its wait, while the arrivals and faults aimed "
                  "there are posted: an owner that loses that wake-up sleeps on, and the request waits (a stall)")
    SERVER_STEP = ("server_step", Side.CLIENT, False, "index", 0, True,
                   "the fuzzer's HTTP client, while it waits for its response: the launched server's sentinel "
                   "recorded its k-th MLX entry (from 0) since the body was sent",
                   "delivers the faults aimed there (only a launched server has records: a `--url` target "
                   "never reaches it)")
    BODY_PART = ("body_part", Side.CLIENT, False, None, 0, True,
                 "the fuzzer's HTTP client, with the headers (full `Content-Length`) and half the JSON body on "
                 "the wire",
                 "delivers the faults aimed there; after a client went there, a follow-up not begun within the "
                 "admission bound: `cut-body-blocks`")

    def __new__(cls, value: str, side: Side, may_raise: bool, index: Optional[str], first_index: int,
                over_http: bool, marked: str, fuzzer: str) -> "Point":
        member = object.__new__(cls)
        member._value_ = value
        member.side = side
        member.may_raise = may_raise
        member.index = index
        member.first_index = first_index
        member.over_http = over_http
        member.marked = marked
        member.fuzzer = fuzzer
        return member

    @property
    def indexed(self) -> bool:
        """Whether a fault aimed here names which one (decode step k, chunk k, MLX entry k)."""
        return self.index is not None

    @property
    def may_block(self) -> bool:
        """Whether the hook may block the caller while the loop takes a fault (owner-side points only)."""
        return self.side is Side.OWNER

    @property
    def engine_marks(self) -> bool:
        """Whether an engine marks it (every side but the fuzzer's own HTTP client)."""
        return self.side is not Side.CLIENT
