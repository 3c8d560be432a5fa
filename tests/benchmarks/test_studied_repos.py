"""benchmarks/studied_repos.py names every repository whose code was read here, so that a miner of new held-out
cases can pick outside it: each kind of source it reads must show up in its list."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import studied_repos  # noqa: E402
from corpus_bench import head  # noqa: E402


def _listed(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert studied_repos.main(list(argv)) == 0
    return capsys.readouterr().out.splitlines()


def test_every_case_file_server_and_swept_head_is_listed_once(capsys: pytest.CaptureFixture[str]) -> None:
    listed = _listed(capsys)
    assert listed == sorted(set(listed))
    cases = {c["repo"].lower() for p in studied_repos.CASES.glob("*.json") for c in json.loads(p.read_text())}
    swept = {line.split()[0].lower() for line in studied_repos.SWEPT.read_text().splitlines()
             if line.strip() and not line.startswith("#")}
    wanted = cases | swept | {s.repo.lower() for s in head.SERVERS}
    assert wanted <= set(listed)
    assert "pipecat-ai/pipecat" in listed and "waybarrios/vllm-mlx" in listed


def test_mirrors_folder_adds_its_repositories_and_why_names_the_source(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "Someone+Unread-Server").mkdir()
    listed = _listed(capsys, "--why", "--mirrors", str(tmp_path))
    assert f"someone/unread-server  (mirror under {tmp_path})" in listed
    assert not any(line.startswith("someone/") for line in _listed(capsys))


def test_missing_mirrors_folder_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        studied_repos.main(["--mirrors", str(tmp_path / "absent")])
    assert exit_.value.code == 2
