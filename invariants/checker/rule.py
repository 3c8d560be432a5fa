"""The parts every static rule is made of: Rule, its Valid/Invalid examples, Finding."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import ast
    from collections.abc import Callable

    import libcst as cst

    from mlx_invariants.checker.walker import FileContext


@dataclass(frozen=True, order=True)
class Finding:
    """One problem at one place. `col` is 1-based, like every editor's column."""

    path: str
    line: int
    col: int
    rule: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "line": self.line, "col": self.col, "rule": self.rule, "message": self.message}


@dataclass(frozen=True)
class Example:
    """A snippet for `invariants explain` and for the tests generated from RULES.

    `options` are `[tool.invariants]` keys (shared or this rule's) the snippet is checked with.
    `files` make it a package: the other files by path (`app/engine.py`), checked in one run
    with the snippet as `app/main.py` (`app/__init__.py` is added); only the snippet is marked.
    """

    code: str
    options: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)

    MAIN: ClassVar[str] = "app/main.py"

    @property
    def source(self) -> str:
        return textwrap.dedent(self.code).strip("\n") + "\n"

    def expected(self) -> list[tuple[int, str]]:
        """(line, rule id) for every `# expect: INV1xx[, INV1yy]` marker."""
        marks = []
        for number, line in enumerate(self.source.splitlines(), start=1):
            match = _EXPECT.search(line)
            if match:
                marks.extend((number, rule) for rule in re.findall(r"INV\d{3}", match.group(1)))
        return marks


_EXPECT = re.compile(r"#\s*expect:\s*([A-Z0-9, ]+)")


class Valid(Example):
    """Code the rule must stay silent on: the INVALID one with the fix applied."""


class Invalid(Example):
    """Code the rule must flag, exactly on the lines marked `# expect: INV1xx`."""


# `triggers` of a rule the package model alone asks (model/queries.py): an empty group, so no
# file is parsed for it; its examples are checked as a package, as `invariants check` runs them.
PACKAGE_ONLY: tuple[tuple[str, ...], ...] = ((),)


class Rule:
    """Base class. A subclass's docstring says why the pattern is a bug.

    Subclasses define `visit_<Node>` / `leave_<Node>` methods (libcst node class
    names) that the one walk calls, and `end()` for decisions that need the
    whole file. A fresh instance checks each file.
    """

    id: ClassVar[str]
    catches: ClassVar[str]  # the bad pattern, in one line, for `invariants rules`
    message: ClassVar[str]
    known_problems: ClassVar[str] = ""
    # Rule-specific `[tool.invariants.INV1xx]` keys and their defaults.
    options: ClassVar[dict[str, Any]] = {}
    # False for an opt-in rule: it runs only when `select` names its full id (`select = ["INV",
    # "INV113"]`); a prefix such as the default "INV" does not. For a pattern whose findings on
    # real code were mostly harmless, still worth a look on request.
    default_enabled: ClassVar[bool] = True
    # The file is parsed for this rule only if, for every group, one of the group's
    # substrings occurs in it (or a compiled pattern matches it). Every qualified name a
    # rule resolves has its last part in the file text (in the import or at the use), so
    # aliasing cannot hide code from this filter.
    triggers: ClassVar[tuple[tuple[str | re.Pattern[str], ...], ...]] = ()
    # For a rule whose trigger words let through many files it cannot fire on: given the file's CPython ast
    # (about a fifth of libcst's parse), False only where the rule cannot report anything, whatever else the
    # file holds. A file parsed only for rules that all have one, and that all say False, is not parsed by
    # libcst (analysis.py). None: no such test.
    possible: ClassVar[Callable[[ast.Module], bool] | None] = None
    VALID: ClassVar[list[Valid | str]] = []
    INVALID: ClassVar[list[Invalid | str]] = []

    def __init__(self, ctx: FileContext, options: dict[str, Any]) -> None:
        self.ctx = ctx
        self.opts = options

    def report(self, node: cst.CSTNode, **fields: Any) -> None:
        self.ctx.report(self.id, node, self.message.format(**fields))

    def end(self) -> None:
        """Called once after the walk, when every fact about the file is known."""

    @classmethod
    def name(cls) -> str:
        """Kebab-case name of the bad pattern: LockReleasedBeforeWorker -> lock-released-before-worker."""
        return re.sub(r"(?<!^)(?=[A-Z])", "-", cls.__name__).lower()

    @classmethod
    def summary(cls) -> str:
        return cls.catches if cls.default_enabled else f"{cls.catches} (opt-in: select it by id)"

    @classmethod
    def why(cls) -> str:
        return textwrap.dedent((cls.__doc__ or "").strip("\n")).strip()

    @classmethod
    def valid(cls) -> list[Valid]:
        return [v if isinstance(v, Valid) else Valid(v) for v in cls.VALID]

    @classmethod
    def invalid(cls) -> list[Invalid]:
        return [v if isinstance(v, Invalid) else Invalid(v) for v in cls.INVALID]
