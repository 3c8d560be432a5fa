"""`invariants mutants --list`: the catalogue as text, one block per mutant."""

from __future__ import annotations

import textwrap
from typing import Sequence

from mlx_invariants.mutants.mutant import Mutant


def describe(mutants: Sequence[Mutant]) -> str:
    blocks = []
    for m in mutants:
        seed = f" (seed scenario: {m.seed})" if m.seed else ""
        lines = [f"{m.id}: {m.title}",
                 f"  breaks:    {m.invariant}",
                 f"  expected:  {', '.join(m.killers)}",
                 f"  must kill: {', '.join(m.must_kill)}{seed}",
                 f"  changes:   {', '.join(m.files)}"]
        lines += _paragraph("", m.story)
        if m.equivalent:
            lines += _paragraph("Equivalent here: ", m.equivalent)
        if m.apart:
            lines += _paragraph("Not merged with its sibling: ", m.apart)
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _paragraph(lead: str, text: str) -> list[str]:
    return textwrap.wrap(lead + " ".join(text.split()), 96, initial_indent="  ", subsequent_indent="  ")
