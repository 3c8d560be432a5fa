"""docs/fuzz-adapters.md's engine-author walkthrough, run as written: its files are the doc's fenced blocks.

The walkthrough fuzzes a third-party engine (`toyengine`, with the seed-000 bug) from that engine's own
pytest. Each block after a `<!-- file: PATH -->` comment is written to PATH in a scratch project, and
each block after `<!-- fix: PATH replaces Class.method -->` (the bug's fix) or `<!-- marks: ... -->`
(the optional points) replaces that method when the test makes that edit. The commands the doc's
`<!-- output: NAME -->` blocks show are run there in a fresh interpreter: the engine as shipped must
fail with the finding the doc names and pass with the fix, and with the marks the doc's scenario must
fail on every replay until the fix. So the doc cannot drift from what the fuzzer does, nor show a fix
that is not one.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "fuzz-adapters.md"
_BLOCK = re.compile(r"^<!-- (?P<what>file|fix|marks|output): (?P<spec>[^>]*?) -->\n```[^\n]*\n(?P<body>.*?)^```$",
                    re.M | re.S)
_EDIT = re.compile(r"(?P<path>\S+) replaces (?P<cls>\w+)\.(?P<method>\w+)$")
_HEADLINE = re.compile(r"^\[1\] (?P<oracle>[\w-]+): ", re.M)


@dataclass(frozen=True)
class Edit:
    path: str
    cls: str
    method: str
    text: str   # the method's new text, indented as in the class


@dataclass(frozen=True)
class Walkthrough:
    files: dict[str, str]       # path in the engine's repository -> its text
    edits: dict[str, list[Edit]]  # "fix" (the bug's fix), "marks" (the optional points) -> their edits
    outputs: dict[str, str]     # "failing", "replay", "clean", ... -> the text pasted in the doc

    def project(self, root: Path, *edits: str) -> None:
        """Write the engine's repository under `root`, with the named edits made."""
        files = dict(self.files)
        for edit in (e for name in edits for e in self.edits[name]):
            files[edit.path] = replace_method(files[edit.path], edit.cls, edit.method, edit.text)
        for path, text in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)


def read_walkthrough(text: str) -> Walkthrough:
    files: dict[str, str] = {}
    edits: dict[str, list[Edit]] = {"fix": [], "marks": []}
    outputs: dict[str, str] = {}
    for block in _BLOCK.finditer(text):
        what, spec, body = block["what"], block["spec"].strip(), block["body"]
        if what == "file":
            files[spec] = body
        elif what == "output":
            outputs[spec] = body
        else:
            edit = _EDIT.match(spec)
            assert edit, f"an edit comment reads '{what}: PATH replaces Class.method', got {spec!r}"
            edits[what].append(Edit(edit["path"], edit["cls"], edit["method"], body))
    return Walkthrough(files, edits, outputs)


def replace_method(source: str, cls: str, method: str, new: str) -> str:
    """`source` with `cls.method` (its decorators and body) replaced by `new`, a method indented as in the class."""
    tree = ast.parse(source)
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    node = next(n for n in klass.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == method)
    lines = source.splitlines(keepends=True)
    first = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
    return "".join(lines[:first]) + new + "".join(lines[node.end_lineno:])


def start(project: Path, command: str) -> subprocess.Popen[str]:
    """A `$ python ...` line the doc shows, run in `project` with this interpreter (the venv that has
    mlx-invariants), as the engine's maintainer runs it from the repository root."""
    assert command.startswith("$ python "), command
    args = command[len("$ python "):].split()
    return subprocess.Popen([sys.executable, *args, *(["-p", "no:cacheprovider"] if "pytest" in args else [])],
                            cwd=project, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def runs_masked(line: str) -> str:
    """A replay line with its count of violating runs left out."""
    return re.sub(r"violations in \d/3 run\(s\)", "violations in N/3 run(s)", line)


def finish(*runs: subprocess.Popen[str]) -> list[str]:
    """Each run's output, once all have ended (they run side by side: each is about one core)."""
    try:
        return [run.communicate(timeout=600)[0] for run in runs]  # a backstop: the clean run spends the 120 s budget
    finally:
        for run in runs:
            run.kill()


# Two pytest runs side by side, one spending the ci profile's whole 120 s budget: nightly. The marked-points
# test below replays the same doc's scenarios in the default run.
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_walkthrough_fails_as_the_doc_shows_and_its_fix_passes(tmp_path: Path) -> None:
    walk = read_walkthrough(DOC.read_text())
    assert {"toyengine/__init__.py", "toyengine/fuzzing.py", "tests/test_fuzz.py"} <= set(walk.files), walk.files
    assert "mlx_invariants" not in walk.files["toyengine/__init__.py"], "the engine must be third-party code"
    assert {"failing", "replay", "clean"} <= set(walk.outputs), walk.outputs
    assert len(walk.edits["fix"]) == 1, walk.edits
    failing, clean = walk.outputs["failing"], walk.outputs["clean"]
    command = failing.splitlines()[0]
    assert clean.splitlines()[0] == command and "1 passed" in clean, clean
    shown = _HEADLINE.search(failing)
    assert shown, "the doc's failing output shows no finding"
    walk.project(tmp_path / "buggy")
    walk.project(tmp_path / "fixed", "fix")
    out, fixed_out = finish(start(tmp_path / "buggy", command), start(tmp_path / "fixed", command))

    assert "1 failed" in out and "fuzzing toyengine.fuzzing:make: 1 new finding(s)" in out, out
    assert "Traceback" not in out, out
    found = _HEADLINE.search(out)
    assert found and found["oracle"] == shown["oracle"], out
    for line in ("shrunk scenario: ", "report: ", "replay: PYTHONPATH=", "run folder: "):
        assert line in out and line in failing, (line, out)
    assert walk.outputs["replay"].startswith("$ PYTHONPATH=") and f"{shown['oracle']}: " in walk.outputs["replay"]
    assert "1 passed" in fixed_out, fixed_out


def test_marked_points_make_the_doc_s_scenarios_fail_on_every_replay_until_the_fix(tmp_path: Path) -> None:
    """With the marks, a cancel at WORKER_STARTED pauses the worker before its MLX work: no race is left, so
    the doc's replays show the bug in 3 runs of 3, and nothing once the fix is in. Without the fix's line
    that reads the worker's error, an MLX error after a disconnect is the loop error the doc shows."""
    walk = read_walkthrough(DOC.read_text())
    assert walk.edits["marks"] and {"worker-started.json", "worker-raise.json"} <= set(walk.files), walk.edits
    failing, clean = walk.outputs["marked-failing"], walk.outputs["marked-clean"]
    unretrieved = walk.outputs["marked-unretrieved"]
    command, raising = failing.splitlines()[0], unretrieved.splitlines()[0]
    assert clean.splitlines()[0] == command, clean
    walk.project(tmp_path / "buggy", "marks")
    walk.project(tmp_path / "fixed", "marks", "fix")
    (fix,) = walk.edits["fix"]
    less = "".join(line for line in fix.text.splitlines(keepends=True) if "job.cancelled()" not in line
                   and "job.exception()" not in line)
    assert less != fix.text, "the fix no longer reads the worker's error"
    walk.project(tmp_path / "unretrieved", "marks")
    engine = tmp_path / "unretrieved" / fix.path
    engine.write_text(replace_method(engine.read_text(), fix.cls, fix.method, less))
    out, fixed_out, raised, raised_fixed = finish(
        start(tmp_path / "buggy", command), start(tmp_path / "fixed", command),
        start(tmp_path / "unretrieved", raising), start(tmp_path / "fixed", raising))

    verdict = "FUZZ VIOLATION in toyengine.fuzzing:make: lock-released-early: "
    assert failing.splitlines()[2].startswith(verdict), failing
    assert out.splitlines()[0] == failing.splitlines()[1] and out.splitlines()[1].startswith(verdict), out
    assert fixed_out.splitlines() == clean.splitlines()[1:], fixed_out
    # A future's unretrieved exception is reported when the collector finalizes it, which a loaded box can
    # put off past a run's end: the doc's 3/3 may read 2/3 there, the finding itself may not change.
    assert [runs_masked(line) for line in raised.splitlines()[:2]] == \
        [runs_masked(line) for line in unretrieved.splitlines()[1:3]], raised
    assert re.search(r"violations in [123]/3 run\(s\)", raised.splitlines()[0]), raised
    assert raised_fixed.splitlines() == [unretrieved.splitlines()[1].replace("in 3/3 run(s)", "in 0/3 run(s)")], \
        raised_fixed


def test_a_fix_replaces_exactly_the_method_it_names() -> None:
    source = "class A:\n    def f(self):\n        return 1\n\n    @property\n    def g(self):\n        return 2\n"
    fixed = replace_method(source, "A", "g", "    def g(self):\n        return 3\n")
    assert fixed == "class A:\n    def f(self):\n        return 1\n\n    def g(self):\n        return 3\n"
