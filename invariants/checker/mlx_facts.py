"""MLX's thread-safety facts, per version: the one table the version-dependent rules consult.

A finding that is only true before some release names the facts it depends on
(`FileContext.report_at(..., requires=(...))`, `ModelFinding.requires`); the runner asks
`judge` with the versions the file's project admits (`pins.py`). Where every fact holds for
those versions the finding is not reported; where one is known not to hold it is reported
as always; where a version is unknown it is reported with `unknown_note` appended, which
says which versions it is about and how to pin one.

To add a fact: a row here with the first release it holds in and the release or pull
request that says so, then `requires=("its-id",)` on the findings it makes untrue. A finding
true only where a fact holds (a stream made on one thread fails on another only once streams
are per thread) names it `"from:its-id"`: it is untrue where the project runs only releases
before it (an exact pin, a lock file, the settings: `Pins.exact`), reported as always where
every version it admits is past it, and with `unknown_note` otherwise. A fact
about calls that first appeared in that very release names them in `calls` instead: a
project that makes them runs a release where it holds, so no version is asked, and the
rules count them as touching no MLX state (`mlx_api.HARMLESS_CORE`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from mlx_invariants.checker.pins import OVERRIDE_KEYS, Pins
from mlx_invariants.checker.versions import Release, release_text


@dataclass(frozen=True)
class Fact:
    """`holds` from the first release of `since` on. With several packages (one per generation library),
    it holds where the project names at least one of them and every one it names is that new."""

    id: str
    since: tuple[tuple[str, Release], ...]  # (package, first release it holds in)
    holds: str
    source: str
    calls: tuple[str, ...] = ()  # mlx.core calls (names in `mlx.core.`) as old as the fact: safe on any thread
    # Keywords of mlx-lm's generation that raise where the fact holds: the analysis itself reads such a call as
    # running no MLX for a project past the release (`analysis_facts`), so the fact decides before any rule does.
    keywords: tuple[str, ...] = ()

    def before(self) -> str:
        return " or ".join(f"{package} before {release_text(version)}" for package, version in self.since)

    def after(self) -> str:
        return " or ".join(f"{package} {release_text(version)} or later" for package, version in self.since)


FACTS: tuple[Fact, ...] = (
    Fact(
        "thread-local-streams", (("mlx", (0, 31, 2, 1)),),
        "Each thread has its own default stream and its own command encoders: MLX work on two threads no "
        "longer shares one stream, and `mx.synchronize()` waits only for the calling thread's own work. An "
        "evaluated array may be used on any thread; a lazy one, or a stream made with `mx.new_stream`, "
        "raises \"There is no Stream(...) in current thread\" on a thread that did not make it. "
        "`mx.new_thread_local_stream` is one stream every thread gets its own instance of.",
        "MLX 0.31.2: ml-explore/mlx#3348 (thread-local command encoders), #3355 and #3405 "
        "(`new_thread_local_stream`)",
    ),
    Fact(
        "thread-local-generation-stream", (("mlx-lm", (0, 31, 3, 1)), ("mlx-vlm", (0, 5, 0, 1))),
        "The generation library's module-level `generation_stream` is an `mx.new_thread_local_stream`, so "
        "its generation runs on any thread; before, it was an `mx.new_stream` made on the importing thread, "
        "and with MLX 0.31.2 or later generation on any other thread raised \"There is no Stream(gpu, 0) in "
        "current thread\" (ml-explore/mlx#3727).",
        "mlx-lm 0.31.3: ml-explore/mlx-lm#1090; mlx-vlm 0.5.0: Blaizzy/mlx-vlm#1055",
    ),
    Fact(
        "allocator-clear-cache-thread-safe", (("mlx", (0, 12, 0, 1)),),
        "`clear_cache()` (`mx.clear_cache`, `mx.metal.clear_cache`) takes the allocator's mutex and frees "
        "only the buffers of its cache, which no array holds: the buffers a kernel uses are held by its "
        "command buffer's completion handler until the GPU is done with them, and an allocation under "
        "memory pressure already frees cached buffers the same way on whichever thread it runs. So it "
        "encodes nothing and may run on any thread beside a worker mid-step; it holds in every release "
        "that has the call.",
        "MLX 0.12.0: ml-explore/mlx#1032 added `clear_cache` under the mutex; the same at 0.31.2, 0.32.0 and "
        "0.32.1 (mlx/backend/metal/allocator.cpp `MetalAllocator::clear_cache`, mlx/backend/cuda/allocator.cpp "
        "`CudaAllocator::clear_cache`; the completion handler holding the buffers: mlx/backend/metal/metal.cpp "
        "at 0.12.0, eval.cpp at 0.32.0)",
        calls=("clear_cache",),
    ),
    Fact(
        "sampler-only-generation", (("mlx-lm", (0, 21, 0, 1)),),
        "mlx-lm's generation samples only through a `sampler` and `logits_processors`: `generate_step`, to "
        "which `generate` and `stream_generate` hand their keywords, no longer takes the deprecated `temp`, "
        "`top_p`, `min_p`, `min_tokens_to_keep`, `repetition_penalty` or `repetition_context_size`, so a call "
        "passing one raises TypeError before any MLX runs (`temperature` it never took).",
        "mlx-lm 0.21.0: ml-explore/mlx-examples#1155 (dfd2d3e) dropped them from `generate_step`; reported "
        "against 0.21.0 from PyPI in ml-explore/mlx-examples#1201",
        keywords=("temp", "top_p", "min_p", "min_tokens_to_keep", "repetition_penalty", "repetition_context_size"),
    ),
)
BY_ID = {fact.id: fact for fact in FACTS}
# The facts the analysis reads per file, and so part of the key its results are cached under.
ANALYSIS_FACTS = tuple(fact.id for fact in FACTS if fact.keywords)


class Verdict(enum.Enum):
    HOLDS = "holds"  # every fact holds for the versions the project admits: the finding is not true there
    FAILS = "fails"  # one is known not to hold: the finding stands
    UNKNOWN = "unknown"  # a version it depends on is unknown


def _verdict(fact: Fact, pins: Pins) -> Verdict:
    named = [(package, version) for package, version in fact.since if package in pins.floors]
    if not named:
        return Verdict.UNKNOWN
    floors = [(pins.floor(package), version) for package, version in named]
    if any(floor is not None and floor < version for floor, version in floors):
        return Verdict.FAILS
    return Verdict.UNKNOWN if any(floor is None for floor, _ in floors) else Verdict.HOLDS


FROM = "from:"  # a finding true only where the fact after it holds


def _from_verdict(fact: Fact, pins: Pins) -> Verdict:
    """HOLDS where the project runs only releases before `fact` (the finding is untrue there), FAILS where
    every release it admits has it (the finding stands), else UNKNOWN."""
    named = [(package, version) for package, version in fact.since if package in pins.floors]
    floors = [(package, pins.floor(package), version) for package, version in named]
    if floors and all(p in pins.exact and f is not None and f < v for p, f, v in floors):
        return Verdict.HOLDS
    if floors and all(f is not None and f >= v for _, f, v in floors):
        return Verdict.FAILS
    return Verdict.UNKNOWN


def judge(requires: Iterable[str], pins: Pins) -> Verdict:
    """Whether a finding that is untrue where all of `requires` hold (and where any `from:` fact of them
    is known absent) is untrue for this project."""
    requires = list(requires)
    needed = [_from_verdict(BY_ID[fact[len(FROM):]], pins) for fact in requires if fact.startswith(FROM)]
    if Verdict.HOLDS in needed:
        return Verdict.HOLDS
    verdicts = [_verdict(BY_ID[fact], pins) for fact in requires if not fact.startswith(FROM)]
    if verdicts and Verdict.UNKNOWN not in verdicts and Verdict.FAILS not in verdicts:
        return Verdict.HOLDS
    if Verdict.FAILS in verdicts:
        return Verdict.FAILS
    return Verdict.UNKNOWN if Verdict.UNKNOWN in verdicts + needed else Verdict.FAILS


def analysis_facts(pins: Pins) -> frozenset[str]:
    """The facts of ANALYSIS_FACTS that hold for every version the project admits. Where a version is unknown
    none is taken to hold: a call that raises only on newer releases is read as running its MLX."""
    return frozenset(fact for fact in ANALYSIS_FACTS if _verdict(BY_ID[fact], pins) is Verdict.HOLDS)


def rejected_keywords(holds: Iterable[str]) -> frozenset[str]:
    """The generation keywords that raise under the facts in `holds`."""
    return frozenset(keyword for fact in holds for keyword in BY_ID[fact].keywords)


def unknown_note(requires: Iterable[str], pins: Pins) -> str:
    """What a finding of unknown truth appends to its message: the versions it is about, and how to pin."""
    requires = list(requires)
    needed = [BY_ID[fact[len(FROM):]] for fact in requires if fact.startswith(FROM)
              if _from_verdict(BY_ID[fact[len(FROM):]], pins) is Verdict.UNKNOWN]
    facts = [BY_ID[fact] for fact in requires if not fact.startswith(FROM)]
    if needed and not any(_verdict(fact, pins) is Verdict.UNKNOWN for fact in facts):
        packages = list(dict.fromkeys(p for fact in needed for p, _ in fact.since))
        keys = ", ".join(OVERRIDE_KEYS[package] for package in packages)
        return (f" (true for {' and '.join(fact.after() for fact in needed)}, which this project admits; if it "
                f"runs an older {', '.join(packages)}, set {keys} in [tool.invariants])")
    missing = list(dict.fromkeys(p for fact in facts if _verdict(fact, pins) is Verdict.UNKNOWN
                                 for p in _unpinned(fact, pins)))
    keys = ", ".join(OVERRIDE_KEYS[package] for package in missing)
    return (f" (true for {' or '.join(fact.before() for fact in facts)}; this project pins no version of "
            f"{', '.join(missing)}: pin one in its metadata, or set {keys} in [tool.invariants])")


def _unpinned(fact: Fact, pins: Pins) -> list[str]:
    """The packages of `fact` whose version is unknown: those the project names without a floor, or,
    if it names none of them, all of them."""
    named = [package for package, _ in fact.since if package in pins.floors]
    return [package for package in (named or [p for p, _ in fact.since]) if pins.floor(package) is None]
