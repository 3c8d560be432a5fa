"""`invariants mutants --list`: the catalogue as text, one block per mutant."""

from __future__ import annotations

import textwrap
from typing import Sequence

from mlx_invariants.mutants.mutant import Mutant


def describe(mutants: Sequence[Mutant]) -> str:
    blocks = []
    for m in mutants:
        lines = [f"{m.id}: {m.title}",
                 f"  breaks:   {m.invariant}",
                 f"  expected: {', '.join(m.killers)}",
                 f"  changes:  {', '.join(m.files)}"]
        lines += textwrap.wrap(" ".join(m.story.split()), 96, initial_indent="  ", subsequent_indent="  ")
        if m.equivalent:
            lines += textwrap.wrap("Equivalent here: " + " ".join(m.equivalent.split()), 96,
                                   initial_indent="  ", subsequent_indent="  ")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
