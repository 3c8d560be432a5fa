"""benchmarks/corpus.py scores exactly as the corpus defines it, on a tiny mirror built here.

The mirror holds one file at two commits: the buggy one runs `mx.eval` on the event
loop at line 6 (INV108), the fixed one hands it to the owner thread but keeps a
second blocking call at line 12. The cases put their spans just within and just
outside the scoring's margins around those two lines. A second mirror of the same
history (`acme/mined`) stands for a repository of the mined split, which is scored
and reported apart from the training split.

`--checker-at` and the before-studied (leave-one-repository-out) runs read a checker
out of a project's git history; a tiny stand-in project (`project`) has three commits:
no checker yet, a checker in the early layout (top-level `invariants` package) that
flags line 6 of every file, and one in today's layout (`invariants/` mapped to
`mlx_invariants` by package-dir, a subpackage from another folder) that flags line 12.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import corpus  # noqa: E402  (the benchmark script, importable once benchmarks/ is on the path)
from corpus_bench import doc, head, loro, mirrors  # noqa: E402
from corpus_bench.head import HeadRun  # noqa: E402
from corpus_bench.tools import Finding  # noqa: E402

BUGGY = """\
import mlx.core as mx


async def step(model, tokens):
    logits = mx.array(tokens)
    mx.eval(logits)
    return logits
"""
FIXED = """\
import mlx.core as mx


async def step(owner, model, tokens):
    logits = mx.array(tokens)
    await owner.run(lambda: mx.eval(logits))
    return logits


async def warm(model, tokens):
    logits = mx.array(tokens)
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


def commit_files(work: Path, files: dict[str, str], message: str) -> str:
    """A new repository at `work` holding `files`, committed once; its commit."""
    for path, text in files.items():
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(text)
    git("init", "-q", cwd=work)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", message, cwd=work)
    return git("rev-parse", "HEAD", cwd=work)


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


def test_tree_keeps_the_folder_and_its_whole_package(mirror: tuple[Path, str, str], tmp_path: Path) -> None:
    """The package is laid out whole, as in the repository a user checks one file of: the checker
    reads it to tell a def nothing names (fails if `sub/deep.py` is left out); a file outside any
    package gets its folder alone."""
    root, buggy, _ = mirror
    server = mirrors.find(root, "acme/server")
    under_test = server.materialise(buggy, PATH, tmp_path / "tree")
    assert under_test == tmp_path / "tree" / PATH and under_test.read_text() == BUGGY
    laid = sorted(p.relative_to(tmp_path / "tree").as_posix() for p in (tmp_path / "tree").rglob("*") if p.is_file())
    assert laid == ["srv/__init__.py", "srv/pkg/__init__.py", "srv/pkg/engine.py", "srv/pkg/helpers.py",
                    "srv/pkg/sub/deep.py", "srv/pkg/types.pyi"]
    server.materialise(buggy, "top.py", tmp_path / "alone")
    assert [p.name for p in (tmp_path / "alone").rglob("*") if p.is_file()] == ["top.py"]


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
    kept, moved = Finding(12, "INV108", "a | b: do this"), Finding(30, "INV106", "c")
    before = HeadRun("acme/server", "a" * 40, ("srv",), 3, (("srv/x.py", kept), ("srv/y.py", moved)))
    written = doc.head_section([before], {})
    written = [line.replace(" |  |", " | true bug: on the loop |", 1) if "x.py" in line else
               line.replace(" |  |", " | false positive |", 1) if "y.py" in line else line for line in written]
    (tmp_path / "corpus.md").write_text("# t\n\n" + "\n".join(written) + "\n")
    verdicts = doc.read_verdicts(tmp_path / "corpus.md")
    after = HeadRun("acme/server", "a" * 40, ("srv",), 3, (("srv/x.py", kept), ("srv/y.py", Finding(31, "INV106", "c"))))
    rows = [line for line in doc.head_section([after], verdicts) if line.startswith("| acme/server |")]
    # The message is cut at its remedy (the first ": " outside backticks); a pipe in it is escaped.
    assert rows == ["| acme/server | aaaaaaaaaaaa | `srv/x.py:12` | INV108 | a \\| b | true bug: on the loop |",
                    "| acme/server | aaaaaaaaaaaa | `srv/y.py:31` | INV106 | c |  |"]
    # The tally counts only verdicts that start "true positive"; the unjudged one is counted as such.
    tally = doc.head_section([HeadRun("acme/server", "a" * 40, ("srv",), 3, (("srv/x.py", kept), ("srv/y.py", moved)))],
                             {**verdicts, ("acme/server", "a" * 12, "srv/y.py:30", "INV106", "c"): "true positive: yes"})
    assert ("Verdicts: 1 of 2 findings are true positives (50 %), 0 of them replayed by a standalone reproducer "
            "(the verdict names it, after `replayed:`), 0 without a verdict yet.") in tally
    replayed = doc.head_section([before], {**verdicts, ("acme/server", "a" * 12, "srv/y.py:30", "INV106", "c"):
                                           "true positive: yes; replayed: repro.py exits 1"})
    assert "1 of 2 findings are true positives (50 %), 1 of them replayed" in "\n".join(replayed)
    assert "Verdicts: 0 of 2 findings are true positives (0 %), 0 of them replayed" in "\n".join(
        doc.head_section([before], {}))
    assert doc.head_section([HeadRun("acme/server", "b" * 40, ("srv",), 3, ((("srv/x.py", kept),)))], verdicts)[-2] \
        .endswith("|  |")  # another commit: judged anew


def test_verdicts_of_the_older_four_column_tables_are_kept(tmp_path: Path) -> None:
    """Rows of `location | rule | message | verdict` under `### repo @ commit` (whole messages) carry over."""
    message = "`x` runs MLX on the event loop thread: hand it to the owner thread"
    (tmp_path / "corpus.md").write_text(
        "# t\n\n## HEAD findings\n\n### acme/server @ aaaaaaaaaaaa\n\n| location | rule | message | verdict |\n"
        f"| --- | --- | --- | --- |\n| `srv/x.py:12` | INV108 | {message} | true positive: yes |\n")
    verdicts = doc.read_verdicts(tmp_path / "corpus.md")
    run = HeadRun("acme/server", "a" * 40, ("srv",), 3, (("srv/x.py", Finding(12, "INV108", message)),))
    assert doc.head_section([run], verdicts)[-2] == \
        "| acme/server | aaaaaaaaaaaa | `srv/x.py:12` | INV108 | `x` runs MLX on the event loop thread | true positive: yes |"
    long = "word " * 60
    assert len(doc.short_message(long)) <= 160 and doc.short_message(doc.short_message(long)) == doc.short_message(long)
    assert doc.short_message("`except E:` drops it: re-raise") == "`except E:` drops it"


def test_head_servers_checks_each_package_at_its_recorded_commit(mirror: tuple[Path, str, str], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    root, buggy, fix = mirror
    server = head.Server("acme/server", buggy, ("srv/pkg",), ("srv/pkg/sub/",), "a subfolder")
    monkeypatch.setattr(head, "SERVERS", (server,))
    md, lines = tmp_path / "corpus.md", tmp_path / "head.jsonl"
    md.write_text("# Top\n\nkept as it is\n\n## HEAD findings\n\n### acme/server @ " + buggy[:12] + "\n\n"
                  "| location | rule | message | verdict |\n| --- | --- | --- | --- |\n"
                  "| `srv/pkg/engine.py:6` | INV108 | `mx.eval` runs MLX on the event loop thread | true positive: on the loop |\n")
    assert corpus.main(["--head-servers", "--mirrors", str(root), "--write", str(md), "--head-jsonl", str(lines)]) == 0
    text = md.read_text()
    assert text.startswith("# Top\n\nkept as it is\n\n## HEAD findings\n")
    assert "| `acme/server` | `" + buggy[:12] + "` | `srv/pkg/` | `srv/pkg/sub/` | " in text
    assert f"| acme/server | {buggy[:12]} | `srv/pkg/engine.py:6` | INV108 | `mx.eval` runs MLX on the event loop thread " \
        "| true positive: on the loop |" in text
    assert "--head-servers --mirrors" in text and "git clone --mirror https://github.com/acme/server" in text
    (record,) = [json.loads(line) for line in lines.read_text().splitlines()]
    assert record == {"id": "acme/server:srv/pkg/engine.py:6:INV108", "repo": "acme/server", "commit": buggy,
                      "path": "srv/pkg/engine.py", "line": 6, "rule": "INV108", "message": record["message"],
                      "scope": "function", "function": "step", "start": 4, "end": 7, "checker": None}
    assert record["message"].startswith("`mx.eval` runs MLX on the event loop thread: ")
    # The fixed commit: line 12 in `warm`; the export never holds the files outside the package or excluded.
    (run,) = head.run_head(root, [head.Server("acme/server", fix, ("srv/pkg",), ("srv/pkg/sub/",))])
    assert [(p, f.line) for p, f in run.findings] == [("srv/pkg/engine.py", 12)]
    # The checker's own count of the files it checked: 4 without the exclude (srv/pkg/sub/deep.py), 3 with it.
    assert run.scopes == (head.Scope("function", "warm", 10, 13),) and run.files == 3
    # `--head` in a whole run: the same section after the splits' tables, its verdicts kept.
    train, _ = write_splits(tmp_path, buggy, fix)
    assert corpus.main(["--cases", str(train), "--mirrors", str(root), "--no-baselines", "--no-loro", "--head",
                        "--no-speed", "--write", str(md)]) == 0
    text = md.read_text()
    assert text.startswith("# Real-bug corpus benchmark") and text.count("## HEAD findings") == 1
    assert "| true positive: on the loop |" in text.split("## HEAD findings")[1]
    monkeypatch.setattr(head, "SERVERS", (head.Server("acme/server", buggy, ("nowhere",)),))
    assert corpus.main(["--head-servers", "--mirrors", str(root)]) == 2


OFF_POOL = """\
import asyncio
import mlx.core as mx


async def evaluate(batch):
    return await asyncio.to_thread(lambda: mx.eval(mx.array(batch)))
"""


def test_head_servers_judge_findings_by_each_servers_own_metadata(tmp_path: Path) -> None:
    """The metadata of every folder from the repository's top down to the package goes with it: MLX work
    handed to the default pool is no finding in a server that admits only MLX 0.31.2 or later, and a
    generation still is where it admits an mlx-lm older than 0.31.3 (docs/checker.md, "MLX version")."""
    work = tmp_path / "work"
    files = {"requirements.txt": "mlx>=0.31.2\nmlx-lm>=0.31.2\n", "svc/pyproject.toml": "[project]\nname = 'svc'\n",
             "svc/pkg/__init__.py": "", "svc/pkg/pool.py": OFF_POOL,
             "svc/pkg/generate.py": OFF_POOL.replace("mx.eval(mx.array(batch))", "list(stream_generate(batch))")
             .replace("import mlx.core as mx", "from mlx_lm import stream_generate")}
    commit = commit_files(work, files, "server")
    git("clone", "-q", "--mirror", str(work), str(tmp_path / "mirrors" / "acme+meta"), cwd=tmp_path)
    (run,) = head.run_head(tmp_path / "mirrors", [head.Server("acme/meta", commit, ("svc/pkg",))])
    assert [(p, f.rule) for p, f in run.findings] == [("svc/pkg/generate.py", "INV107")]
    assert run.pins == "mlx 0.31.2, mlx-lm 0.31.2 (requirements.txt)"


def test_scope_of_a_finding() -> None:
    source = ("import x\n\n@dec\nasync def f():\n    def g():\n        return 1\n    return g\n\n"
              "class C:\n    y = 1\n    if x:\n        def m(self):\n            try:\n                pass\n"
              "            except E:\n                pass\nz = [\n    1,\n]\n")
    assert head.scope_of(source, 6) == head.Scope("function", "f.<locals>.g", 5, 6)
    assert head.scope_of(source, 3) == head.Scope("function", "f", 3, 7)
    assert head.scope_of(source, 10) == head.Scope("class", "C", 9, 16)
    assert head.scope_of(source, 15) == head.Scope("function", "C.m", 12, 16)
    assert head.scope_of(source, 18) == head.Scope("statement", None, 17, 19)
    assert head.scope_of("def (", 1) == head.Scope("file", None, None, None)


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
    """train.json, mined.json, omlx.json and heldout2.json to heldout25.json load and share no id; the mined and
    held-out cases come from other repositories; every repository has a before-studied commit."""
    from corpus_bench import cases as case_file

    splits = case_file.load_splits(corpus.DEFAULT_CASES)
    train, mined, omlx = splits[:3]
    assert [s.name for s in splits] == ["train", "mined", "omlx", *(f"heldout{n}" for n in range(2, 26))]
    mined_bugs = [c for c in mined.cases if isinstance(c, case_file.BugCase)]
    assert len(mined_bugs) >= 10 and len(mined.cases) - len(mined_bugs) >= 2
    assert not {c.repo for c in mined.cases} & {c.repo for c in train.cases}
    assert {c.repo for c in omlx.cases} == {"techychamp/omlx"} and len(omlx.cases) == 14
    shared = Path(__file__).resolve().parents[3] / "shared" / "corpus" / "omlx.json"
    if shared.is_file():  # the copy kept here is the shared corpus's file, unchanged
        assert json.loads(shared.read_text()) == json.loads(omlx.source.read_text())
    # Each held-out split's repositories appear in no earlier split: they are held out only if nobody here
    # studied them.
    held_out_repos = {
        "heldout2": {"Blaizzy/mlx-audio", "GradientHQ/parallax"},
        "heldout3": {"motsognirr/olmlx", "tumma72/mlx-manager"},
        "heldout4": {"xorbitsai/inference", "mudler/LocalAI"},
        "heldout5": {"huggingface/speech-to-speech", "jamiepine/voicebox"},
        "heldout6": {"homelab-00/TranscriptionSuite"},
        "heldout7": {"transformerlab/transformerlab-api"},
        "heldout8": {"fblissjr/heylookitsanllm"},
        "heldout9": {"kashman001/local-model", "decdees/LOcha", "gdemerges/Benji"},
        "heldout10": {"andychoi/ai-mlx-server", "BuildItCode/MLX-Server"},
        "heldout11": {"asher/gmlx", "aperepel/claude-mlx-tts"},
        "heldout12": {"epheterson/immich-ml-metal"},
        "heldout13": {"unslothai/unsloth"},
        "heldout14": {"firstbatchxyz/dnet"},
        "heldout15": {"pipecat-ai/pipecat"},
        "heldout16": {"open-jarvis/OpenJarvis"},
        "heldout17": {"opendatalab/MinerU", "opendatalab/mineru-vl-utils"},
        "heldout18": {"avalan-ai/avalan", "lm-sys/FastChat"},
        "heldout19": {"vectorize-io/hindsight"},
        "heldout20": {"geeks-accelerator/ollama-herd"},
        "heldout21": {"docling-project/docling-serve", "docling-project/docling-jobkit"},
        "heldout22": {"OpenSourceWTF/mtplx-moe"},
        "heldout23": {"ToPo-ToPo-ToPo/local-llm-server"},
        "heldout24": {"nodetool-ai/nodetool-core"},
        "heldout25": {"isair/jarvis"},
    }
    for i, split in enumerate(splits[3:], start=3):
        assert {c.repo for c in split.cases} == held_out_repos[split.name]
        assert not {c.repo for c in split.cases} & {c.repo for s in splits[:i] for c in s.cases}
    for split in splits:
        for repo in {c.repo for c in split.cases}:
            studied = loro.BEFORE_STUDIED[repo]
            assert len(studied.commit) == 40 and studied.held_out == (split.name != "train")
    raw = [item for split in splits[1:] for item in json.loads(split.source.read_text())]
    for item in raw:
        if item["kind"] != "bug":
            assert item["notes"] and len(item["commit"]) == 40
            continue
        assert item["class"] == item["classes"][0] and set(item["classes"]) <= set("ABCDEFGHIJK")
        assert len(item["span_labels"]) == len(item["spans"]) and item["functions"]
        assert len(item["buggy_commit"]) == len(item["fix_commit"]) == 40
        assert item["fix_note"] and item["notes"]
        assert (item["fix_span"] is None) == (item["fix_span_kind"] is None)


FAKE_CLI = """\
import json
import sys
from pathlib import Path

{import_line}


def main():
    args = sys.argv[1:]
    if args[:1] == ["rules"]:
        print("INV000  unreadable-file  x")
        print("{rule}  fake  flags line {{}}".format(LINE))
        return 0
    paths, skip = [], False
    for arg in args[1:]:
        if skip or arg.startswith("-"):
            skip = arg in ("--format", "--config")
            continue
        paths += sorted(Path(arg).rglob("*.py")) if Path(arg).is_dir() else [Path(arg)]
    print(json.dumps([{{"path": str(p), "line": LINE, "col": 0, "rule": "{rule}", "message": "fake"}} for p in paths]))
    return 0
"""
EARLY = {
    "pyproject.toml": '[project]\nname = "x"\n\n[project.scripts]\ninvariants = "invariants.cli:main"\n',
    "invariants/__init__.py": "",
    "invariants/cli.py": FAKE_CLI.format(import_line="LINE = 6", rule="INV150"),
}
TODAY = {
    "pyproject.toml": '[project]\nname = "x"\n\n[project.scripts]\ninvariants = "mlx_invariants.cli:main"\n\n'
                      '[tool.setuptools.package-dir]\nmlx_invariants = "invariants"\n'
                      '"mlx_invariants.extra" = "extra"\n',
    "invariants/__init__.py": "",
    "invariants/cli.py": FAKE_CLI.format(import_line="from mlx_invariants.extra.where import LINE", rule="INV151"),
    "extra/__init__.py": "",
    "extra/where.py": "LINE = 12\n",
}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """(a stand-in project's git repository, its commits: no checker, the early layout, today's layout)."""
    work = tmp_path_factory.mktemp("project")
    git("init", "-q", cwd=work)
    commits = []
    for files in ({"pyproject.toml": '[project]\nname = "x"\n'}, EARLY, TODAY):
        for path, text in files.items():
            (work / path).parent.mkdir(parents=True, exist_ok=True)
            (work / path).write_text(text)
        git("add", "-A", cwd=work)
        git("commit", "-q", "-m", f"step {len(commits)}", cwd=work)
        commits.append(git("rev-parse", "HEAD", cwd=work))
    return work, commits


def test_checker_at_scores_with_a_past_commits_own_tree(mirror: tuple[Path, str, str], project: tuple[Path, list[str]],
                                                         tmp_path: Path) -> None:
    root, buggy, fix = mirror
    repo, (_, early, today) = project
    train, mined = write_splits(tmp_path, buggy, fix)
    out = tmp_path / "out.json"
    args = ["--cases", str(train), "--mirrors", str(root), "--no-baselines", "--no-loro", "--checker-repo", str(repo),
            "--json", str(out)]
    # The early layout: its top-level package imported as it is; it flags line 6, on T1's defect.
    assert corpus.main([*args, "--checker-at", early[:10]]) == 0
    data = json.loads(out.read_text())
    assert data["checker"] == early and "by_repository" not in data
    t1 = data["splits"]["train"]["bugs"][0]["invariants"]
    assert [(f["line"], f["rule"]) for f in t1["buggy"]] == [(6, "INV150")] and t1["detected"]
    assert t1["silent_at_fix"] is False  # line 6 is inside the fix span [4, 8]
    # Today's layout: invariants/ becomes mlx_invariants and extra/ its subpackage; line 12 is off both spans.
    assert corpus.main([*args, "--checker-at", today, "--write", str(tmp_path / "corpus.md")]) == 0
    t1 = json.loads(out.read_text())["splits"]["train"]["bugs"][0]["invariants"]
    assert [(f["line"], f["rule"]) for f in t1["buggy"]] == [(12, "INV151")]
    assert not t1["detected"] and t1["silent_at_fix"] is True
    text = (tmp_path / "corpus.md").read_text()
    assert f"this project at `{today[:7]}` (`--checker-at`, its own tree), as `.venv/bin/python " \
        f"benchmarks/corpus.py {' '.join(args)} --checker-at {today} --write {tmp_path / 'corpus.md'}`; " \
        "the checker's rules: INV151." in text
    assert "## By repository" not in text  # --no-loro


def test_before_studied_scores_each_repository_with_its_own_commit(
        mirror: tuple[Path, str, str], project: tuple[Path, list[str]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    root, buggy, fix = mirror
    repo, (_, early, today) = project
    n_case = {**bug("M2", [[6, 6]], [[4, 8]], buggy, fix, repo="acme/mined"), "detectability": "N"}
    train, mined = write_splits(tmp_path, buggy, fix,
                                [bug("M1", [[10, 14]], None, buggy, fix, "P", repo="acme/mined"), n_case])
    out, md = tmp_path / "out.json", tmp_path / "corpus.md"
    assert corpus.main(["--cases", str(train), "--cases", str(mined), "--mirrors", str(root), "--no-baselines",
                        "--checker-repo", str(repo), "--before-studied", f"acme/server={early}",
                        "--before-studied", f"acme/mined={today}", "--json", str(out), "--write", str(md)]) == 0
    by_repo = {r["repo"]: r for r in json.loads(out.read_text())["by_repository"]}
    assert list(by_repo) == ["acme/server", "acme/mined"]
    server, other = by_repo["acme/server"], by_repo["acme/mined"]
    # acme/server before: the early checker (line 6, T1 found, its fix span hit, one finding on the clean file).
    assert server["before_studied"]["commit"] == early and server["before_studied"]["rules"] == ["INV150"]
    assert server["before_studied"]["line"] == "corpus: detected S 1/1, P 0/0; silent-at-fix 0/1; clean-file findings 1"
    # Today: this checkout's checker (INV108 on line 6 of the buggy file, line 12 of the fixed one).
    assert server["today"]["invariants"]["line"] == \
        "corpus: detected S 1/1, P 0/0; silent-at-fix 1/1; clean-file findings 1"
    # acme/mined before: today's-layout commit (line 12: M1's widened span 7..17 holds it; the N case is kept
    # out of S and P but found on line 6 today, and its fix span is scored for silence).
    assert other["before_studied"]["commit"] == today
    assert other["before_studied"]["detected"] == {"S": 0, "P": 1, "N": 0}
    assert other["before_studied"]["bugs"] == {"S": 0, "P": 1, "N": 1}
    assert other["today"]["invariants"]["detected"] == {"S": 0, "P": 0, "N": 1}
    assert (other["today"]["invariants"]["silent_at_fix"], other["today"]["invariants"]["silent_scored"]) == (1, 1)
    printed = capsys.readouterr().out
    assert "## By repository" in printed and printed.rstrip().splitlines()[-1].startswith("corpus (mined):")
    text = md.read_text()
    section = text.split("## By repository (leave-one-repository-out)")[1]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line][:5]
    assert rows[1:] == [
        f"| acme/server | train | 1 / 0 / 0 | 1 | `{early[:7]}` ({server['before_studied']['date']}) | 1/1 | - | 0/1 "
        "| 1/1 | - | 1/1 |",
        f"| acme/mined | mined | 0 / 1 / 1 | 0 | `{today[:7]}` ({other['before_studied']['date']}) | - | 1/1 | 1/1 "
        "| - | 0/1 | 1/1 |",
        "| held-out repositories |  | 1 / 1 / 1 | 1 | each its own | 1/1 | 1/1 | 1/2 | 1/1 | 0/1 | 2/2 |",
        "| all repositories |  | 1 / 1 / 1 | 1 | each its own | 1/1 | 1/1 | 1/2 | 1/1 | 0/1 | 2/2 |",
    ]
    assert f"- `acme/server`: `{early[:7]}` (" in section and "Its rules: INV150." in section


def test_checker_at_setup_mistakes_are_usage_errors(mirror: tuple[Path, str, str], project: tuple[Path, list[str]],
                                                    tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root, buggy, fix = mirror
    repo, (bare, _, _) = project
    train, _ = write_splits(tmp_path, buggy, fix)
    args = ["--cases", str(train), "--mirrors", str(root), "--no-baselines", "--checker-repo", str(repo)]
    assert corpus.main([*args, "--checker-at", "0" * 40]) == 2
    assert "--unshallow" in capsys.readouterr().err
    assert corpus.main([*args, "--checker-at", bare]) == 2  # before the project had a checker
    assert "declares no `invariants = \"module:function\"` script" in capsys.readouterr().err
    assert corpus.main([*args, "--before-studied", "acme/server"]) == 2
    assert "--before-studied takes OWNER/NAME=COMMIT" in capsys.readouterr().err


def test_the_checker_is_given_the_package_so_its_model_follows_calls_into_other_modules(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The route's MLX is in another module: seen with the package laid out (the default), not in the file alone."""
    work, root = tmp_path / "work", tmp_path / "mirrors"
    files = {"app/__init__.py": "",
             "app/engine.py": "from mlx_lm import generate\n\n\ndef run(model, tokenizer, prompt):\n"
                              "    return generate(model, tokenizer, prompt)\n",
             "app/server.py": "from .engine import run\n\n\nasync def complete(model, tokenizer, prompt):\n"
                              "    return run(model, tokenizer, prompt)\n"}
    commit = commit_files(work, files, "route")
    root.mkdir()
    git("clone", "-q", "--mirror", str(work), str(root / "acme+cross"), cwd=root)
    case = {"kind": "bug", "id": "X1", "repo": "acme/cross", "class": "A", "detectability": "P",
            "buggy_commit": commit, "path": "app/server.py", "spans": [[5, 5]], "fix_commit": commit, "fix_span": None}
    (tmp_path / "cases.json").write_text(json.dumps([case]))
    common = ["--cases", str(tmp_path / "cases.json"), "--mirrors", str(root), "--no-baselines", "--no-loro"]
    assert corpus.main(common) == 0
    assert "corpus: detected S 0/0, P 1/1" in capsys.readouterr().out
    assert corpus.main([*common, "--scope", "file"]) == 0
    assert "corpus: detected S 0/0, P 0/1" in capsys.readouterr().out
