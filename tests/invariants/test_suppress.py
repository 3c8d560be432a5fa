"""Inline suppressions silence one statement's findings, and unused ones can be reported."""

from __future__ import annotations

from tests.invariants.conftest import Project

HEADER = '''
import asyncio


class Engine:
    async def generate(self, step):
        async with self._mlx_lock:
'''


def _engine(body: str) -> str:
    return HEADER + "".join(f"            {line}\n" for line in body.splitlines())


def test_ignore_with_reason_silences_only_its_rule_on_its_statement(project: Project) -> None:
    project.write("e.py", _engine(
        "await asyncio.to_thread(step)  # invariants: ignore[INV105] the owner drains it\n"
        "await asyncio.to_thread(step)"
    ))
    run = project.run("check")
    assert [line.split(":")[1] for line in run.lines()] == ["8"], run.out


def test_a_merged_finding_is_merged_after_suppressions(project: Project) -> None:
    """INV105 reports a block's unsafe awaits once, at the first; a suppression of that one leaves the next
    reported on its own, not silenced with it."""
    project.write("a.py", _engine("await asyncio.to_thread(step)\nawait asyncio.to_thread(after)"))
    project.write("b.py", _engine(
        "await asyncio.to_thread(step)  # invariants: ignore[INV105] the owner drains it\n"
        "await asyncio.to_thread(after)"
    ))
    merged, alone = project.run("check").lines()
    assert merged.startswith("a.py:7:") and "(and so does the await of `after` below): create a task" in merged
    assert alone.startswith("b.py:8:") and "so does" not in alone


def test_noqa_with_the_id_suppresses_and_other_ids_do_not(project: Project) -> None:
    project.write("a.py", _engine("await asyncio.to_thread(step)  # noqa: INV105"))
    project.write("b.py", _engine("await asyncio.to_thread(step)  # noqa: E501, INV101"))
    project.write("c.py", _engine("await asyncio.to_thread(step)  # noqa"))
    assert [line.split(":")[0] for line in project.run("check").lines()] == ["b.py", "c.py"]


def test_comment_on_any_line_of_a_multiline_statement_or_the_line_above(project: Project) -> None:
    project.write("a.py", _engine("await asyncio.to_thread(\n    step,\n)  # invariants: ignore[INV105]"))
    project.write("b.py", _engine("# invariants: ignore[INV105] worker is idempotent\nawait asyncio.to_thread(step)"))
    project.write("c.py", _engine("x = 1  # invariants: ignore[INV105]\nawait asyncio.to_thread(step)"))
    assert [line.split(":")[0] for line in project.run("check").lines()] == ["c.py"]


def test_suppression_on_a_compound_statement_covers_its_header_not_its_body(project: Project) -> None:
    project.config('select = ["INV", "INV101"]\n')  # INV101 is opt-in
    project.write("a.py", '''
        import asyncio

        async def handle(engine, request):
            async with asyncio.timeout(60):  # invariants: ignore[INV101] streaming keeps the client busy
                return await asyncio.wait_for(engine.generate(request), timeout=30)
    ''')
    assert [line.split(":")[1] for line in project.run("check").lines()] == ["5"]


def test_bare_ignore_silences_every_rule_there(project: Project) -> None:
    project.write("a.py", _engine("await asyncio.to_thread(step)  # invariants: ignore"))
    assert project.run("check").code == 0


def test_unused_suppressions_are_reported_when_asked(project: Project) -> None:
    project.config('select = ["INV", "INV101"]\n')  # a suppression of a rule that does not run is not judged
    project.write("a.py", '''
        import asyncio  # invariants: ignore[INV105]

        async def f():
            await asyncio.sleep(1)  # noqa: INV101
            await asyncio.sleep(2)  # noqa: E501
    ''')
    assert project.run("check").code == 0
    run = project.run("check", "--report-unused-suppressions")
    assert run.code == 1
    assert run.lines() == [
        "a.py:1:1: INV001 unused suppression of INV105: it reports nothing on this statement; remove it",
        "a.py:4:1: INV001 unused suppression of INV101: it reports nothing on this statement; remove it",
    ]


def test_a_used_suppression_is_not_reported_as_unused(project: Project) -> None:
    project.write("a.py", _engine("await asyncio.to_thread(step)  # invariants: ignore[INV105]"))
    assert project.run("check", "--report-unused-suppressions").code == 0


def test_a_marker_quoted_in_a_string_is_no_suppression(project: Project) -> None:
    project.write("a.py", _engine(
        'note = "await it  # invariants: ignore[INV105]"\n'
        "await asyncio.to_thread(step)"
    ))
    project.write("b.py", '''
        """Docs may show the syntax:

            await asyncio.to_thread(step)  # invariants: ignore[INV105] the owner drains it
        """
    ''')
    assert [line.split(":")[0] for line in project.run("check").lines()] == ["a.py"]
    assert project.run("check", "--report-unused-suppressions", "b.py").code == 0
