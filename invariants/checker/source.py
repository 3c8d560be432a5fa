"""Read and parse one file, or say in one line why it cannot be checked.

Every way a file can fail (unreadable, not a regular file, too large, NUL
bytes, not UTF-8, a syntax error, nesting too deep for the parser) becomes a
SourceError, which the runner reports as INV000 before going on.
"""

from __future__ import annotations

import ast
import errno
import os
import re
import stat
import tokenize
from io import BytesIO
from typing import TYPE_CHECKING

from mlx_invariants.checker.errors import SourceError

if TYPE_CHECKING:
    import libcst as cst

_BRACKETS = re.compile(r"[\[\](){}]")
# Above this bracket depth (CPython's own limit is 200) or size, CPython's parser,
# which fails cleanly, vets the file before libcst's, which can crash or stall on it.
_VET_DEPTH = 100
_VET_BYTES = 256_000
_VET_LINE = 10_000


def read(path: str, max_bytes: int) -> bytes:
    """The file's bytes; SourceError if it is not a readable regular file within the size limit."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise SourceError(_os_reason(exc, path)) from None
    if not stat.S_ISREG(info.st_mode):
        raise SourceError("not a regular file (a FIFO, socket or device); exclude it or pass a .py file")
    if info.st_size > max_bytes:
        raise SourceError(
            f"file is {info.st_size / 1e6:.1f} MB, over the {max_bytes / 1e6:.1f} MB limit; "
            "exclude it or raise max-file-bytes"
        )
    try:
        with open(path, "rb") as handle:
            return handle.read(max_bytes + 1)
    except OSError as exc:
        raise SourceError(_os_reason(exc, path)) from None


def _os_reason(exc: OSError, path: str) -> str:
    if exc.errno == errno.ELOOP:
        return "symlink loop; fix or exclude the link"
    if exc.errno == errno.ENOENT and os.path.islink(path):
        return "broken symlink; fix or exclude the link"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied; make it readable or exclude it"
    return f"cannot read it: {exc.strerror or exc}"


def decode(data: bytes) -> str:
    """Text of a Python source: UTF-8, or the encoding its coding cookie declares."""
    if b"\0" in data:
        line = data.count(b"\n", 0, data.index(b"\0")) + 1
        raise SourceError("contains a NUL byte; Python cannot compile it", line)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        utf8_error = exc
    try:
        encoding, _ = tokenize.detect_encoding(BytesIO(data).readline)
        if encoding not in ("utf-8", "utf-8-sig"):
            return data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError):
        pass
    line = data.count(b"\n", 0, utf8_error.start) + 1
    raise SourceError(f"not valid UTF-8 (byte 0x{data[utf8_error.start]:02x}); save it as UTF-8", line)


def _needs_vetting(text: str) -> bool:
    if len(text) > _VET_BYTES:
        return True
    depth = deepest = 0
    for ch in _BRACKETS.findall(text):
        if ch in "([{":
            depth += 1
            if depth > deepest:
                deepest = depth
        else:
            depth -= 1
    if deepest > _VET_DEPTH:
        return True
    return any(len(line) > _VET_LINE for line in text.splitlines())


def check_syntax(text: str) -> None:
    """CPython's verdict (fast, and it fails cleanly on any nesting): SourceError if it does not compile."""
    try:
        ast.parse(text)
    except SyntaxError as exc:
        raise SourceError(f"syntax error: {exc.msg}", exc.lineno or 1, exc.offset or 1) from None
    except (RecursionError, MemoryError):
        raise SourceError("nested too deeply to parse; simplify or exclude it") from None


def parse(text: str) -> cst.Module:
    """The libcst module; SourceError with the line for anything that does not parse."""
    import libcst as cst  # here, so reading files (and a fully cached run) never imports libcst

    if _needs_vetting(text):
        check_syntax(text)
    try:
        return cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        check_syntax(text)  # CPython's message and position are the ones users know
        message = str(exc.message).strip().splitlines()[0] if exc.message else "invalid syntax"
        raise SourceError(f"syntax error: {message}", exc.raw_line, exc.raw_column + 1) from None
    except RecursionError:
        raise SourceError("nested too deeply to parse; simplify or exclude it") from None
