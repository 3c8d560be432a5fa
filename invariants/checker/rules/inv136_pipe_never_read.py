from __future__ import annotations

import libcst as cst

from mlx_invariants.checker.offload import keyword
from mlx_invariants.checker.rule import Invalid, Rule, Valid

_STARTS = frozenset({"subprocess.Popen", "asyncio.create_subprocess_exec", "asyncio.create_subprocess_shell",
                     "asyncio.subprocess.create_subprocess_exec", "asyncio.subprocess.create_subprocess_shell"})
_PIPES = frozenset({"subprocess.PIPE", "asyncio.subprocess.PIPE"})
_STREAMS = ("stdout", "stderr")


class PipeNeverRead(Rule):
    """A child process started with `stdout=PIPE` or `stderr=PIPE` writes into a pipe of a few tens of kilobytes
    (64 KiB on Linux and macOS). When nobody reads that pipe, the child's next write once it is full blocks for
    ever: a model server that logs each request stops answering after a few hundred requests, a tool that prints
    a long traceback never exits, and whoever waits for it (`proc.wait()`, a reply on its stdout) waits with it.
    Python's subprocess documentation warns of this deadlock. open-jarvis/OpenJarvis started its MCP servers
    with `stderr=PIPE` and read only their stdout, so a chatty server hung every tool call that reached it
    (src/openjarvis/mcp/transport.py@43f6bae:68-74, fixed in 619e033 by draining stderr on a thread);
    tumma72/mlx-manager's menubar starts its uvicorn server with both streams in one pipe it never reads, so the
    server's per-request log lines fill it (backend/mlx_manager/menubar.py@cffa5f2:127, graded true blind).

    The stream counts as read when the file reads it anywhere: `communicate()`, the stream's attribute
    (`proc.stderr.readline()`, `for line in proc.stdout`, a thread handed `proc.stderr`), or
    `asyncio.subprocess`'s `.communicate()`. A process that leaves the function it is made in (returned, yielded,
    passed to a call, as a name or as `self.x`) may be read elsewhere and is not judged; nor is a process whose stream is merged
    (`stderr=STDOUT`) or discarded (`DEVNULL`), or `subprocess.run`/`check_output`, which read for you."""

    id = "INV136"
    catches = "a child process started with stdout or stderr piped to the parent and that stream never read"
    message = (
        "`{stream}=PIPE` gives `{process}`'s {stream} to this process, and nothing in this file reads it: once the "
        "pipe's buffer (64 KiB) is full the child blocks on its next write, and so does everything waiting for "
        "it; read it (`communicate()`, a thread draining `{process}.{stream}`), or send it to a file, "
        "`subprocess.DEVNULL` or `stderr=subprocess.STDOUT` with a stdout you read"
    )
    known_problems = (
        "A stream read in another file (the process object kept on `self` and read by another module) is reported "
        "as unread, and a child that writes little (a short command, a quiet server) never fills the pipe: the "
        "finding is then latent, not live."
    )
    # Opt-in: on the HEADs of the 281 repositories mirrored here, 15 findings outside tests, benchmarks and examples,
    # graded blind (2026-11-29): 4 true (long-running servers and a display that log into the unread pipe: Impetus's
    # menubar, mlx-manager's menubar, echo-v3's receiver daemon, anyclaude's pipeline display), 8 arguable (a child
    # that writes too little to fill 64 KiB in normal use, code nothing calls, a command line the child rejects at
    # once), 3 false (a process whose start raises, so no pipe exists; a stream read through an object the process
    # was handed to, since followed). Whether the child writes enough is what decides, and the file does not say.
    default_enabled = False
    triggers = (("PIPE",), ("Popen", "create_subprocess"))

    INVALID = [
        Invalid('''
            import subprocess


            class StdioTransport:
                def __init__(self, command):
                    self._process = subprocess.Popen(  # expect: INV136
                        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    )

                def send(self, line):
                    self._process.stdin.write(line + "\\n")
                    self._process.stdin.flush()
                    return self._process.stdout.readline()
        '''),
        Invalid('''
            import asyncio


            class ServerManager:
                async def start(self, command):
                    self.process = await asyncio.create_subprocess_exec(  # expect: INV136
                        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                    )

                async def stop(self):
                    self.process.terminate()
                    await self.process.wait()
        '''),
    ]
    VALID = [
        Valid('''
            import subprocess
            import threading


            class StdioTransport:
                def __init__(self, command):
                    self._process = subprocess.Popen(
                        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    )
                    threading.Thread(target=self._drain, args=(self._process.stderr,), daemon=True).start()

                def _drain(self, stream):
                    for _ in stream:
                        pass

                def send(self, line):
                    self._process.stdin.write(line + "\\n")
                    self._process.stdin.flush()
                    return self._process.stdout.readline()
        '''),
        Valid('''
            import asyncio


            async def convert(command):
                process = await asyncio.create_subprocess_exec(
                    *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                )
                out, err = await process.communicate()
                return out
        '''),
        Valid('''
            import subprocess


            def spawn(command, log_errors):
                process = subprocess.Popen(command, stderr=subprocess.PIPE)
                log_errors(process)
                return process


            class Workers:
                def start(self, command, bridge):
                    self.worker = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                    self.bridge = bridge(self.worker)


            def start_server(command, log):
                return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


            def spawn(command):
                return subprocess.Popen(command, stdout=subprocess.PIPE)
        '''),
    ]

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        self.started: list[tuple[cst.Call, cst.CSTNode | None, list[str], str]] = []
        self.read: set[str] = set()
        self.communicates = False
        self.handed: set[str] = set()  # names returned, yielded or passed to a call: read elsewhere, perhaps

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "communicate":
            self.communicates = True
        if self.ctx.resolve(func) not in _STARTS:
            return
        piped = [s for s in _STREAMS if (value := keyword(node, s)) is not None and self.ctx.resolve(value) in _PIPES]
        holder = _holder(self.ctx.statement, node)
        if piped and holder is not None:
            self.started.append((node, self.ctx.statement, piped, holder))

    def visit_Return(self, node: cst.Return) -> None:
        if isinstance(node.value, cst.Name):
            self.handed.add(node.value.value)

    def visit_Yield(self, node: cst.Yield) -> None:
        if isinstance(node.value, cst.Name):
            self.handed.add(node.value.value)

    def visit_Arg(self, node: cst.Arg) -> None:
        value = node.value
        if isinstance(value, cst.Name):
            self.handed.add(value.value)
        elif isinstance(value, cst.Attribute) and isinstance(value.value, cst.Name):
            self.handed.add(f"{value.value.value}.{value.attr.value}")  # `bridge.receive(self.worker)`

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value in _STREAMS:
            self.read.add(node.attr.value)

    def end(self) -> None:
        if self.communicates:
            return
        for call, statement, piped, holder in self.started:
            if holder in self.handed:
                continue
            for stream in piped:
                if stream not in self.read:
                    self.ctx.report_at(self.id, call, statement, self.message.format(stream=stream, process=holder))
                    break


def _holder(statement: cst.CSTNode | None, call: cst.Call) -> str | None:
    """The name or attribute the new process is bound to by an assignment (`self._process = Popen(...)`, `proc =
    await create_subprocess_exec(...)`); None where it goes anywhere else (returned, passed on, used in place)."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if not isinstance(small, cst.Assign) or len(small.targets) != 1:
        return None
    value = small.value.expression if isinstance(small.value, cst.Await) else small.value
    if value is not call:
        return None
    target = small.targets[0].target
    if isinstance(target, cst.Name):
        return target.value
    if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name):
        return f"{target.value.value}.{target.attr.value}"
    return None

