"""Leave-one-repository-out: each repository's cases scored by the rules as they stood
before anyone here studied that repository's cases, beside today's rules.

A rule tuned on a case and scored on the same case measures memory, not the rule
(the corpus README). So every repository names the commit of this project whose
checker had not yet seen its cases, and that commit's checker (`checker_at`) scores
them again. Where the rules were grown on a repository from the start, no such commit
exists: the earliest checker stands in, and the doc says so.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from corpus_bench import checker_at
from corpus_bench.cases import Split
from corpus_bench.checker_at import CheckerTree
from corpus_bench.run import Results, run_cases
from corpus_bench.scoring import BugScore, CleanScore, Summary, summarise


@dataclass(frozen=True)
class Studied:
    commit: str  # this project's commit whose checker had not seen the repository's cases
    why: str  # how that commit was chosen, for the doc
    held_out: bool = True  # False: the rules were grown on this repository from the start


# The earliest commit whose checker runs: f0ca217 ("checker: inline suppressions"), 2026-11-21.
# The first checker commit, 492f5ad, and the four after it import a `suppress` module that
# f0ca217 added, so they stop on every file. The training repositories' cases shaped the
# rules from their first version on, so this is no held-out figure for them.
EARLIEST = "f0ca21744f2577cd2d43c9bf857eb0215255a790"
_TRAINING = Studied(
    EARLIEST, "not held out: the rules were grown on the training repositories from the start, so no checker "
    "had not seen them; this is the earliest checker that runs (the first checker commit, 492f5ad, and the four "
    "after it import a module f0ca217 added)", held_out=False)
_MINED = Studied(
    "08bf7442233e8c0a3989fdba413cc30bc1c3f17f",
    "the parent of 7c1770e, which brought its cases in (benchmarks/corpus_bench/cases/mined.json); the rules "
    "changed after it with those cases in the tree: db52558, then 1337297, written on studying the mined misses "
    "(S 1/4 -> 4/4)")

# HEAD when heldout2.json's cases were mined (issue 23 item 4), before anyone here read those repositories;
# no rule changed in that work.
_HELDOUT2 = Studied(
    "700b13ccf6d850786732707feb0532a889c9dde9",
    "HEAD when their cases (benchmarks/corpus_bench/cases/heldout2.json) were mined, scored before anyone here "
    "read these repositories; no rule changed in that work")

# HEAD when heldout3.json's cases were mined (issue 23 item 4), recorded before that work read these repositories
# or the rules' code; no rule changed in that work.
_HELDOUT3 = Studied(
    "38eb35d81aa4d42d851af413eef931426214724f",
    "HEAD when their cases (benchmarks/corpus_bench/cases/heldout3.json) were mined, recorded before anyone here "
    "read these repositories; no rule changed in that work")

# HEAD when heldout4.json's cases were mined (issue 23 item 4), recorded before that work read these repositories
# or the rules' code; no rule changed in that work.
_HELDOUT4 = Studied(
    "d26c04ecf82a9993b10747447fa1ff0b2edc5db3",
    "HEAD when their cases (benchmarks/corpus_bench/cases/heldout4.json) were mined, recorded before anyone here "
    "read these repositories; no rule changed in that work. Commits made meanwhile (a233234, 034d2d5) graded rules "
    "on these repositories' HEAD code, not on these cases, so today's figures are no longer unseen ones")

# HEAD when heldout5.json's cases were mined (issue 23 item 4), recorded before that work read these repositories
# or the rules' code; no rule changed in that work.
_HELDOUT5 = Studied(
    "982717c2e1ffacd15ad7b4396d0ca095e61ea453",
    "HEAD when their cases (benchmarks/corpus_bench/cases/heldout5.json) were mined, recorded before anyone here "
    "read these repositories; no rule changed in that work")

# HEAD when heldout6.json's cases were mined (issue 23 item 4), recorded before that work read this repository
# or the rules' code; no rule changed in that work.
_HELDOUT6 = Studied(
    "fb4cef2c73a61a03db859e90b2cde912a5973290",
    "HEAD when its cases (benchmarks/corpus_bench/cases/heldout6.json) were mined, recorded before anyone here "
    "read this repository; no rule changed in that work")

# HEAD when heldout7.json's cases were mined (issue 23 item 4), recorded before that work read this repository
# or the rules' code; no rule changed in that work.
_HELDOUT7 = Studied(
    "53aa2ca4b563ceb6acf37b61d12897bd23cd602a",
    "HEAD when its cases (benchmarks/corpus_bench/cases/heldout7.json) were mined, recorded before anyone here "
    "read this repository; no rule changed in that work")

# HEAD when heldout8.json's cases were mined (issue 23 item 4), recorded before that work read this repository
# or the rules' code; no rule changed in that work.
_HELDOUT8 = Studied(
    "6e36dc96a145ec911b2c0f5792b6cf2d19015258",
    "HEAD when its cases (benchmarks/corpus_bench/cases/heldout8.json) were mined, recorded before anyone here "
    "read this repository; no rule changed in that work")

# HEAD when heldout9.json's cases were mined (issue 23 item 4), recorded before that work read these repositories
# or the rules' code; no rule changed in that work.
_HELDOUT9 = Studied(
    "f544669b181954b6337b20d96b1a27461ead03d9",
    "HEAD when their cases (benchmarks/corpus_bench/cases/heldout9.json) were mined, recorded before anyone here "
    "read these repositories; no rule changed in that work")

# HEAD when heldout10.json's cases were mined (issue 23 item 4), recorded before that work read these repositories
# or the rules' code; no rule changed in that work.
_HELDOUT10 = Studied(
    "18ba90a08a0535aeb875468fd922fd65f13150fc",
    "HEAD when their cases (benchmarks/corpus_bench/cases/heldout10.json) were mined, recorded before anyone here "
    "read these repositories; no rule changed in that work")

# HEAD when heldout11.json's cases were mined, recorded before that work read these repositories or the rules'
# code; no rule changed in that work.
_HELDOUT11 = Studied(
    "57e5c4bf7fb90f27eb6fc1d1c98feb6466342a5e",
    "HEAD when their cases (benchmarks/corpus_bench/cases/heldout11.json) were mined, recorded before anyone here "
    "read these repositories; no rule changed in that work")

# HEAD when heldout12.json's cases were mined, recorded before that work read this repository or the rules' code; no
# rule changed in that work.
_HELDOUT12 = Studied(
    "e8f2e89365331a230540fe9e9dac8c34d0660c46",
    "HEAD when its cases (benchmarks/corpus_bench/cases/heldout12.json) were mined, recorded before anyone here "
    "read this repository; no rule changed in that work")

# HEAD when heldout13.json's cases were mined, recorded before that work read this repository or the rules' code; no
# rule changed in that work.
_HELDOUT13 = Studied(
    "61006780f370064afd71de16261aadb83d673242",
    "HEAD when its cases (benchmarks/corpus_bench/cases/heldout13.json) were mined, recorded before anyone here "
    "read this repository; no rule changed in that work. Meanwhile INV132 (025c40b) was written after reading one "
    "of this repository's fixes (73af334, Studio's routes/inference.py), a commit none of its cases names, so "
    "today's figures on it are no longer unseen ones")

# HEAD when heldout14.json's cases were mined, recorded before that work read this repository or the rules' code; no
# rule changed in that work.
_HELDOUT14 = Studied(
    "679753b6f5389a7e394f9d21df12ff7de82a88f7",
    "HEAD when its cases (benchmarks/corpus_bench/cases/heldout14.json) were mined, recorded before anyone here "
    "read this repository; no rule changed in that work")

# HEAD when heldout15.json to heldout17.json's cases were mined (the twelfth session on issue 23), recorded before that
# work read these repositories' cases or anyone mining read the rules' code. The one rule written meanwhile, INV134
# (d2b05a3), is opt-in, so the default rules these figures use are those of this commit. One Studied for the three
# files: the doc names each commit once, with its reasons.
_HELDOUT15_17 = Studied(
    "05bb67e4f6e320e77f363f1b4b29ccd0ee70eafa",
    "HEAD when their cases (benchmarks/corpus_bench/cases/heldout15.json to heldout17.json) were mined, recorded "
    "before anyone here read them; the one rule written meanwhile (INV134, d2b05a3) is opt-in, so the default rules "
    "are this commit's. Two lines of heldout15.json and heldout16.json met the eye in a grep over benchmarks/ before "
    "they were scored (the note of one pipecat case, the fix note of one OpenJarvis case), and MinerU's HEAD code "
    "(79d6d8d) was one of precision set n's nine servers (benchmarks/precision_unstudied.py), its one finding there "
    "graded blind; no rule was written from either")

# HEAD when heldout18.json and heldout19.json's cases were mined (the thirteenth session on issue 23), recorded before
# anyone here read them; scored at this commit before they were read: heldout18 S 1/4, P 0/6, silent at fix 8/8;
# heldout19 S 0/2, P 1/9, 10/10. The rule written while they were mined, INV137, is opt-in, so the default rules are
# those of 5ce9cb3 but for one change: modules outside a package in a folder of tests, benchmarks or scripts are no
# package rule's entries.
_HELDOUT18_19 = Studied(
    "e4ea85a6dee9440de2c3bf04cbfd528feefa9343",
    "HEAD when their cases (benchmarks/corpus_bench/cases/heldout18.json and heldout19.json) were mined, scored "
    "before anyone here read them; the rule written meanwhile (INV137) is opt-in, and the miners picked outside "
    "the list benchmarks/studied_repos.py prints")

# HEAD when heldout20.json and heldout21.json's cases were mined (later in the thirteenth session), with the three
# rules written that session before them (INV137 opt-in, INV138 and INV139 on by default); scored at this commit
# before anyone here read them: heldout20 S 0/1, P 0/6, silent at fix 7/7; heldout21 S 0/3, P 0/10, 12/12.
_HELDOUT20_21 = Studied(
    "ef2e6c88f7c4c3aa0f1bb30302864c9e1051b9a3",
    "HEAD when their cases (benchmarks/corpus_bench/cases/heldout20.json and heldout21.json) were mined, scored "
    "before anyone here read them, with the rules written earlier that session (INV138, INV139 on by default); the "
    "miners picked outside the list benchmarks/studied_repos.py prints")

# HEAD when heldout22.json and heldout23.json's cases were mined (the fourteenth session on issue 23), by miners who
# picked outside the list benchmarks/studied_repos.py prints; scored at this commit before anyone here read them:
# heldout22 S 0/1, P 0/9, silent at fix 13/13; heldout23 S 0/0, P 0/5, 9/9.
_HELDOUT22_23 = Studied(
    "a8faa5764dcba4149c3df463d01a50145ad21b28",
    "HEAD when their cases (benchmarks/corpus_bench/cases/heldout22.json and heldout23.json) were mined, scored "
    "before anyone here read them; the miners picked outside the list benchmarks/studied_repos.py prints")

# HEAD when heldout24.json and heldout25.json's cases were mined (the fifteenth session on issue 23), by miners who
# picked outside the list benchmarks/studied_repos.py prints, the 281 swept HEADs and every precision set; scored at
# this commit before anyone here read them: heldout24 S 0/4, P 0/10, silent at fix 10/10; heldout25 S 0/1, P 0/7,
# 9/9 (flake8-async and ruff found none either).
_HELDOUT24_25 = Studied(
    "d9757eeabad25fe681800a6f0f74a83ce4952dda",
    "HEAD when their cases (benchmarks/corpus_bench/cases/heldout24.json and heldout25.json) were mined, scored "
    "before anyone here read them; the miners picked outside the list benchmarks/studied_repos.py prints")

BEFORE_STUDIED: dict[str, Studied] = {
    "waybarrios/vllm-mlx": _TRAINING,
    "lightseekorg/smg": _TRAINING,
    "ml-explore/mlx-lm": _TRAINING,
    "cubist38/mlx-openai-server": _MINED,
    "madroidmaq/mlx-omni-server": _MINED,
    "exo-explore/exo": _MINED,
    "Blaizzy/mlx-vlm": _MINED,
    "techychamp/omlx": Studied(
        "f48abc9f9436956de3e3a8297840b3ca593be472",
        "HEAD when its cases (jundot/omlx, read from the fork techychamp/omlx) were added, scored before anyone "
        "here read them"),
    "Blaizzy/mlx-audio": _HELDOUT2,
    "GradientHQ/parallax": _HELDOUT2,
    "motsognirr/olmlx": _HELDOUT3,
    "tumma72/mlx-manager": _HELDOUT3,
    "xorbitsai/inference": _HELDOUT4,
    "mudler/LocalAI": _HELDOUT4,
    "huggingface/speech-to-speech": _HELDOUT5,
    "jamiepine/voicebox": _HELDOUT5,
    "homelab-00/TranscriptionSuite": _HELDOUT6,
    "transformerlab/transformerlab-api": _HELDOUT7,
    "fblissjr/heylookitsanllm": _HELDOUT8,
    "kashman001/local-model": _HELDOUT9,
    "decdees/LOcha": _HELDOUT9,
    "gdemerges/Benji": _HELDOUT9,
    "andychoi/ai-mlx-server": _HELDOUT10,
    "BuildItCode/MLX-Server": _HELDOUT10,
    "asher/gmlx": _HELDOUT11,
    "aperepel/claude-mlx-tts": _HELDOUT11,
    "epheterson/immich-ml-metal": _HELDOUT12,
    "unslothai/unsloth": _HELDOUT13,
    "firstbatchxyz/dnet": _HELDOUT14,
    "pipecat-ai/pipecat": _HELDOUT15_17,
    "open-jarvis/OpenJarvis": _HELDOUT15_17,
    "opendatalab/MinerU": _HELDOUT15_17,
    "opendatalab/mineru-vl-utils": _HELDOUT15_17,
    "avalan-ai/avalan": _HELDOUT18_19,
    "lm-sys/FastChat": _HELDOUT18_19,
    "vectorize-io/hindsight": _HELDOUT18_19,
    "geeks-accelerator/ollama-herd": _HELDOUT20_21,
    "docling-project/docling-serve": _HELDOUT20_21,
    "docling-project/docling-jobkit": _HELDOUT20_21,
    "OpenSourceWTF/mtplx-moe": _HELDOUT22_23,
    "ToPo-ToPo-ToPo/local-llm-server": _HELDOUT22_23,
    "nodetool-ai/nodetool-core": _HELDOUT24_25,
    "isair/jarvis": _HELDOUT24_25,
}


@dataclass
class RepoScores:
    repo: str
    split: str  # the case file's split
    cleans: int  # its clean files
    today: dict[str, Summary]  # by tool: this checkout's checker (or --checker-at's) and the baselines
    studied: Studied | None = None  # None: no before-studied commit declared
    before: Summary | None = None
    checker: CheckerTree | None = None  # the before-studied checker that ran
    rules: tuple[str, ...] = ()  # its rule ids
    crashes: tuple[str, ...] = ()  # the before-studied checker's failures on this repository's files


def _of_repo(results: Results, tool: str, repo: str) -> tuple[list[BugScore], list[CleanScore]]:
    return ([b for b in results.bugs[tool] if b.case.repo == repo],
            [c for c in results.cleans[tool] if c.case.repo == repo])


def by_repository(runs: list[tuple[Split, Results]], mirror_root: Path, plan: dict[str, Studied],
                  project: Path = checker_at.PROJECT, scope: str = "package") -> list[RepoScores]:
    """Today's figures of every repository of `runs`, and for each one `plan` names, its
    before-studied figures: one run of each named commit's checker over its repositories' cases, given
    what today's runs were given (`scope`, run.SCOPES)."""
    scores = []
    for split, results in runs:
        for repo in sorted({c.repo for c in split.cases}, key=str.lower):
            today = {tool: summarise(*_of_repo(results, tool, repo)) for tool in results.tools}
            cleans = len(_of_repo(results, "invariants", repo)[1])
            scores.append(RepoScores(repo, split.name, cleans, today, plan.get(repo)))
    commits = list(dict.fromkeys(s.studied.commit for s in scores if s.studied))
    with tempfile.TemporaryDirectory(prefix="invariants-checker-at-") as tmp:
        for index, commit in enumerate(commits):
            tree = checker_at.build(commit, Path(tmp) / f"{index:02d}", project)
            mine = [s for s in scores if s.studied and s.studied.commit == commit]
            repos = {s.repo for s in mine}
            cases = [c for split, _ in runs for c in split.cases if c.repo in repos]
            before = run_cases(cases, mirror_root, ("invariants",), None, "before studied", tree, scope)
            rules = tuple(tree.rules())
            for s in mine:
                s.before, s.checker, s.rules = summarise(*_of_repo(before, "invariants", s.repo)), tree, rules
                s.crashes = tuple(f"{tree.short}: {c}" for c in before.crashes if c.startswith(f"{s.repo}@"))
    return scores


def total(scores: list[RepoScores], pick) -> Summary | None:
    """The sum of one column over the repositories (None when any is missing)."""
    picked = [pick(s) for s in scores]
    if not picked or any(p is None for p in picked):
        return None
    return Summary(
        detected={d: sum(p.detected[d] for p in picked) for d in picked[0].detected},
        bugs={d: sum(p.bugs[d] for p in picked) for d in picked[0].bugs},
        silent=sum(p.silent for p in picked), silent_scored=sum(p.silent_scored for p in picked),
        clean_findings=sum(p.clean_findings for p in picked), clean_justified=sum(p.clean_justified for p in picked),
    )
