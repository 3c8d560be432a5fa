"""Every repository whose code someone changing the rules here has read: the list a miner of new held-out cases
must pick outside of.

A held-out score means something only when the rules never saw the repository (issue 23,
leave-one-repository-out). Over the sessions the rules were read against five kinds of code: the
corpus case files (benchmarks/corpus_bench/cases), the ten HEAD servers (corpus_bench/head.py),
the precision sets graded blind (precision_unstudied.py), the verdicts recorded for other findings
(results/unstudied_verdicts.json) and the mirrored HEADs the rule sweeps ran over
(results/swept_heads.txt). This prints their union, one `owner/name` a line, sorted and lower-cased
(GitHub names are case-insensitive); `--why` adds where each name comes from. `--mirrors DIR` adds
every bare mirror under DIR (`OWNER+NAME`), for a machine where more were fetched than were swept.

    .venv/bin/python benchmarks/studied_repos.py > /tmp/excluded.txt
    .venv/bin/python benchmarks/studied_repos.py --why --mirrors /work/.mirror
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import precision_unstudied  # noqa: E402
from corpus_bench import head  # noqa: E402

HERE = Path(__file__).resolve().parent
CASES = HERE / "corpus_bench" / "cases"
SWEPT = HERE / "results" / "swept_heads.txt"


def sources(mirrors: Path | None = None) -> Iterator[tuple[str, str]]:
    """(repository, where it was read) for every kind of code above."""
    for path in sorted(CASES.glob("*.json")):
        for case in json.loads(path.read_text()):
            yield case["repo"], f"cases/{path.name}"
    for server in head.SERVERS:
        yield server.repo, "corpus_bench/head.py"
    for name, servers in precision_unstudied.SETS.items():
        for server in servers:
            yield server.repo, f"precision set {name}"
    for key in json.loads(precision_unstudied.VERDICTS.read_text()):
        yield key.split(":", 1)[0], "results/unstudied_verdicts.json"
    for line in SWEPT.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            yield line.split()[0], "results/swept_heads.txt"
    if mirrors is not None:
        for entry in sorted(mirrors.iterdir()):
            if "+" in entry.name:
                yield entry.name.replace("+", "/", 1), f"mirror under {mirrors}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--why", action="store_true", help="name where each repository was read")
    parser.add_argument("--mirrors", type=Path, help="also every OWNER+NAME mirror under this folder")
    args = parser.parse_args(argv)
    if args.mirrors is not None and not args.mirrors.is_dir():
        parser.error(f"--mirrors {args.mirrors}: no such folder")
    seen: dict[str, list[str]] = {}
    for repo, where in sources(args.mirrors):
        places = seen.setdefault(repo.lower(), [])
        if where not in places:
            places.append(where)
    for repo in sorted(seen):
        print(f"{repo}  ({'; '.join(seen[repo])})" if args.why else repo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
