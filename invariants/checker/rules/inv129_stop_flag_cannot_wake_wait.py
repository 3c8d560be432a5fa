from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from mlx_invariants.checker.names import dotted
from mlx_invariants.checker.rule import Invalid, Rule, Valid
from mlx_invariants.checker.walker import OWN_BODY_STOP, descendants

# Words a loop's stop flag is named by (`self._stop`, `self.running`, `shutdown_event`).
_FLAG_WORDS = frozenset({"stop", "stopped", "stopping", "running", "run", "shutdown", "closed", "closing", "alive",
                         "exit", "quit", "terminate", "terminated", "done", "active", "cancel", "cancelled"})
_WORD = re.compile(r"[A-Za-z][a-z]*")
# What wakes each blocking call, said on its receiver: a sentinel put, a set or notify, a close.
_WAKES = {"get": ("put", "put_nowait"), "wait": ("set", "notify", "notify_all"), "accept": ("close", "shutdown")}
_WAKE_WORDS = {"get": "puts to", "wait": "sets or notifies", "accept": "closes"}
_THREAD_WAITABLES = frozenset({"threading.Event", "threading.Condition", "threading.Barrier"})
# Defs whose name says they are the way out: a wake there counts even if the flag is set elsewhere.
_STOPPERS = frozenset({"stop", "close", "shutdown", "terminate", "cancel", "exit", "quit", "kill", "aclose"})


@dataclass
class _Block:
    call: cst.Call
    statement: cst.CSTNode | None
    receiver: str  # the key of what it waits on
    wait: str  # get / wait / accept
    flag: str  # the key of the loop's stop flag
    loop_test: str
    owner: cst.CSTNode  # the def whose loop it is


def _flag_words(text: str) -> bool:
    return bool({w.lower() for w in _WORD.findall(text.rsplit(".", 1)[-1])} & _FLAG_WORDS)


class StopFlagCannotWakeWait(Rule):
    """A thread that loops `while not stop_event.is_set():` (or `while
    self.running:`) and, inside, blocks with no timeout (`queue.get()`, an
    Event's `wait()`, a socket's `accept()`) reads its stop flag only between
    waits. Once the flag is set, the thread sits in the wait until something
    else wakes it, and if the stop path does not (a sentinel put on the queue,
    a `set()`, closing the socket) nothing does: a server's shutdown joins a
    thread that never returns, or leaves it running. speech-to-speech's socket
    sender looped `while not self.stop_event.is_set(): chunk = self.queue_in.get()`,
    and the pipeline's stop only set the event (connections/socket_sender.py@1548c06:31,
    fixed by a `get(timeout=...)` that re-checks the flag). Its `BaseHandler.run`
    did the same (baseHandler.py@4ba1fb1:31, `input = self.queue_in.get()`) while
    utils/thread_manager.py's `stop` only set each handler's event and joined; a6249d0
    gave that `get` a timeout.

    Judged: a `while` loop in a plain def whose test reads a stop flag (an
    Event's `is_set()`, or a name or attribute named like one: `_stop`,
    `running`, `shutdown`, `closed`), with a call in its body that blocks with no
    timeout: a zero-argument `get()` (a queue's: a dict's `get` takes a key), a
    `wait()` on an Event or Condition the file makes with threading, or a
    zero-argument `accept()` on a socket the file gives no timeout (`settimeout`),
    where the innermost `while` around the call is the flag's (an inner `while
    q.qsize() > limit: q.get()` waits on its own terms: TranscriptionSuite's STT
    engine). Not reported where a def of the file that sets the flag, or is named
    like a stop (`stop`, `close`, `shutdown`), also wakes that receiver: puts to
    the queue, sets or notifies the event, closes the socket."""

    id = "INV129"
    catches = "a thread loop that checks a stop flag but blocks with no timeout on a queue, event or socket nothing wakes at stop"
    message = (
        "`{call}` blocks with no timeout inside `while {test}`, and no stop path in this file {wake} `{receiver}`: "
        "once the flag is set the thread never gets back to it, and a shutdown that joins it hangs; wait with a "
        "timeout and re-check the flag, or have the stop path wake the wait"
    )
    known_problems = (
        "Reads one file: a stop path in another module that puts a sentinel or closes the socket is not seen, so "
        "such a loop is reported; a queue's producer that ends with a sentinel of its own (`put(None)` when done) "
        "counts only when the def that puts it also sets the flag or is named like a stop. A loop whose flag is "
        "named otherwise (`while self.serving:`) is not judged, nor a wait that is not a zero-argument `get()`, an "
        "Event's or Condition's `wait()` (made with threading in this file) or `accept()`: a socket's `recv`, a "
        "`join()` or a lock's `acquire()` are missed."
    )
    triggers = (("while",), (".get()", ".wait()", ".accept()"))

    INVALID = [
        Invalid('''
            class SocketSender:
                def __init__(self, stop_event, queue_in):
                    self.stop_event = stop_event
                    self.queue_in = queue_in

                def run(self):
                    while not self.stop_event.is_set():
                        chunk = self.queue_in.get()  # expect: INV129
                        self.conn.sendall(chunk)
        '''),
        Invalid('''
            import queue
            import threading

            class Decoder:
                def __init__(self):
                    self._jobs = queue.Queue()
                    self._stop = False
                    self._thread = threading.Thread(target=self._loop)

                def stop(self):
                    self._stop = True
                    self._thread.join()

                def _loop(self):
                    while not self._stop:
                        job = self._jobs.get()  # expect: INV129
                        job.run()
        '''),
    ]
    VALID = [
        # A socket given a timeout returns from accept() to the flag; an inner loop that drains while items
        # are known to be there cannot block (TranscriptionSuite's command server and STT engine).
        Valid('''
            import queue
            import socket

            class Server:
                def serve(self):
                    self.sock = socket.socket()
                    self.sock.settimeout(1.0)
                    while self.running:
                        try:
                            conn, _ = self.sock.accept()
                        except socket.timeout:
                            continue
                        self.handle(conn)

                def record(self):
                    while self.is_running:
                        while self.audio_queue.qsize() > self.limit:
                            self.audio_queue.get()
                        self.step()
        '''),
        # The stop path puts a sentinel on the queue.
        Valid('''
            import queue
            import threading

            class Decoder:
                def __init__(self):
                    self._jobs = queue.Queue()
                    self._stop = False
                    self._thread = threading.Thread(target=self._loop)

                def stop(self):
                    self._stop = True
                    self._jobs.put(None)
                    self._thread.join()

                def _loop(self):
                    while not self._stop:
                        job = self._jobs.get()
                        if job is None:
                            break
                        job.run()
        '''),
        # A timeout brings the thread back to the flag.
        Valid('''
            import queue

            class SocketSender:
                def run(self):
                    while not self.stop_event.is_set():
                        try:
                            chunk = self.queue_in.get(timeout=0.1)
                        except queue.Empty:
                            continue
                        self.conn.sendall(chunk)
        '''),
        # Closing the listening socket wakes accept() with an error.
        Valid('''
            import socket

            class Bridge:
                def serve(self):
                    self.sock = socket.socket()
                    while self.running:
                        conn, _ = self.sock.accept()
                        self.handle(conn)

                def stop(self):
                    self.running = False
                    self.sock.close()
        '''),
        # The loop accepts on a local that the def also keeps on `self`: closing the attribute closes that socket.
        Valid('''
            import socket

            class IpcServer:
                def _serve(self):
                    server = socket.socket(socket.AF_UNIX)
                    server.listen(1)
                    self._server = server
                    while self._running:
                        client, _ = server.accept()
                        self.handle(client)

                def stop(self):
                    self._running = False
                    if self._server is not None:
                        self._server.close()
        '''),
        # Waiting on the stop event itself returns when it is set; an unknown `wait()` is no thread wait.
        Valid('''
            import sounddevice as sd

            def record(stop_recording):
                while not stop_recording.is_set():
                    stop_recording.wait()
                    sd.wait()
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.blocks: list[_Block] = []
        self.waitables: set[str] = set()  # keys of names the file binds to a threading Event or Condition
        # per def: its name, the keys it sets as a flag, and (wait kind, receiver key) it wakes
        self.defs: dict[int, tuple[str, set[str], set[tuple[str, str]]]] = {}
        # the `while` loops the walk is in: (loop, its stop flag's key or None, test text, the plain def it is in)
        self.loops: list[tuple[cst.While, str | None, str, cst.FunctionDef | None]] = []
        self.timed: set[str] = set()  # keys of sockets given a timeout (`sock.settimeout(1.0)`): accept() returns
        # per def: the keys one of its plain assignments makes name the same object (`self._server = server`), both
        # ways: a wake or timeout said on either reaches the wait on the other
        self.aliases: dict[int, dict[str, set[str]]] = {}

    def visit_Assign(self, node: cst.Assign) -> None:
        if isinstance(node.value, cst.Call) and self.ctx.resolve(node.value.func) in _THREAD_WAITABLES:
            self.waitables.update(k for t in node.targets if (k := self.ctx.key(t.target)))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        sets: set[str] = set()
        wakes: set[tuple[str, str]] = set()
        for inner in descendants(node.body, OWN_BODY_STOP):
            kind = type(inner)  # exact classes: isinstance against libcst's ABC is slow, and this sees every node
            if kind is cst.Assign:
                targets = {k for t in inner.targets if (k := self.ctx.key(t.target))}
                sets.update(targets)
                if (value := self.ctx.key(inner.value)) is not None and targets:
                    aliases = self.aliases.setdefault(id(node), {})
                    for target in targets:
                        aliases.setdefault(target, set()).add(value)
                        aliases.setdefault(value, set()).add(target)
            elif kind is cst.Call and type(inner.func) is cst.Attribute:
                method, receiver = inner.func.attr.value, self.ctx.key(inner.func.value)
                if receiver is None:
                    continue
                if method == "set":
                    sets.add(receiver)
                wakes.update((wait, receiver) for wait, verbs in _WAKES.items() if method in verbs)
        self.defs[id(node)] = (node.name.value, sets, wakes)

    def visit_While(self, node: cst.While) -> None:
        function = self.ctx.scope.function()
        plain = function is not None and isinstance(function.node, cst.FunctionDef) and \
            function.node.asynchronous is None
        flag = self._flag(node.test) if plain else None
        self.loops.append((node, flag, cst.Module([]).code_for_node(node.test) if flag else "",
                           function.node if plain else None))  # type: ignore[union-attr]

    def leave_While(self, node: cst.While) -> None:
        if self.loops and self.loops[-1][0] is node:
            self.loops.pop()

    def visit_Call(self, node: cst.Call) -> None:
        if type(node.func) is cst.Attribute and node.func.attr.value == "settimeout" and node.args \
                and not (isinstance(node.args[0].value, cst.Name) and node.args[0].value.value == "None"):
            if (key := self.ctx.key(node.func.value)) is not None:
                self.timed.add(key)
        if not self.loops:
            return
        # the innermost `while` must be the flag's: an inner loop that waits on its own terms (`while
        # q.qsize() > limit: q.get()`) is not the flag loop's wait
        loop, flag, test, owner = self.loops[-1]
        function = self.ctx.scope.function()
        if flag is None or function is None or function.node is not owner or \
                (wait := self._blocking(node, flag)) is None:
            return
        receiver = self.ctx.key(node.func.value)  # type: ignore[attr-defined]
        self.blocks.append(_Block(node, self.ctx.statement, receiver, wait, flag, test, owner))

    def _flag(self, test: cst.BaseExpression) -> str | None:
        """The key of the stop flag `test` reads: an Event's `is_set()`, or a name or attribute named like one."""
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return self._flag(test.expression)
        if isinstance(test, cst.BooleanOperation):
            return self._flag(test.left) or self._flag(test.right)
        if isinstance(test, cst.Call) and isinstance(test.func, cst.Attribute) and test.func.attr.value == "is_set":
            return self.ctx.key(test.func.value)
        if isinstance(test, cst.Name | cst.Attribute) and _flag_words(dotted(test) or ""):
            return self.ctx.key(test)
        return None

    def _blocking(self, call: cst.Call, flag: str) -> str | None:
        func = call.func
        if not isinstance(func, cst.Attribute) or self.ctx.key(func.value) is None:
            return None
        method, names = func.attr.value, {a.keyword.value for a in call.args if a.keyword is not None}
        positional = [a for a in call.args if a.keyword is None]
        if method == "get" and not positional and not names & {"timeout", "block"}:
            return "get"
        if method == "wait" and not call.args:  # an Event's or Condition's: end() asks, once the file is read
            return "wait" if self.ctx.key(func.value) != flag else None
        if method == "accept" and not call.args:
            return "accept"
        return None

    def end(self) -> None:
        for block in self.blocks:
            receivers = {block.receiver, *self.aliases.get(id(block.owner), {}).get(block.receiver, ())}
            if block.wait == "wait" and not receivers & self.waitables:
                continue
            if block.wait == "accept" and receivers & self.timed:
                continue
            if any(owner != id(block.owner) and any((block.wait, receiver) in wakes for receiver in receivers)
                   and (block.flag in sets or name.lower().lstrip("_").split("_")[0] in _STOPPERS)
                   for owner, (name, sets, wakes) in self.defs.items()):
                continue
            self.ctx.report_at(self.id, block.call, block.statement, self.message.format(
                call=f"{dotted(block.call.func)}()", test=block.loop_test,
                receiver=dotted(block.call.func.value), wake=_WAKE_WORDS[block.wait]))  # type: ignore[attr-defined]
