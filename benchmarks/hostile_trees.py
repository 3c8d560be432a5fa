"""Hostile source trees for `invariants check`: each is built in its own folder and checked on its own.

The checker's own tests (tests/invariants/) pin the exact findings; this only
asks, from outside, what the reliability table needs: did the run complete
within its bound, with a documented exit code (0 clean, 1 findings), no
traceback, and one clear line for each file it could not read?
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

TIMEOUT_S = 60.0        # per case; a checker that opens a FIFO would wait forever
HUGE_TIMEOUT_S = 300.0  # libcst on 5 MB of code, on a slow shared box
# Where the checker's speed on a large module is measured (quiet box, repeated rounds, peak memory); a time
# taken here, among the reliability run's other jobs, would contradict it, so it is not quoted.
CHECKER_SPEED = "benchmarks.md#the-static-checker-cold-run-against-libcsts-own-parse"
DOCUMENTED_EXITS = {0, 1}


@dataclass
class Case:
    name: str
    tried: str
    build: Callable[[Path], None]
    unreadable: Optional[str] = None   # a file that must be reported as one INV000 line
    skip_why: Optional[str] = None
    timeout_s: float = TIMEOUT_S
    timed_in: Optional[str] = None     # a doc section that measures this case's speed: its time is not quoted


@dataclass
class Outcome:
    case: Case
    held: bool
    outcome: str
    figures: dict = field(default_factory=dict)
    seconds: float = 0.0


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _huge_module(path: Path, megabytes: float = 5) -> None:
    """Valid async code of about this size, shaped like what the rules look at."""
    block = ("async def handler_{i}(request, lock):\n"
             "    async with lock:\n"
             "        result = await asyncio.to_thread(step_{i}, request)\n"
             "    return {{'id': {i}, 'value': result}}\n\n")
    chunks, size, i = ["import asyncio\n\n"], 0, 0
    while size < megabytes * 1024 * 1024:
        chunk = block.format(i=i)
        chunks.append(chunk)
        size += len(chunk)
        i += 1
    _write(path, "".join(chunks).encode())


def elif_chain(branches: int = 5_000) -> str:
    """A coroutine whose body ends in one `if/elif` chain of this many branches: valid Python, but
    each `elif` is an `If` inside the one before, so the tree is as deep as the chain is long (a
    real module of this shape crashed the whole run with a RecursionError before issue 23)."""
    lines = ["import asyncio", "", "", "async def route(code, lock, step):",
             "    async with lock:", "        await asyncio.to_thread(step)", "    if code == 0:", "        return 0"]
    for i in range(1, branches):
        lines += [f"    elif code == {i}:", f"        return await asyncio.wait_for(step(), timeout={i})"]
    return "\n".join(lines) + "\n"


def call_chain(links: int = 3_000) -> str:
    """A coroutine returning one method chain `query.where(c, d=1).where(c, d=1)...` this long: valid
    Python on which libcst's parser takes minutes (its time grows faster than the cube of the
    length: 800 links 18 s), so only a time limit ends it."""
    return ("import asyncio\n\n\nasync def build(lock, query, step):\n    async with lock:\n"
            "        await asyncio.to_thread(step)\n    return query" + ".where(c, d=1)" * links + "\n")


def _symlink_loop(root: Path) -> None:
    (root / "a").mkdir(parents=True)
    (root / "a" / "ok.py").write_text("x = 1\n")
    os.symlink(root / "b", root / "a" / "to_b")
    os.symlink(root / "a", root / "b")
    os.symlink(root / "self", root / "self")


def _fifo(root: Path) -> None:
    root.mkdir(parents=True)
    os.mkfifo(root / "pipe.py")  # opening it for reading would block forever


def _unreadable(root: Path) -> None:
    _write(root / "secret.py", b"x = 1\n")
    (root / "secret.py").chmod(0)


def cases() -> list[Case]:
    root_reads_all = os.geteuid() == 0 if hasattr(os, "geteuid") else False
    return [
        Case("syntax-error", "a file that does not parse", lambda d: _write(d / "bad.py", b"def f(:\n"), "bad.py"),
        Case("non-utf8", "Latin-1 bytes without an encoding cookie",
             lambda d: _write(d / "latin.py", b"x = '\xff\xfe caf\xe9'\n"), "latin.py"),
        Case("nul-bytes", "NUL bytes inside a module", lambda d: _write(d / "nul.py", b"x = 1\x00\ny = 2\n"), "nul.py"),
        Case("huge-module", "a 5 MB generated module", lambda d: _huge_module(d / "huge.py"),
             timeout_s=HUGE_TIMEOUT_S),
        Case("large-module", "a 1.9 MB generated module (parsed: under the default size limit)",
             lambda d: _huge_module(d / "large.py", 1.9), timeout_s=HUGE_TIMEOUT_S, timed_in=CHECKER_SPEED),
        Case("deep-parens", "an expression nested 5000 parentheses deep",
             lambda d: _write(d / "parens.py", b"x = " + b"(" * 5000 + b"1" + b")" * 5000 + b"\n"), "parens.py"),
        Case("deep-binop", "a 100000-term binary expression (deep tree, valid Python)",
             lambda d: _write(d / "chain.py", b"x = " + b" + ".join([b"1"] * 100_000) + b"\n")),
        Case("deep-calls", "calls nested 150 deep (valid Python, deep tree)",
             lambda d: _write(d / "calls.py", b"x = " + b"f(" * 150 + b"1" + b")" * 150 + b"\n")),
        Case("elif-chain", "a coroutine ending in a 5000-branch if/elif chain (valid Python, deep tree)",
             lambda d: _write(d / "elif.py", elif_chain().encode())),
        Case("call-chain", "a 3000-link method chain, which libcst's parser would take minutes on "
             "(stopped by max-file-seconds)", lambda d: _write(d / "chain.py", call_chain().encode()), "chain.py",
             timeout_s=HUGE_TIMEOUT_S),
        Case("symlink-loop", "directory symlinks forming a loop, and a link to itself", _symlink_loop),
        Case("dangling-symlink", "a .py symlink to nothing",
             lambda d: (d.mkdir(parents=True), os.symlink(d / "missing.py", d / "gone.py"))),
        Case("fifo", "a named pipe called pipe.py", _fifo),
        Case("empty-file", "an empty module", lambda d: _write(d / "empty.py", b"")),
        Case("unreadable", "a file with mode 000", _unreadable, "secret.py",
             skip_why="running as root, which reads mode-000 files" if root_reads_all else None),
    ]


def check(case: Case, folder: Path) -> Outcome:
    """Build the tree, run `invariants check` on it, and judge the run."""
    if case.skip_why:
        return Outcome(case, True, f"not tried: {case.skip_why}")
    case.build(folder)
    begun = time.monotonic()
    try:
        run = subprocess.run([sys.executable, "-m", "mlx_invariants", "check", str(folder)], cwd=folder.parent,
                             capture_output=True, text=True, errors="replace", timeout=case.timeout_s)
    except subprocess.TimeoutExpired:
        return Outcome(case, False, f"hung: no answer within {case.timeout_s:g}s", seconds=case.timeout_s)
    took = time.monotonic() - begun
    output = (run.stdout + run.stderr).strip()
    lines = [l for l in output.splitlines() if l.strip()]
    figures = {"exit": run.returncode, "lines": len(lines)}
    problems = []
    if run.returncode not in DOCUMENTED_EXITS:
        problems.append(f"exit {run.returncode}")
    if "Traceback" in output:
        problems.append("printed a traceback")
    if case.unreadable:
        mentions = [l for l in lines if case.unreadable in l and "INV000" in l]
        if len(mentions) != 1:
            problems.append(f"{len(mentions)} INV000 lines for {case.unreadable}")
    first = next((l for l in lines if case.unreadable and case.unreadable in l), lines[0] if lines else "")
    first = first.replace(str(folder) + os.sep, "")
    summary = (f"exit {run.returncode}, {len(lines)} line(s)" + ("" if case.timed_in else f" in {took:.1f}s")
               + (f": {first[:140]}" if first else ""))
    if problems:
        tail = lines[-1][:160] if lines else ""
        return Outcome(case, False, f"{'; '.join(problems)} ({summary}) {tail}", figures, took)
    return Outcome(case, True, summary, figures, took)
