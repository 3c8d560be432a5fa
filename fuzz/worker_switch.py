"""Worker faults in a launched server: its sentinel makes "the Nth MLX call from now" die or wedge when told.

In process, the points hook raises or blocks in the worker itself (fuzz/faults.py). A launched server
marks no points and runs threads nobody here wrote; what the fuzzer has inside it is the injected
sentinel, which sees every outermost MLX entry on every thread. So the sentinel listens on 127.0.0.1
(`WorkerSwitch`, its port in a file beside its records) and the fuzzer, at a point of a server scenario,
opens a connection and arms one fault on it (`ArmedFault`), one JSON object a line:

    fuzzer -> {"arm": "worker-dies" | "worker-wedges", "nth": N, "at": "r0@CHUNK_SENT(2)"}
    server -> {"armed": true}
    server -> {"fired": KIND, "thread": NAME, "call": LABEL}    at the Nth outermost MLX entry since arming
    fuzzer -> {"disarm": true}
    server -> {"disarmed": true}                                 unless it fired first

A fired "worker-dies" raises `WorkerKilled` (a `BaseException`) out of that MLX call, as the in-process
fault does; a fired "worker-wedges" blocks the call until the connection closes. An arming lives as long
as its connection: closing it disarms, and lets a wedged call go on, so a fuzzer that goes away (or ends
its scenario) never leaves the server wedged. Counting every thread's entries is deliberate: the fuzzer
does not know which thread is the server's worker, and the fired line names the thread that was hit.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from mlx_invariants.fuzz.errors import WorkerKilled

DIES, WEDGES = "worker-dies", "worker-wedges"
CONNECT_S = 5.0  # a server that does not take the connection by then has no switch (or is gone)


@dataclass(eq=False)
class _Arming:
    """One armed fault, owned by the connection that armed it."""

    kind: str
    left: int
    at: str
    conn: socket.socket
    released: threading.Event = field(default_factory=threading.Event)


class WorkerSwitch:
    """In the server: counts outermost MLX entries (`on_call`, from the sentinel) and fires what is armed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: list[_Arming] = []
        self._listener: Optional[socket.socket] = None

    def start(self, port_file: str) -> None:
        """Listen on a free 127.0.0.1 port, written to `port_file` (whole, or not at all)."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        self._listener = listener
        partial = f"{port_file}.part"
        Path(partial).write_text(str(listener.getsockname()[1]), encoding="utf-8")
        os.replace(partial, port_file)
        threading.Thread(target=self._accept, name="mlx-invariants-switch", daemon=True).start()

    def on_call(self, label: str) -> None:
        """One outermost MLX entry on this thread: fire the arming it completes, if any."""
        if not self._armed:  # the hot path: read without the lock, armed only between scenarios' points
            return
        with self._lock:
            for arming in self._armed:
                arming.left = max(0, arming.left - 1)
            due = next((a for a in self._armed if a.left == 0), None)
            if due is None:
                return
            self._armed.remove(due)
            _send(due.conn, {"fired": due.kind, "thread": threading.current_thread().name, "call": label})
        if due.kind == DIES:
            raise WorkerKilled(f"injected worker death at {due.at} (armed in the server's sentinel, in {label})")
        due.released.wait()

    def _accept(self) -> None:
        while True:
            conn, _ = self._listener.accept()
            threading.Thread(target=self._serve, args=(conn,), name="mlx-invariants-switch-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        """One connection: at most one arming, disarmed and let go when the connection closes."""
        arming: Optional[_Arming] = None
        try:
            with conn.makefile("rb") as lines:
                for raw in lines:
                    message = json.loads(raw)
                    with self._lock:
                        if "arm" in message and arming is None and message["arm"] in (DIES, WEDGES):
                            arming = _Arming(message["arm"], max(1, int(message.get("nth", 1))),
                                             str(message.get("at", "")), conn)
                            self._armed.append(arming)
                            _send(conn, {"armed": True})
                        elif "disarm" in message and arming in self._armed:
                            self._armed.remove(arming)
                            _send(conn, {"disarmed": True})
        except (OSError, ValueError, TypeError):
            pass  # a connection that breaks or talks nonsense ends like a closed one
        finally:
            with self._lock:
                if arming in self._armed:
                    self._armed.remove(arming)
            if arming is not None:
                arming.released.set()
            conn.close()


def _send(conn: socket.socket, message: dict[str, Any]) -> None:
    try:
        conn.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # the fuzzer went away: its arming goes with the connection


def switch_port(port_file: Path) -> Optional[int]:
    """The port a server's switch listens on, once it wrote it (None before, or with no switch)."""
    try:
        return int(port_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class ArmedFault:
    """In the fuzzer: one fault armed in a launched server's switch, on its own connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader, self._writer = reader, writer
        self.hit = False  # it fired: the server's worker died or wedged

    @classmethod
    async def arm(cls, port: int, kind: str, at: str, nth: int = 1) -> "ArmedFault":
        """Arm `kind` for the server's `nth` MLX entry from now; returns once the server said it is armed."""
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), CONNECT_S)
        writer.write(json.dumps({"arm": kind, "nth": nth, "at": at}).encode() + b"\n")
        armed = cls(reader, writer)
        if (await armed._next() or {}).get("armed") is not True:
            armed.release()
            raise ConnectionError(f"the server's switch on port {port} did not arm {kind}")
        return armed

    async def fired(self) -> Optional[dict[str, Any]]:
        """What fired ({"fired", "thread", "call"}), once it did; None once disarmed or let go first."""
        message = await self._next()
        self.hit = message is not None and "fired" in message
        return message if self.hit else None

    def disarm(self) -> None:
        """Ask for it not to fire after all; `fired()` then says which came first."""
        if not self._writer.is_closing():
            self._writer.write(b'{"disarm": true}\n')

    def release(self) -> None:
        """Close the connection: the server disarms it and lets a call it wedged go on."""
        self._writer.close()

    async def _next(self) -> Optional[dict[str, Any]]:
        try:
            line = await self._reader.readline()
        except (OSError, asyncio.IncompleteReadError):
            return None
        return json.loads(line) if line.strip() else None
