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
import sys
import tokenize
from io import BytesIO
from typing import TYPE_CHECKING

from mlx_invariants.checker.errors import SourceError

if TYPE_CHECKING:
    import libcst as cst

    from mlx_invariants.checker.versions import Version

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
        raise SourceError(os_reason(exc, path)) from None
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
        raise SourceError(os_reason(exc, path)) from None


def os_reason(exc: OSError, path: str) -> str:
    """Why `path` cannot be read, and what to do about it."""
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


# A statement this long (a bracketed span, a line, or lines joined by backslashes) may keep
# libcst's native parser busy for minutes, which nothing in the process can interrupt: its
# time grows much faster than the length for chains (`a.b(c, d=1).b(c, d=1)...`: 400 links
# 1.5 s, 800 links 18 s) and long left-nested expressions (`1 + 1 + ...`).
_ISOLATE_CHARS = 5_000


def needs_isolation(text: str) -> bool:
    """Whether libcst's parse of `text` should run where it can be stopped (a child process):
    some statement is longer than _ISOLATE_CHARS. Cheap and coarse: brackets in strings and
    comments are counted too, so it errs on the side of isolating."""
    limit = _ISOLATE_CHARS
    if len(text) <= limit:
        return False
    lines = text.splitlines()
    if max(map(len, lines)) > limit:
        return True
    if "\\\n" in text or "\\\r" in text:
        run = 0
        for line in lines:
            run = run + len(line) + 1 if line.endswith("\\") else 0
            if run > limit:
                return True
    depth = start = 0
    for match in _BRACKETS.finditer(text):
        if match.group() in "([{":
            if depth == 0:
                start = match.start()
            depth += 1
        elif depth:
            depth -= 1
            if depth == 0 and match.start() - start > limit:
                return True
    return depth > 0 and len(text) - start > limit


# CPython's parser judges a file only for a Python it can stand in for: one no newer than the
# one running (ast's `feature_version` then holds it to that version's grammar, as far as
# CPython enforces it; 3.7 is the oldest it is sure to accept). For a newer one, libcst's
# parser, which knows every grammar up to its newest, has the last word.
_RUNNING = sys.version_info[:2]
_OLDEST_FEATURE_VERSION = (3, 7)
# The recursion budget CPython's parser gets (the analysis thread allows more, for the Python code
# that walks deep trees): an expression it cannot turn into an AST within it, such as a
# 30 000-term sum, is "nested too deeply", not a task for libcst (minutes on that sum).
_AST_RECURSION_LIMIT = 10_000


def _ast_parse(text: str, feature: tuple[int, int] | None = None) -> ast.Module:
    old = sys.getrecursionlimit()
    if old > _AST_RECURSION_LIMIT:
        sys.setrecursionlimit(_AST_RECURSION_LIMIT)
    try:
        return ast.parse(text, feature_version=feature)
    finally:
        sys.setrecursionlimit(old)


_last_tree: tuple[str, ast.Module] | None = None


def python_tree(text: str) -> ast.Module:
    """`ast.parse(text)` (raising as it does), the last tree kept: after an edit, the package model
    summarizes the edited file and the unreferenced-def step outlines it, from one parse (15 ms of
    CPU for vllm-mlx's engine/simple.py). Its readers only read it."""
    global _last_tree
    if _last_tree is not None and _last_tree[0] == text:
        return _last_tree[1]
    tree = ast.parse(text)
    _last_tree = (text, tree)
    return tree


def ast_tree(text: str, target: Version | None = None) -> ast.Module | None:
    """CPython's tree of `text` where `check_syntax` would accept it at its first step (CPython's parser,
    in the target's grammar), else None: an objection, and who has the last word on it, are check_syntax's
    and libcst's to give."""
    newer = target is None or target > _RUNNING
    try:
        return _ast_parse(text, None if newer else max(target, _OLDEST_FEATURE_VERSION))  # type: ignore[type-var]
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def check_syntax(text: str, target: Version | None = None, *, vetting: bool = False, libcst_failed: bool = False) -> None:
    """SourceError if `text` does not compile for the `target` Python (None: the newest).

    CPython's verdict first (fast, and it fails cleanly on any nesting); its message and
    position are the ones users know. Where the target is newer than the running Python, an
    objection of CPython's stands only if libcst's parser (the newest grammar) fails too:
    it is asked here, unless it is about to parse anyway (`vetting`: the objection is
    dropped) or already failed (`libcst_failed`).
    """
    newer = target is None or target > _RUNNING
    feature = None if newer else max(target, _OLDEST_FEATURE_VERSION)  # type: ignore[type-var]
    try:
        _ast_parse(text, feature)
    except SyntaxError as exc:
        # Nesting limits ("too many nested parentheses") are the same in every version, and
        # libcst must not be the one to meet them.
        nesting = exc.msg.startswith("too many")
        if newer and not nesting and not libcst_failed and (vetting or _libcst_objection(text) is None):
            return
        message = f"syntax error: {exc.msg}"
        if feature is not None and not nesting and (
            (feature < _RUNNING and _compiles(text)) or (not libcst_failed and _libcst_objection(text) is None)
        ):
            message += (f" (it needs a Python newer than {target[0]}.{target[1]},"  # type: ignore[index]
                        " the oldest the project's requires-python allows)")
        raise SourceError(message, exc.lineno or 1, exc.offset or 1) from None
    except (RecursionError, MemoryError):
        raise SourceError("nested too deeply to parse; simplify or exclude it") from None


def _compiles(text: str) -> bool:
    try:
        _ast_parse(text)
    except (SyntaxError, RecursionError, MemoryError):
        return False
    return True


def _libcst_objection(text: str) -> SourceError | None:
    """Why libcst's parser (the newest grammar) rejects `text`, or None if it parses."""
    import libcst as cst

    try:
        cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        return _syntax_error(exc)
    except RecursionError:
        return SourceError("nested too deeply to parse; simplify or exclude it")
    return None


def _syntax_error(exc: cst.ParserSyntaxError) -> SourceError:
    message = str(exc.message).strip().splitlines()[0] if exc.message else "invalid syntax"
    return SourceError(f"syntax error: {message}", exc.raw_line, exc.raw_column + 1)


def parse(text: str, target: Version | None = None) -> cst.Module:
    """The libcst module; SourceError with the line for anything that does not parse.

    libcst's native parser knows one grammar, the newest (it ignores
    `PartialParserConfig(python_version=...)`), so it parses code of any version; `target`
    decides what CPython's check, where one runs (below and in check_syntax), may object to.

    A large file is parsed in pieces cut at module-level statements and joined into
    the module a whole parse gives: libcst's native parser holds about 400 bytes of
    memory per byte of source until it returns (824 MB peak for a 1.9 MB module whose
    finished tree takes about 130 MB), and pieces bound that to the piece being parsed.
    """
    if len(text) > _PIECE_CHARS:
        joined = _parse_pieces(text, target)
        if joined is not None:
            return joined
    return _parse_whole(text, target)


def _parse_whole(text: str, target: Version | None = None) -> cst.Module:
    import libcst as cst  # here, so reading files (and a fully cached run) never imports libcst

    if _needs_vetting(text):
        check_syntax(text, target, vetting=True)
    try:
        return cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        check_syntax(text, target, libcst_failed=True)  # CPython's message and position are the ones users know
        raise _syntax_error(exc) from None
    except RecursionError:
        raise SourceError("nested too deeply to parse; simplify or exclude it") from None


# Pieces of about this many characters; a file of up to two pieces is parsed whole.
_PIECE_CHARS = 128_000
# A line that may start a module-level statement, and the words that continue one instead.
_LINE_START = re.compile(r"\n(?=[A-Za-z_@])")
_CONTINUES = re.compile(r"(?:else|elif|except|finally)\b")


def _cuts(text: str) -> list[int]:
    """Offsets of lines, about _PIECE_CHARS apart, that start a module-level statement.

    A candidate is a line that starts at column 0 with a name or a decorator and does not
    continue the statement above (`else:`, `except`, a line after a backslash or after a
    decorator). One inside a string or brackets is not detected here: the piece before such
    a cut ends unfinished, fails to parse, and the file is parsed whole instead.
    """
    cuts = [0]
    for match in _LINE_START.finditer(text, _PIECE_CHARS):
        start = match.end()
        if start - cuts[-1] < _PIECE_CHARS or len(text) - start < _PIECE_CHARS // 2:
            continue
        previous = text[text.rfind("\n", 0, start - 1) + 1 : start - 1]
        if previous.startswith("@") or previous.rstrip("\r").endswith("\\") or _CONTINUES.match(text, start):
            continue
        cuts.append(start)
    return cuts


def _parse_pieces(text: str, target: Version | None = None) -> cst.Module | None:
    """The pieces' modules joined into one, or None where a whole parse must decide."""
    import libcst as cst

    cuts = _cuts(text)
    if len(cuts) < 2:
        return None
    modules = []
    for begin, end in zip(cuts, [*cuts[1:], len(text)]):
        piece = text[begin:end]
        try:
            if _needs_vetting(piece):
                check_syntax(piece, target, vetting=True)
            modules.append(cst.parse_module(piece))
        except (SourceError, cst.ParserSyntaxError, RecursionError):
            return None  # a real error, or a cut where none belongs: the whole parse says which
    first = modules[0]
    if any((m.default_indent, m.default_newline) != (first.default_indent, first.default_newline) for m in modules):
        return None  # code generation (positions) must see one indent and newline style
    body = list(first.body)
    between = list(first.footer)  # comments and blank lines between two pieces belong to the next statement
    for module in modules[1:]:
        between += module.header
        if module.body:
            head = module.body[0]
            body.append(head.with_changes(leading_lines=[*between, *head.leading_lines]))
            body.extend(module.body[1:])
            between = []
        between += module.footer
    return first.with_changes(body=body, footer=between, has_trailing_newline=modules[-1].has_trailing_newline)
