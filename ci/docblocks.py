"""Generated blocks in a markdown doc: what ci/checker_docs.py and ci/fuzz_docs.py share.

A doc holds `<!-- BEGIN generated: NAME -->` ... `<!-- END generated: NAME -->` pairs; a script
names a function per block that builds its body from the declarations (the rule registry, the
fuzzer's vocabularies), rewrites the doc, or with `--check` only says which blocks are stale.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BLOCK = re.compile(r"<!-- BEGIN generated: (?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- END generated: (?P=name) -->\n",
                   re.DOTALL)


class DocError(Exception):
    """The doc cannot be regenerated as it is; the message says what to fix."""


def stale_blocks(text: str, fresh: str) -> list[str]:
    """The names of the blocks whose body differs between `text` and `fresh`."""
    old = {m["name"]: m["body"] for m in BLOCK.finditer(text)}
    return [m["name"] for m in BLOCK.finditer(fresh) if old.get(m["name"]) != m["body"]]


@dataclass(frozen=True)
class GeneratedDoc:
    """One doc, its generated blocks and the note each block starts with."""

    prog: str                               # the script's name, in its messages
    doc: Path
    note: str
    blocks: dict[str, Callable[[], str]]

    def render(self, text: str) -> str:
        """`text` with every generated block rebuilt; a missing, repeated or unknown block is an error."""
        names = [m["name"] for m in BLOCK.finditer(text)]
        for name in self.blocks:
            if names.count(name) != 1:
                raise DocError(f"{self.doc.name} needs exactly one `<!-- BEGIN generated: {name} -->` ... "
                               f"`<!-- END generated: {name} -->` pair, found {names.count(name)}")
        unknown = sorted(set(names) - set(self.blocks))
        if unknown:
            raise DocError(f"{self.doc.name} has generated blocks this script does not know: {', '.join(unknown)}")
        bodies = {name: f"{self.note}\n{make()}" for name, make in self.blocks.items()}
        return BLOCK.sub(lambda m: f"<!-- BEGIN generated: {m['name']} -->\n{bodies[m['name']]}"
                                   f"<!-- END generated: {m['name']} -->\n", text)

    def main(self, argv: list[str] | None, description: str, root: Path) -> int:
        """The script's command line: rewrite the doc, or `--check` it (exit 1 when stale, 2 on an error)."""
        parser = argparse.ArgumentParser(description=description)
        parser.add_argument("--check", action="store_true", help="exit 1 if the doc is out of date; write nothing")
        parser.add_argument("--doc", type=Path, default=self.doc,
                            help=f"the doc to rebuild (default: {self.doc.relative_to(root)})")
        args = parser.parse_args(argv)
        try:
            text = args.doc.read_text(encoding="utf-8")
            fresh = self.render(text)
        except (OSError, DocError) as exc:
            print(f"{self.prog}: error: {exc}", file=sys.stderr)
            return 2
        if fresh == text:
            return 0
        if args.check:
            print(f"{self.prog}: {args.doc} is out of date in: {', '.join(stale_blocks(text, fresh))}; "
                  f"run `python ci/{self.prog}.py`", file=sys.stderr)
            return 1
        args.doc.write_text(fresh, encoding="utf-8")
        print(f"{self.prog}: rewrote {', '.join(stale_blocks(text, fresh))} in {args.doc}")
        return 0
