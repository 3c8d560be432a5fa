"""benchmarks/corpus.py scores exactly as the corpus defines it, on a tiny mirror built here.

The mirror holds one file at two commits: the buggy one runs `mx.eval` on the event
loop at line 6 (INV108), the fixed one hands it to the owner thread but keeps a
second blocking call at line 12. The cases put their spans just within and just
outside the scoring's margins around those two lines. A second mirror of the same
history (`acme/mined`) stands for a repository of the mined split, which is scored
and reported apart from the training split.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import corpus  # noqa: E402  (the benchmark script, importable once benchmarks/ is on the path)
from corpus_bench import doc, mirrors  # noqa: E402
from corpus_bench.head import HeadRun  # noqa: E402
from corpus_bench.tools import Finding  # noqa: E402

BUGGY = """\
import mlx.core as mx


async def step(model, tokens):
    logits = prepare(tokens)
    mx.eval(logits)
    return logits
"""
FIXED = """\
import mlx.core as mx


async def step(owner, model, tokens):
    logits = prepare(tokens)
    await owner.run(lambda: mx.eval(logits))
    return logits


async def warm(model, tokens):
    logits = prepare(tokens)
    mx.eval(logits)
    return logits
"""
PATH = "srv/pkg/engine.py"
# Laid out beside the file under test, or not, by the scoring's tree rule.
CONTEXT = {"srv/pkg/helpers.py": "X = 1\n", "srv/pkg/types.pyi": "X: int\n", "srv/pkg/notes.txt": "no\n",
           "srv/pkg/sub/deep.py": "Y = 2\n", "srv/__init__.py": "", "srv/pkg/__init__.py": "", "top.py": "Z = 3\n"}


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                          cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """(mirrors folder, buggy commit, fix commit) of `acme/server`, a bare mirror."""
    work = tmp_path_factory.mktemp("work")
    git("init", "-q", cwd=work)
    for path, text in {**CONTEXT, PATH: BUGGY}.items():
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(text)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "buggy", cwd=work)
    buggy = git("rev-parse", "HEAD", cwd=work)
    (work / PATH).write_text(FIXED)
    git("commit", "-q", "-am", "fix", cwd=work)
    fix = git("rev-parse", "HEAD", cwd=work)
    root = tmp_path_factory.mktemp("mirrors")
    git("clone", "-q", "--mirror", str(work), str(root / "acme+server"), cwd=root)
    git("clone", "-q", "--mirror", str(work), str(root / "acme+mined" / "repo"), cwd=root)  # as `fetch` lays it out
    return root, buggy, fix


def bug(case_id: str, spans: list, fix_span: list | None, buggy: str, fix: str, detectability: str = "S",
        repo: str = "acme/server") -> dict:
    return {"kind": "bug", "id": case_id, "repo": repo, "class": "D", "detectability": detectability,
            "buggy_commit": buggy, "path": PATH, "spans": spans, "fix_commit": fix, "fix_span": fix_span}


def clean(case_id: str, commit: str, justified: list, repo: str = "acme/server") -> dict:
    return {"kind": "clean", "id": case_id, "repo": repo, "commit": commit, "path": PATH,
            "justified": [{"lines": span, "note": "accepted"} for span in justified]}


def write_splits(folder: Path, buggy: str, fix: str, mined: list[dict] | None = None) -> tuple[Path, Path]:
    """A training file (one detected case, one clean file) and a mined file (one missed case by default)."""
    train, other = folder / "train.json", folder / "mined.json"
    train.write_text(json.dumps([bug("T1", [[6, 6]], [[4, 8]], buggy, fix), clean("TC", fix, [])]))
    other.write_text(json.dumps(mined if mined is not None else
                                [bug("M1", [[20, 30]], None, buggy, fix, "P", repo="acme/mined")]))
    return train, other


def test_scoring_margins(mirror: tuple[Path, str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, buggy, fix = mirror
    cases = [
        bug("three-after", [[9, 9]], [[4, 9]], buggy, fix),  # finding at 6 = 9 - 3; fix finding at 12 = 9 + 3
        bug("three-before", [[1, 3]], [[12, 12]], buggy, fix),  # 6 = 3 + 3; the fix still fires inside its span
        bug("four-away", [[10, 14]], None, buggy, fix, "P"),  # 6 = 10 - 4; fix not scored
        clean("near-justified", fix, [[15, 20]]),  # 12 = 15 - 3
        clean("far-justified", fix, [[16, 20]]),  # 12 = 16 - 4
    ]
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    out = tmp_path / "out.json"
    code = corpus.main(["--cases", str(tmp_path / "cases.json"), "--mirrors", str(root), "--no-baselines",
                        "--json", str(out), "--write", str(tmp_path / "corpus.md")])
    assert code == 0
    data = json.loads(out.read_text())["splits"]["cases"]
    scores = {b["id"]: b["invariants"] for b in data["bugs"]}
    assert [f["line"] for f in scores["three-after"]["buggy"]] == [6]  # the fixture still trips INV108 once
    assert [f["line"] for f in scores["three-after"]["fix"]] == [12]
    assert scores["three-after"]["detected"] and scores["three-before"]["detected"]
    assert [f["rule"] for f in scores["three-after"]["on_defect"]] == ["INV108"]
    assert not scores["four-away"]["detected"]
    assert scores["three-after"]["silent_at_fix"] is True  # fix_span is not widened
    assert scores["three-before"]["silent_at_fix"] is False
    assert scores["four-away"]["silent_at_fix"] is None and scores["four-away"]["in_fix_span"] is None
    cleans = {c["id"]: c["invariants"] for c in data["clean"]}
    assert [f["line"] for f in cleans["near-justified"]["justified"]] == [12]
    assert cleans["near-justified"]["unjustified"] == []
    assert cleans["far-justified"]["justified"] == []
    assert [f["line"] for f in cleans["far-justified"]["unjustified"]] == [12]
    # Justified findings still count; the null fix_span is out of the silent-at-fix denominator.
    line = "corpus: detected S 2/2, P 0/1; silent-at-fix 1/2; clean-file findings 2"
    assert data["summary"]["invariants"] == line
    assert line in capsys.readouterr().out.splitlines()
    assert line in (tmp_path / "corpus.md").read_text().splitlines()


def test_tree_keeps_the_folder_and_parent_packages(mirror: tuple[Path, str, str], tmp_path: Path) -> None:
    root, buggy, _ = mirror
    under_test = mirrors.find(root, "acme/server").materialise(buggy, PATH, tmp_path / "tree")
    assert under_test == tmp_path / "tree" / PATH and under_test.read_text() == BUGGY
    laid = sorted(p.relative_to(tmp_path / "tree").as_posix() for p in (tmp_path / "tree").rglob("*") if p.is_file())
    assert laid == ["srv/__init__.py", "srv/pkg/__init__.py", "srv/pkg/engine.py", "srv/pkg/helpers.py",
                    "srv/pkg/types.pyi"]


def test_missing_mirror_or_commit_is_a_usage_error(mirror: tuple[Path, str, str], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    root, buggy, fix = mirror
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([{**bug("elsewhere", [[1, 1]], None, buggy, fix), "repo": "other/repo"}]))
    assert corpus.main(["--cases", str(cases), "--mirrors", str(root), "--no-baselines"]) == 2
    err = capsys.readouterr().err
    assert "other/repo" in err and "git clone --mirror https://github.com/other/repo" in err
    cases.write_text(json.dumps([bug("gone", [[1, 1]], None, "0" * 40, fix)]))
    assert corpus.main(["--cases", str(cases), "--mirrors", str(root), "--no-baselines"]) == 2
    assert "acme/server" in capsys.readouterr().err


def test_regenerating_the_doc_keeps_verdicts_of_findings_still_reported(tmp_path: Path) -> None:
    kept, moved = Finding(12, "INV108", "a | b"), Finding(30, "INV106", "c")
    before = HeadRun("acme/server", "a" * 40, ("srv",), 3, (("srv/x.py", kept), ("srv/y.py", moved)))
    written = doc.head_section([before], {})
    written = [line.replace(" |  |", " | true bug: on the loop |", 1) if "x.py" in line else
               line.replace(" |  |", " | false positive |", 1) if "y.py" in line else line for line in written]
    (tmp_path / "corpus.md").write_text("# t\n\n" + "\n".join(written) + "\n")
    verdicts = doc.read_verdicts(tmp_path / "corpus.md")
    after = HeadRun("acme/server", "a" * 40, ("srv",), 3, (("srv/x.py", kept), ("srv/y.py", Finding(31, "INV106", "c"))))
    rows = [line for line in doc.head_section([after], verdicts) if line.startswith("| `")]
    assert rows == ["| `srv/x.py:12` | INV108 | a \\| b | true bug: on the loop |", "| `srv/y.py:31` | INV106 | c |  |"]
    # The tally counts only verdicts that start "true positive"; the unjudged one is counted as such.
    tally = doc.head_section([HeadRun("acme/server", "a" * 40, ("srv",), 3, (("srv/x.py", kept), ("srv/y.py", moved)))],
                             {**verdicts, ("acme/server", "a" * 12, "srv/y.py:30", "INV106", "c"): "true positive: yes"})
    assert "Verdicts: 1 of 2 findings are true positives (50 %), 0 without a verdict yet." in tally
    assert "Verdicts: 0 of 2 findings are true positives (0 %), 2 without a verdict yet." in doc.head_section([before], {})
    assert doc.head_section([HeadRun("acme/server", "b" * 40, ("srv",), 3, ((("srv/x.py", kept),)))], verdicts)[-2] \
        .endswith("|  |")  # another commit: judged anew


def test_mined_split_is_scored_and_reported_apart(mirror: tuple[Path, str, str], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    root, buggy, fix = mirror
    train, mined = write_splits(tmp_path, buggy, fix)
    out, md = tmp_path / "out.json", tmp_path / "corpus.md"
    assert corpus.main(["--cases", str(train), "--cases", str(mined), "--mirrors", str(root), "--no-baselines",
                        "--json", str(out), "--write", str(md)]) == 0
    # The training line counts the training cases alone (the mined case is a missed P case, not in it).
    train_line = "corpus: detected S 1/1, P 0/0; silent-at-fix 1/1; clean-file findings 1"
    mined_line = "corpus (mined): detected S 0/0, P 0/1; silent-at-fix 0/0; clean-file findings 0"
    printed = capsys.readouterr().out
    assert printed.splitlines()[-2:] == [train_line, mined_line]
    assert "## Bug cases (invariants), mined split" in printed and "| M1 | D | P | no |" in printed
    splits = json.loads(out.read_text())["splits"]
    assert list(splits) == ["train", "mined"]
    assert [b["id"] for b in splits["train"]["bugs"]] == ["T1"] and [b["id"] for b in splits["mined"]["bugs"]] == ["M1"]
    assert splits["mined"]["summary"]["invariants"] == mined_line
    text = md.read_text()
    figures, apart = text.split("## Mined cases (other MLX servers)")
    assert train_line in figures and mined_line not in figures and "| M1 |" not in figures
    assert mined_line in apart and "| M1 | D | P | no |" in apart and "| T1 |" not in apart
    # How to run names the clone command of every repository, the mined split's included.
    assert "git clone --mirror https://github.com/acme/mined   $MIRRORS/acme+mined" in text


def test_case_selection_keeps_the_training_split_first(mirror: tuple[Path, str, str], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    root, buggy, fix = mirror
    train, mined = write_splits(tmp_path, buggy, fix)
    args = ["--cases", str(train), "--cases", str(mined), "--mirrors", str(root), "--no-baselines"]
    assert corpus.main([*args, "--case", "M1"]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "corpus: detected S 0/0, P 0/0; silent-at-fix 0/0; clean-file findings 0",
        "corpus (mined): detected S 0/0, P 0/1; silent-at-fix 0/0; clean-file findings 0"]
    assert corpus.main([*args, "--case", "T1"]) == 0
    assert "(mined" not in capsys.readouterr().out  # an emptied mined split is left out


def test_split_setup_mistakes_are_usage_errors(mirror: tuple[Path, str, str], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    root, buggy, fix = mirror
    # Missing mirrors of both splits are named together, before any case is checked.
    train, mined = write_splits(tmp_path, buggy, fix, [bug("M1", [[1, 1]], None, buggy, fix, repo="other/two")])
    train.write_text(json.dumps([bug("T1", [[1, 1]], None, buggy, fix, repo="other/one")]))
    args = ["--cases", str(train), "--cases", str(mined), "--mirrors", str(root), "--no-baselines"]
    assert corpus.main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    for repo in ("other/one", "other/two"):
        assert f"git clone --mirror https://github.com/{repo}" in captured.err
    # One id in two splits, or two splits of one name.
    mined.write_text(json.dumps([bug("T1", [[1, 1]], None, buggy, fix)]))
    assert corpus.main(args) == 2
    assert "'T1' is also in" in capsys.readouterr().err
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "train.json").write_text("[]")
    assert corpus.main(["--cases", str(train), "--cases", str(tmp_path / "again" / "train.json"),
                        "--mirrors", str(root), "--no-baselines"]) == 2
    assert "two case files named 'train'" in capsys.readouterr().err


def test_shipped_case_files_are_well_formed() -> None:
    """train.json and mined.json load, share no id, and the mined cases come from other repositories."""
    from corpus_bench import cases as case_file

    train, mined = case_file.load_splits(corpus.DEFAULT_CASES)
    assert (train.name, mined.name) == ("train", "mined")
    mined_bugs = [c for c in mined.cases if isinstance(c, case_file.BugCase)]
    assert len(mined_bugs) >= 10 and len(mined.cases) - len(mined_bugs) >= 2
    assert not {c.repo for c in mined.cases} & {c.repo for c in train.cases}
    raw = json.loads(mined.source.read_text())
    for item in raw:
        if item["kind"] != "bug":
            assert item["notes"] and len(item["commit"]) == 40
            continue
        assert item["class"] == item["classes"][0] and set(item["classes"]) <= set("ABCDEFGHIJK")
        assert len(item["span_labels"]) == len(item["spans"]) and item["functions"]
        assert len(item["buggy_commit"]) == len(item["fix_commit"]) == 40
        assert item["fix_note"] and item["notes"]
        assert (item["fix_span"] is None) == (item["fix_span_kind"] is None)
