"""The two shortcuts for large files give exactly what libcst's own routes give.

A large file is parsed in pieces and joined (source.parse); positions are computed for
the reported nodes only (positions.positions). Both are compared here with libcst's
whole-file parse and its PositionProvider, on this project's own code and on the shapes
that could trip a cut: comments between pieces, decorators, `else:` at module level,
backslash continuations, column-0 code inside strings, CRLF files, tab indents.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from mlx_invariants.checker import analysis, config, positions, source
from mlx_invariants.checker.errors import SourceError
from mlx_invariants.checker.rules import RULES
from mlx_invariants.checker.walker import descendants

ROOT = Path(__file__).resolve().parents[2]
OWN_FILES = [ROOT / "invariants/checker/walker.py", ROOT / "invariants/checker/config.py",
             ROOT / "tests/invariants/fixtures/inv110_grpc_servicer_startup.py"]

TRICKY = '''\
"""Module docstring."""
import asyncio
import threading


# A comment block above a module-level lock:
# it serializes MLX access.
LOCK = threading.Lock()

TEXT = """
    indented text
"""


@staticmethod
def decorated():
    return 1


if LOCK:
    X = 1
else:
    X = 2

try:
    import json
except ImportError:
    json = None
finally:
    Y = 3

Z = 1 + \\
2


class Engine:
    def __init__(self):
        self._lock = asyncio.Lock()

    async def generate(self, step):
        async with self._lock:
            return await asyncio.to_thread(step)
    # a trailing comment inside the class
# a comment at column 0 after the class

def after():
    pass
'''


def _pieces(monkeypatch: pytest.MonkeyPatch, chars: int) -> None:
    monkeypatch.setattr(source, "_PIECE_CHARS", chars)


@pytest.mark.parametrize("path", OWN_FILES, ids=lambda p: p.name)
def test_positions_equal_position_provider_for_every_node(path: Path) -> None:
    module = cst.parse_module(path.read_text(encoding="utf-8"))
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    nodes = [module, *descendants(module)]
    found = positions.positions(module, nodes)
    assert [found[n] for n in nodes] == [expected[n] for n in nodes]


def test_positions_of_a_few_nodes_are_the_same_as_of_all(monkeypatch: pytest.MonkeyPatch) -> None:
    module = cst.parse_module(TRICKY.replace("\n", "\r\n"))
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    some = [n for n in descendants(module) if isinstance(n, cst.Call | cst.If | cst.IndentedBlock)]
    found = positions.positions(module, some)
    assert {n: found[n] for n in some} == {n: expected[n] for n in some}


@pytest.mark.parametrize(("text", "step"), [
    (TRICKY, 1), (TRICKY.replace("\n", "\r\n"), 1), *((p.read_text(encoding="utf-8"), 97) for p in OWN_FILES),
], ids=["tricky", "crlf", *(p.name for p in OWN_FILES)])
def test_positions_of_one_node_are_the_same_wherever_the_pass_stops(text: str, step: int) -> None:
    """The pass stops once its nodes have their ranges: a node asked for alone, anywhere in the file
    (the pass itself, not the public route `positions` falls back to when a range is missing)."""
    module = cst.parse_module(text)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    for node in [module, *descendants(module)][::step]:
        assert positions._record(module, {node}).get(node) == expected[node]


def test_positions_fall_back_to_position_provider_when_libcsts_hooks_change(monkeypatch: pytest.MonkeyPatch) -> None:
    module = cst.parse_module(TRICKY)
    nodes = descendants(module)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)

    def changed(*args: object) -> None:
        raise AttributeError("no such hook")

    monkeypatch.setattr(positions, "_record", changed)
    found = positions.positions(module, nodes)
    assert [found[n] for n in nodes] == [expected[n] for n in nodes]


@pytest.mark.parametrize("text", [
    TRICKY, TRICKY.replace("\n", "\r\n"), TRICKY * 3, TRICKY.rstrip("\n"), TRICKY + "\n# the end\n\n",
    *(p.read_text(encoding="utf-8") for p in OWN_FILES),
], ids=["tricky", "crlf", "tricky-x3", "no-final-newline", "comment-at-end", *(p.name for p in OWN_FILES)])
@pytest.mark.parametrize("chars", [1, 60, 300, 2000])
def test_a_file_parsed_in_pieces_is_the_module_a_whole_parse_gives(
    monkeypatch: pytest.MonkeyPatch, text: str, chars: int
) -> None:
    _pieces(monkeypatch, chars)
    whole = cst.parse_module(text)
    joined = source.parse(text)
    assert joined.deep_equals(whole)
    assert joined.code == text


def test_small_pieces_do_cut_and_join(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above means something only if pieces are really joined (not the whole-parse fallback)."""
    _pieces(monkeypatch, 1)  # a cut before every module-level statement that may start a piece
    assert source._parse_pieces(TRICKY) is not None
    # Never between a decorator and its def, an if and its else, a try and its handlers, or a continued line.
    starts = [TRICKY[c:].split("\n", 1)[0] for c in source._cuts(TRICKY)]
    assert starts == ['"""Module docstring."""', "import asyncio", "import threading", "LOCK = threading.Lock()",
                      'TEXT = """', "@staticmethod", "if LOCK:", "try:", "Z = 1 + \\", "class Engine:", "def after():"]


def test_a_cut_inside_a_string_falls_back_to_the_whole_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "A = 1\n" * 20 + 'TEXT = """\n' + "import os\n" * 40 + '"""\n' + "B = 2\n" * 20
    _pieces(monkeypatch, 60)
    assert source._parse_pieces(text) is None
    assert source.parse(text).deep_equals(cst.parse_module(text))


def test_pieces_with_different_indent_styles_fall_back_to_the_whole_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "def f():\n    return 1\n" * 10 + "def g():\n\treturn 2\n" * 10
    _pieces(monkeypatch, 60)
    assert source._parse_pieces(text) is None
    assert source.parse(text).code == text


def test_a_syntax_error_in_a_large_file_is_reported_at_its_line(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "x = 1\n" * 300 + "def broken(:\n" + "y = 2\n" * 300
    _pieces(monkeypatch, 300)
    with pytest.raises(SourceError) as caught:
        source.parse(text)
    assert caught.value.line == 301


def test_findings_of_a_file_parsed_in_pieces_are_those_of_the_whole_file(monkeypatch: pytest.MonkeyPatch) -> None:
    text = TRICKY * 4
    settings = config.from_table({}, ROOT, "defaults", RULES)
    rules = analysis.rules_for(settings)
    whole = analysis.analyze_text(text, rules, settings.shared)
    _pieces(monkeypatch, 200)
    assert source._parse_pieces(text) is not None
    assert analysis.analyze_text(text, rules, settings.shared) == whole
    assert whole["findings"]
