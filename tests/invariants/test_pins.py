"""The MLX version a checked project runs on, read from its metadata, and the findings true only before
some MLX release (mlx_facts.py): silent where the project is past it, reported with the versions they
are about where its version is unknown.

Five of the 26 non-true HEAD findings of ten MLX servers (issue 23) were this: INV107 on work handed to
the default pool and INV108 on `mx.synchronize()` on the loop, harmless from MLX 0.31.2, in projects that
require 0.31.2 or later (mlx-vlm `mlx>=0.32.0`, omlx `mlx==0.31.2`).
"""

from __future__ import annotations

import pytest

from mlx_invariants.checker import mlx_facts, pins
from mlx_invariants.checker.mlx_facts import Verdict
from tests.invariants.conftest import Project

OFF_POOL = """
import asyncio
import mlx.core as mx


async def evaluate(batch):
    return await asyncio.to_thread(lambda: mx.eval(mx.array(batch)))
"""
GENERATES = """
import asyncio
from mlx_lm import stream_generate


async def complete(model, tokenizer, prompt):
    return await asyncio.to_thread(lambda: list(stream_generate(model, tokenizer, prompt)))
"""


@pytest.mark.parametrize("text, line", [
    ("mlx>=0.31.2", ("mlx", (0, 31, 2, 1), False, False)),
    ("MLX_LM ~= 0.31.3", ("mlx-lm", (0, 31, 3, 1), False, False)),
    ("mlx[cpu]>=0.31.2; sys_platform == 'linux'", ("mlx", (0, 31, 2, 1), True, False)),
    ("mlx==0.30.0", ("mlx", (0, 30, 0, 1), False, True)),
    ("mlx>=0.32.0rc1,<0.33", ("mlx", (0, 32, 0, 0), False, False)),
    ("mlx (>=0.29)", ("mlx", (0, 29, 0, 1), False, False)),
    ("mlx", ("mlx", None, False, False)),
    ("mlx<0.32", ("mlx", None, False, False)),
    ("mlx-lm @ git+https://github.com/ml-explore/mlx-lm@2ed2231", ("mlx-lm", None, False, False)),
    ("mlx-vlm>=0.5.0", ("mlx-vlm", (0, 5, 0, 1), False, False)),
    ("mlx-metal==0.32.0", None),
    ("numpy>=1.24", None),
])
def test_a_requirement_of_an_mlx_package(text: str, line: tuple | None) -> None:
    assert pins.requirement(text) == line


def test_the_lowest_floor_of_the_sets_that_name_a_package() -> None:
    new, old = (0, 31, 2, 1), (0, 29, 0, 1)
    # Lines installed together: all must hold, so the highest floor; a bare `mlx` adds nothing.
    assert pins.admitted([[("mlx", None, False, False), ("mlx", new, False, False)]]) == {"mlx": new}
    # One conditional line per platform: the lowest; one without a version: unknown.
    assert pins.admitted([[("mlx", new, True, False), ("mlx", old, True, False)]]) == {"mlx": old}
    assert pins.admitted([[("mlx", new, True, False), ("mlx", None, True, False)]]) == {"mlx": None}
    # Sets installed apart (an extra and another, two requirements files): the lowest, unknown wins.
    assert pins.admitted([[("mlx", new, False, False)], [("mlx", old, False, False)], []]) == {"mlx": old}
    assert pins.admitted([[("mlx", new, False, False)], [("mlx", None, False, False)]]) == {"mlx": None}
    # Exact: every line naming it pins one release (`mlx==0.31.1`), in every set.
    assert pins.exact([[("mlx", old, False, True)], [("mlx", old, False, True), ("mlx-lm", new, False, False)]]) == {"mlx"}
    assert pins.exact([[("mlx", old, False, True)], [("mlx", new, False, False)]]) == frozenset()


def test_every_kind_of_metadata_is_read(project: Project) -> None:
    project.write("pep621/pyproject.toml", """
        [project]
        name = "a"
        dependencies = ["mlx>=0.31.2", "numpy"]
        [project.optional-dependencies]
        engine = ["mlx-lm>=0.31.3"]
    """)
    project.write("poetry/pyproject.toml", """
        [tool.poetry.dependencies]
        python = "^3.11"
        mlx = "^0.32.0"
        mlx-lm = {version = "~0.31.3"}
        [tool.poetry.group.dev.dependencies]
        mlx-vlm = "0.5.*"
    """)
    project.write("cfg/setup.cfg", """
        [options]
        install_requires =
            mlx==0.30.0
        [options.extras_require]
        gen =
            mlx-lm>=0.31.3
    """)
    project.write("setuppy/setup.py", """
        from setuptools import setup
        MIN_MLX_VERSION = "0.32.1"
        setup(name="a", install_requires=[f"mlx>={MIN_MLX_VERSION}; platform_system == 'Darwin'", "numpy"],
              extras_require={"cpu": [f"mlx[cpu]>={MIN_MLX_VERSION}"]})
    """)
    project.write("reqs/requirements.txt", "mlx>=0.32.0  # the floor\n-r requirements-lm.txt\n")
    project.write("reqs/requirements-lm.txt", "--extra-index-url https://example.invalid\nmlx-lm>=0.31.3\n")
    assert pins.read_folder(str(project.root / "pep621")).floors == {"mlx": (0, 31, 2, 1), "mlx-lm": (0, 31, 3, 1)}
    assert pins.read_folder(str(project.root / "poetry")).floors == {
        "mlx": (0, 32, 0, 1), "mlx-lm": (0, 31, 3, 1), "mlx-vlm": (0, 5, 0, 1)}
    assert pins.read_folder(str(project.root / "cfg")).floors == {"mlx": (0, 30, 0, 1), "mlx-lm": (0, 31, 3, 1)}
    assert pins.read_folder(str(project.root / "setuppy")).floors == {"mlx": (0, 32, 1, 1)}
    found = pins.read_folder(str(project.root / "reqs"))
    assert found.floors == {"mlx": (0, 32, 0, 1), "mlx-lm": (0, 31, 3, 1)}
    assert found.source == "requirements-lm.txt, requirements.txt"
    assert pins.read_folder(str(project.root)) is None  # its pyproject.toml names no MLX package


def test_the_nearest_folder_that_names_mlx_is_the_project_up_to_the_repository(project: Project) -> None:
    project.write("requirements.txt", "mlx>=0.31.2\n")
    project.write("svc/pyproject.toml", "[project]\nname = 'svc'\ndependencies = ['mlx==0.30.0']\n")
    project.write("repo/.git/HEAD", "ref: refs/heads/main\n")
    projects = pins.Projects()
    assert projects.of(str(project.write("pkg/deep/a.py", ""))).floors == {"mlx": (0, 31, 2, 1)}
    assert projects.of(str(project.write("svc/b.py", ""))).floors == {"mlx": (0, 30, 0, 1)}
    assert projects.of(str(project.write("repo/c.py", ""))).floors == {}  # not above its repository's top
    overridden = pins.Projects({"mlx": "0.32.0"}).of(str(project.root / "svc/b.py"))
    assert overridden.floors == {"mlx": (0, 32, 0, 1)} and "mlx-version in [tool.invariants]" in overridden.source


def test_a_fact_holds_only_where_every_version_it_names_is_known_and_new_enough() -> None:
    streams, generation = ("thread-local-streams",), ("thread-local-streams", "thread-local-generation-stream")
    new, old = (0, 31, 2, 1), (0, 30, 0, 1)
    assert mlx_facts.judge(streams, pins.Pins({"mlx": new})) is Verdict.HOLDS
    assert mlx_facts.judge(streams, pins.Pins({"mlx": old})) is Verdict.FAILS
    assert mlx_facts.judge(streams, pins.Pins({"mlx": None})) is Verdict.UNKNOWN
    assert mlx_facts.judge(streams, pins.Pins()) is Verdict.UNKNOWN
    assert mlx_facts.judge(streams, pins.Pins({"mlx": (0, 31, 2, 0)})) is Verdict.FAILS  # a pre-release of it
    # A generation needs the library it names (any one, every one named) past its thread-local stream.
    assert mlx_facts.judge(generation, pins.Pins({"mlx": new})) is Verdict.UNKNOWN
    assert mlx_facts.judge(generation, pins.Pins({"mlx": new, "mlx-lm": (0, 31, 3, 1)})) is Verdict.HOLDS
    assert mlx_facts.judge(generation, pins.Pins({"mlx": new, "mlx-lm": (0, 31, 2, 1)})) is Verdict.FAILS
    assert mlx_facts.judge(generation, pins.Pins({"mlx": new, "mlx-lm": (0, 31, 3, 1),
                                                  "mlx-vlm": (0, 4, 3, 1)})) is Verdict.FAILS
    note = mlx_facts.unknown_note(generation, pins.Pins({"mlx": new, "mlx-lm": None}))
    assert note == (" (true for mlx before 0.31.2 or mlx-lm before 0.31.3 or mlx-vlm before 0.5.0; this project "
                    "pins no version of mlx-lm: pin one in its metadata, or set mlx-lm-version in [tool.invariants])")



def test_a_finding_true_only_from_a_release_on_goes_where_the_project_runs_only_older_ones() -> None:
    """`from:` facts (a stream made on another thread, INV131): untrue only where the one release the project
    runs is older; reported plainly where every admitted release has the fact, with a note where some may."""
    after = ("from:thread-local-streams",)
    new, old = (0, 31, 2, 1), (0, 30, 4, 1)
    assert mlx_facts.judge(after, pins.Pins({"mlx": old}, exact=frozenset({"mlx"}))) is Verdict.HOLDS
    assert mlx_facts.judge(after, pins.Pins({"mlx": new})) is Verdict.FAILS
    assert mlx_facts.judge(after, pins.Pins({"mlx": old})) is Verdict.UNKNOWN  # `mlx>=0.30.4`: a fresh install is new
    assert mlx_facts.judge(after, pins.Pins()) is Verdict.UNKNOWN
    assert mlx_facts.unknown_note(after, pins.Pins({"mlx": old})) == (
        " (true for mlx 0.31.2 or later, which this project admits; if it runs an older mlx, set mlx-version in "
        "[tool.invariants])")
    # With the library's own stream: untrue where its thread-local stream is known, or mlx is known old.
    library = ("from:thread-local-streams", "thread-local-generation-stream")
    assert mlx_facts.judge(library, pins.Pins({"mlx": new, "mlx-lm": (0, 31, 3, 1)})) is Verdict.HOLDS
    assert mlx_facts.judge(library, pins.Pins({"mlx": old, "mlx-lm": (0, 30, 0, 1)},
                                              exact=frozenset({"mlx"}))) is Verdict.HOLDS
    assert mlx_facts.judge(library, pins.Pins({"mlx": new, "mlx-lm": (0, 30, 0, 1)})) is Verdict.FAILS

def test_every_fact_names_its_versions_and_its_source() -> None:
    assert len({f.id for f in mlx_facts.FACTS}) == len(mlx_facts.FACTS)
    for fact in mlx_facts.FACTS:
        assert fact.since and fact.holds and "#" in fact.source
        assert all(package in pins.PACKAGES for package, _ in fact.since)


def test_findings_stay_where_the_version_is_unknown_and_go_where_it_is_past_them(project: Project) -> None:
    project.write("app/pool.py", OFF_POOL)
    project.write("app/generate.py", GENERATES)
    unknown = project.run("check")
    assert unknown.rules() == ["INV107", "INV107"]
    assert all("pins no version of mlx" in line for line in unknown.lines())
    project.write("requirements.txt", "mlx>=0.31.2\nmlx-lm>=0.31.2\n")
    known = project.run("check")  # the cached results, judged by the new pins
    assert [line.split(":")[0] for line in known.lines()] == ["app/generate.py"]
    assert "pins no version" not in known.out  # mlx-lm 0.31.2 is known, and too old: reported as always
    project.write("requirements.txt", "mlx>=0.31.2\nmlx-lm>=0.31.3\n")
    assert project.run("check").code == 0
    project.write("requirements.txt", "mlx>=0.30.0\nmlx-lm>=0.31.3\n")
    assert project.run("check").rules() == ["INV107", "INV107"]
    project.write("requirements.txt", "mlx\nmlx-lm>=0.31.3\n")  # mlx left to mlx-lm, which requires 0.31.2
    assert project.run("check").code == 0
    project.write("requirements.txt", "mlx-lm>=0.31.2\n")  # an older mlx-lm requires an older mlx
    assert project.run("check").rules() == ["INV107", "INV107"]
    project.write("requirements.txt", "mlx-vlm>=0.5.0\n")
    assert project.run("check").code == 0
    project.config('mlx-version = "0.31.2"\n')  # the setting overrides the metadata
    assert project.run("check").code == 0


def test_a_suppression_of_a_finding_the_version_silences_is_unused(project: Project) -> None:
    project.write("requirements.txt", "mlx>=0.31.2\n")
    project.write("app/pool.py", OFF_POOL.replace("mx.array(batch)))", "mx.array(batch)))  # invariants: ignore[INV107]"))
    assert project.run("check", "--report-unused-suppressions").rules() == ["INV001"]


def test_a_version_setting_that_is_no_version_is_a_usage_error(project: Project) -> None:
    project.config('mlx-version = "latest"\n')
    project.write("app/pool.py", OFF_POOL)
    run = project.run("check")
    assert run.code == 2 and "'mlx-version' must be a version such as \"0.31.2\", got 'latest'" in run.err


UV_LOCK = """
version = 1

[[package]]
name = "mlx"
version = "{mlx}"

[[package]]
name = "mlx-lm"
version = "0.31.3"

[[package]]
name = "numpy"
version = "2.1.0"
"""


def test_a_lock_file_decides_only_what_the_metadata_leaves_open(project: Project) -> None:
    """smart-home (issue 23's set c) names mlx without a version and locks 0.30.4 in uv.lock: the findings
    said it pinned none."""
    project.write("app/pool.py", OFF_POOL)
    project.write("requirements.txt", "mlx\nmlx-lm\n")
    project.write("uv.lock", UV_LOCK.format(mlx="0.30.4"))
    found = pins.read_folder(str(project.root))
    assert found is not None and found.floors == {"mlx": (0, 30, 4, 1), "mlx-lm": (0, 31, 3, 1)}
    assert found.source == "requirements.txt, uv.lock"
    assert found.exact == {"mlx", "mlx-lm"}  # what the project's own environment runs
    old = project.run("check")
    assert old.rules() == ["INV107"] and "pins no version" not in old.out  # known, and too old: reported
    project.write("uv.lock", UV_LOCK.format(mlx="0.31.2"))
    assert project.run("check").code == 0
    project.write("requirements.txt", "mlx>=0.30.0\nmlx-lm\n")  # the metadata's floor is what any install admits
    assert project.run("check").rules() == ["INV107"]
