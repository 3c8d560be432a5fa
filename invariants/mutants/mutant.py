"""A mutant: a named regression, written as exact source replacements on a copy of `engine/`.

Replacements, not runtime flags: the engine never learns that mutants exist,
and an anchor that no longer matches fails loudly (`NoLongerApplies`) instead
of quietly testing nothing, so the catalogue keeps up with the engine.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

from mlx_invariants.mutants.errors import NoLongerApplies

INDENTS = range(0, 33, 4)


@dataclass(frozen=True)
class Edit:
    """Replace the one occurrence of `old` in `path` (relative to the copy's root) with `new`.

    Both blocks are written flush left; they are matched and written at
    whatever indentation the anchor has in the file, so a method moved into
    another class still matches while a reworded line does not.
    """

    path: str
    old: str
    new: str

    def apply(self, root: Path, mutant_id: str) -> None:
        target = root / self.path
        if not target.is_file():
            raise NoLongerApplies(mutant_id, f"{self.path} does not exist")
        source = "\n" + target.read_text()  # every anchor then starts right after a newline
        old, new = _block(self.old), _block(self.new)
        hits = [(prefix, source.count("\n" + _indent(old, prefix))) for prefix in (" " * n for n in INDENTS)]
        found = [(prefix, n) for prefix, n in hits if n]
        if not found:
            raise NoLongerApplies(mutant_id, f"{self.path} no longer contains:\n{textwrap.indent(old, '    ')}")
        if len(found) > 1 or found[0][1] > 1:
            raise NoLongerApplies(mutant_id, f"the anchor occurs more than once in {self.path}; make it longer:\n"
                                             f"{textwrap.indent(old, '    ')}")
        prefix = found[0][0]
        mutated = source.replace("\n" + _indent(old, prefix), "\n" + _indent(new, prefix), 1)
        target.write_text(mutated[1:])


def _block(text: str) -> str:
    return textwrap.dedent(text).strip("\n") + "\n"


def _indent(block: str, prefix: str) -> str:
    return "".join(prefix + line if line.strip() else line for line in block.splitlines(keepends=True))


@dataclass(frozen=True)
class Mutant:
    """One real regression of an MLX serving engine, reproduced on the reference engine.

    `killers` names the checks expected to catch it, each as `layer:name`:
    `static:INV105` (a rule), `test:tests/engine/...::test_x` (an engine test,
    also the targeted selection the test layer runs first) or
    `fuzz:slot-freed-early` (an oracle's violation kind). `routes` are the
    reference engines the fuzzer drives for this mutant.
    """

    id: str
    title: str
    story: str
    invariant: str
    killers: tuple[str, ...]
    edits: tuple[Edit, ...]
    routes: tuple[str, ...] = ("simple",)
    equivalent: str = ""  # why no behaviour check can see it in this engine, when that is so

    @property
    def tests(self) -> tuple[str, ...]:
        return tuple(k.split(":", 1)[1] for k in self.killers if k.startswith("test:"))

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(edit.path for edit in self.edits))

    def apply(self, root: Path) -> None:
        """Apply every edit to the copy under `root`; raises `NoLongerApplies` if any anchor is gone."""
        for edit in self.edits:
            edit.apply(root, self.id)

    def matches(self, selector: str) -> bool:
        """`--only` takes the full id or its number (`M07`, `m07`, `7`)."""
        number = self.id.split("-", 1)[0]
        return selector.lower() in (self.id.lower(), number.lower(), number[1:].lstrip("0"))
