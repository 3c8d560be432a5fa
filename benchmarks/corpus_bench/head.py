"""`--head`: the checker on the newest commit of each mirror's default branch, every finding listed.

The corpus says how the checker does on known bugs; this says what it would
report on today's code, for a reviewer to judge finding by finding.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from corpus_bench import tools
from corpus_bench.checker_at import CheckerTree
from corpus_bench.run import CRASH_MARK, open_mirrors
from corpus_bench.tools import Finding

# The Python packages of each repository (not its tests, examples or scripts).
HEAD_PACKAGES = {
    "waybarrios/vllm-mlx": ("vllm_mlx",),
    "lightseekorg/smg": ("grpc_servicer/smg_grpc_servicer", "bindings/python/src/smg", "clients/python/smg_client"),
    "ml-explore/mlx-lm": ("mlx_lm",),
}


@dataclass(frozen=True)
class HeadRun:
    repo: str
    commit: str
    packages: tuple[str, ...]
    files: int
    findings: tuple[tuple[str, Finding], ...]  # (repository path, finding), by path then line

    def crashes(self) -> list[str]:
        return [f"{self.repo}@{self.commit} {path}: {f.message}" for path, f in self.findings
                if f.rule == "INV000" and CRASH_MARK in f.message]


def run_head(mirror_root: Path, repos: set[str], checker: CheckerTree | None = None) -> list[HeadRun]:
    known = sorted(r for r in repos if r in HEAD_PACKAGES)
    opened = open_mirrors(mirror_root, set(known))
    runs = []
    with tempfile.TemporaryDirectory(prefix="invariants-corpus-head-") as tmp:
        root = Path(tmp).resolve()
        for index, repo in enumerate(known):
            mirror = opened[repo]
            commit = mirror.head()
            tree = root / f"{index:02d}-head"
            folders = [mirror.materialise_package(commit, p, tree).resolve() for p in HEAD_PACKAGES[repo]]
            found = tools.run_invariants(folders, root, checker)
            files = sum(1 for folder in folders for _ in folder.rglob("*.py"))
            listed = sorted(((path.relative_to(tree).as_posix(), f) for path, items in found.items()
                             if path not in folders for f in items), key=lambda item: (item[0], item[1]))
            runs.append(HeadRun(repo, commit, HEAD_PACKAGES[repo], files, tuple(listed)))
    return runs
