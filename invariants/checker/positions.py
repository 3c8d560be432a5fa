"""Line and column of the few nodes a report needs, in one cheap pass over the code.

libcst's `MetadataWrapper(...).resolve(PositionProvider)` builds two `CodePosition`s
and a `CodeRange` for every node of the file, and the wrapper first walks the whole
tree once more for batchable providers even when none is asked for: on a 1.9 MB
module with findings that took 12 s, more than libcst's parse of it (9 s). A
report needs the positions of its findings' nodes and statements only. This pass
generates the code once, counting lines and columns without keeping the text, and
records only the nodes asked for, with PositionProvider's exact semantics (the
syntactic range, whitespace excluded where libcst excludes it). It stops once every
node asked for has its range: what follows cannot move it (on vllm-mlx's 3 529-line
engine/simple.py, a finding at line 1 135 costs a third of the pass).

It relies on libcst's code generation hooks (`CodegenState`), which are not public
API: an error there, or a node left without a range, falls back to PositionProvider,
and tests/invariants/test_parse_and_positions.py compares the two on every node of
real files, so a libcst that changes the hooks silently fails a test, not a report.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, MetadataWrapper, PositionProvider

_NEWLINE = re.compile(r"\r\n?|\n")
_UNRECORDED = nullcontext()

try:
    from libcst._nodes.internal import CodegenState
except ImportError:  # a libcst that moved it: PositionProvider serves every request
    CodegenState = None  # type: ignore[assignment,misc]


def positions(module: cst.Module, nodes: Iterable[cst.CSTNode]) -> Mapping[cst.CSTNode, CodeRange]:
    """PositionProvider's range for each of `nodes` (all of them inside `module`)."""
    wanted = set(nodes)
    if CodegenState is not None:
        try:
            found = _record(module, wanted)
            if wanted.issubset(found):
                return found
        except RecursionError:
            raise  # too deep for code generation: the public route recurses the same way
        except Exception:  # noqa: BLE001 - a libcst whose hooks changed: take the public route
            pass
    return MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)


class _Done(Exception):
    """Every node asked for has its range: the rest of the code need not be generated."""


def _record(module: cst.Module, wanted: set[cst.CSTNode]) -> dict[cst.CSTNode, CodeRange]:
    state = _RecordingState(module, wanted)
    try:
        module._codegen(state)
    except _Done:
        pass
    return state.found


if CodegenState is not None:

    class _RecordingState(CodegenState):  # type: ignore[misc,valid-type]
        """A code generator that keeps no text, only the current line and column."""

        def __init__(self, module: cst.Module, wanted: set[cst.CSTNode]) -> None:
            super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
            self.wanted = wanted  # grows: a wanted node's range may be its children's
            self.found: dict[cst.CSTNode, CodeRange] = {}
            self.line = 1
            self.column = 0
            self.starts: list[tuple[int, int]] = []

        def add_token(self, value: str) -> None:
            if not self.tokens:
                self.tokens.append(value)  # Module asks whether anything was generated; the rest is not kept
            if "\n" in value or "\r" in value:
                segments = _NEWLINE.split(value)
                self.line += len(segments) - 1
                self.column = len(segments[-1])
            else:
                self.column += len(value)

        def add_indent_tokens(self) -> None:
            for token in self.indent_tokens:
                self.add_token(token)

        def pop_trailing_newline(self) -> None:
            pass  # only the text's end changes, after every node has its range

        def before_codegen(self, node: cst.CSTNode) -> None:
            self.starts.append((self.line, self.column))

        def after_codegen(self, node: cst.CSTNode) -> None:
            line, column = self.starts.pop()
            if node in self.wanted:
                if node not in self.found:
                    self.found[node] = CodeRange(CodePosition(line, column), CodePosition(self.line, self.column))
                if len(self.found) == len(self.wanted):  # only wanted nodes are kept, each once
                    raise _Done

        def record_syntactic_position(
            self, node: cst.CSTNode, *, start_node: cst.CSTNode | None = None, end_node: cst.CSTNode | None = None
        ) -> AbstractContextManager[None]:
            """The syntactic range of a node asked for; any other (nearly all) gets a context that does nothing,
            made once: a generator-based one for each of them was a fifth of the pass."""
            if node not in self.wanted:
                return _UNRECORDED
            return self._recorded(node, start_node, end_node)

        @contextmanager
        def _recorded(self, node: cst.CSTNode, start_node: cst.CSTNode | None, end_node: cst.CSTNode | None
                      ) -> Iterator[None]:
            for part in (start_node, end_node):
                if part is not None:
                    self.wanted.add(part)
            begin = CodePosition(self.line, self.column)
            yield
            start = self.found[start_node].start if start_node is not None else begin
            end = self.found[end_node].end if end_node is not None else CodePosition(self.line, self.column)
            self.found[node] = CodeRange(start, end)
