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
ENGINE = "engine/"
LAYERS = ("static", "tests", "fuzz")  # the checks a mutant must not get past, cheapest first


@dataclass(frozen=True)
class Edit:
    """Replace the one occurrence of `old` in `path` (a file under `engine/`, as the repository names it) with `new`.

    Both blocks are written flush left; they are matched and written at
    whatever indentation the anchor has in the file, so a method moved into
    another class still matches while a reworded line does not.
    """

    path: str
    old: str
    new: str

    def __post_init__(self) -> None:
        if not self.path.startswith(ENGINE):
            raise ValueError(f"an edit changes the engine only: {self.path!r} is not under {ENGINE}")

    def apply(self, engine: Path, mutant_id: str) -> None:
        """Edit the copy of `engine/` at `engine` (a folder of any name: a copy may be renamed)."""
        target = engine / self.path[len(ENGINE):]
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

    `killers` names the checks known to catch it, each as `layer:name`:
    `static:INV105` (a rule), `test:tests/engine/...::test_x` (an engine test,
    also the targeted selection the test layer runs) or `fuzz:slot-freed-early`
    (an oracle's violation kind). `must_kill` names the layers that must each
    kill it, and the test suite holds every one to it: `static` and `tests` run
    through `invariants mutants --must-kill` (tests/mutants/test_kills.py);
    `fuzz` means the fuzzer finds it by generation alone (no seed examples) on
    its first route, shrinks it to at most two requests and one fault with a
    `fuzz:` kind, its report replays, and its `seed` scenario (a key of
    `fuzz.corpus.SEED_SCENARIOS`, which every fuzz run tries first) catches it
    and passes on the unmutated engine (tests/mutants/test_fuzz_kills.py).
    `routes` are the reference engines the fuzzer drives for this mutant.
    """

    id: str
    title: str
    story: str
    invariant: str
    killers: tuple[str, ...]
    edits: tuple[Edit, ...]
    must_kill: tuple[str, ...] = ()
    routes: tuple[str, ...] = ("simple",)
    seed: str = ""
    equivalent: str = ""  # why no behaviour check can see it in this engine, when that is so
    apart: str = ""       # why it is not merged with the entry for the same bug, when there is one

    @property
    def tests(self) -> tuple[str, ...]:
        return tuple(k.split(":", 1)[1] for k in self.killers if k.startswith("test:"))

    @property
    def finds(self) -> frozenset[str]:
        """The violation kinds that count as the fuzzer catching it."""
        return frozenset(k.split(":", 1)[1] for k in self.killers if k.startswith("fuzz:"))

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(edit.path for edit in self.edits))

    @property
    def package(self) -> str:
        """The import name of its in-process copy: one per mutant, so copies never shadow each other."""
        return "mutant_" + self.id.lower().replace("-", "_")

    def apply(self, engine: Path) -> None:
        """Apply every edit to the copy of `engine/` at `engine`; raises `NoLongerApplies` if any anchor is gone."""
        for edit in self.edits:
            edit.apply(engine, self.id)

    def matches(self, selector: str) -> bool:
        """`--only` takes the full id or its number (`M07`, `m07`, `7`)."""
        number = self.id.split("-", 1)[0]
        return selector.lower() in (self.id.lower(), number.lower(), number[1:].lstrip("0"))
