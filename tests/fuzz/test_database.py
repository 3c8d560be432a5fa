"""`invariants fuzz --database`: a fleet of fuzz processes sharing one Hypothesis example database on a real
Redis server (Debian's `redis-server`, started here), each replaying the others' failures first; read-only for
pull-request runs; a Redis URL without the client, or without a server, is a usage error (exit 2)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from mlx_invariants.fuzz.database import KEY_PREFIX, DatabaseError, open_database, scope_of, shown
from mlx_invariants.fuzz.runner import example_database
from mlx_invariants.fuzz.settings import FuzzSettings
from mlx_invariants.fuzz.target import Target
from tests.conftest import WAIT_S, wait_for

REPO = Path(__file__).resolve().parents[2]
# The simple engine with MLX on the event loop for three-token requests, which no seed scenario sends:
# generation finds it some examples in, never at the first one.
RARE = "tests.fuzz.fastpath_engine:make_rare"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    """A Redis server of this test's own on a free loopback port, nothing saved to disk; its URL (db 3)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server; ci/setup.sh tries)")
    redis = pytest.importorskip("redis", reason="the redis client is the 'redis' extra's (pip install -e '.[dev]')")
    port = _free_port()
    server = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                               "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port, db=3)

    def up() -> bool:
        try:
            return bool(client.ping())
        except redis.exceptions.ConnectionError:
            return server.poll() is not None  # it died (the port was taken meanwhile): stop waiting
    try:
        assert wait_for(up, WAIT_S, 0.05) and server.poll() is None, "redis-server did not come up"
        yield f"redis://127.0.0.1:{port}/3"
    finally:
        client.close()
        server.terminate()
        server.wait(WAIT_S)


def _contents(url: str) -> dict[bytes, set[bytes]]:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return {key: client.smembers(key) for key in client.keys(b"*")}
    finally:
        client.close()


def _fuzz(report: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    run = subprocess.run([sys.executable, "-m", "mlx_invariants", "fuzz", "--engine", RARE, "--jobs", "0",
                          "--examples", "60", "--replays", "0", "--report", str(report), *args],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    folders = [p for p in report.iterdir() if (p / "summary.json").is_file()] if report.is_dir() else []
    summary = json.loads((folders[0] / "summary.json").read_text()) if len(folders) == 1 else {}
    return run, summary


def test_a_failure_one_runner_found_is_the_next_runners_first_example(tmp_path: Path, redis_url: str) -> None:
    # Only generated examples are saved: a corpus scenario taking the rare path would find it unsaved.
    from mlx_invariants.fuzz.corpus import CLASS_SCENARIOS, SEED_SCENARIOS, burst, surface_tour
    from tests.fuzz.fastpath_engine import RarePathEngine

    corpus = [*SEED_SCENARIOS.values(), *CLASS_SCENARIOS.values(), surface_tour(2), burst(1)]
    assert RarePathEngine.fast not in {r.max_tokens for s in corpus for r in s.requests}
    first, summary = _fuzz(tmp_path / "nightly", "--database", redis_url)
    assert first.returncode == 1, first.stdout + first.stderr
    [finding] = summary["findings"]
    assert finding["oracle"] == "mlx-off-owner", finding  # MLX on the loop with the owner idle (`RarePathEngine`)
    assert finding["examples_before"] > 1, "generation found it: the seed scenarios run before it"
    written = _contents(redis_url)
    assert written and all(key.startswith(KEY_PREFIX) for key in written), written

    # A pull-request run reads the fleet's database: the failure is replayed before the seed scenarios.
    second, summary = _fuzz(tmp_path / "pull-request", "--database", redis_url, "--database-readonly")
    assert second.returncode == 1, second.stdout + second.stderr
    [again] = summary["findings"]
    assert again["signature"] == finding["signature"] and again["scenario"] == finding["scenario"]
    assert again["examples_before"] == 1 and summary["examples"] == 1, summary
    assert _contents(redis_url) == written, "a read-only run wrote to the database"


def test_a_redis_url_without_the_redis_client_is_a_usage_error(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['redis'] = None\n"  # as if the 'redis' extra were not installed
            "from mlx_invariants.cli import main\n"
            f"sys.exit(main(['fuzz', '--engine', 'simple', '--database', 'redis://127.0.0.1:1/0', "
            f"'--report', {str(tmp_path)!r}]))\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "needs the Python redis client" in run.stderr and "pip install 'mlx-invariants[redis]'" in run.stderr
    assert "Traceback" not in run.stderr, run.stderr


def test_a_redis_server_that_does_not_answer_is_a_usage_error_before_anything_starts(tmp_path: Path) -> None:
    pytest.importorskip("redis", reason="the redis client is the 'redis' extra's (pip install -e '.[dev]')")
    url = f"redis://user:secret@127.0.0.1:{_free_port()}/0"
    run = subprocess.run([sys.executable, "-m", "mlx_invariants", "fuzz", "--engine", "simple", "--database", url,
                          "--report", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "cannot reach the Redis server at redis://user:***@127.0.0.1:" in run.stderr, run.stderr
    assert "secret" not in run.stderr and "Traceback" not in run.stderr, run.stderr
    assert not list(tmp_path.iterdir()), "nothing ran, so nothing was written"


def test_database_flags_apply_to_a_search_only(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "mlx_invariants", "fuzz", "--engine", "simple", "--database", "db",
                          "--exhaustive", "--report", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "--database and --database-readonly apply to a search" in run.stderr


def test_read_only_with_no_database_has_nothing_to_do_and_says_so(tmp_path: Path) -> None:
    """A fork's pull request gets no secret: the reusable workflow's read-only run then has no database."""
    run = subprocess.run([sys.executable, "-m", "mlx_invariants", "fuzz", "--engine",
                          "tests.fuzz.fastpath_engine:make_clean", "--jobs", "0", "--examples", "1",
                          "--database-readonly", "--report", str(tmp_path)], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "no example database to read" in run.stderr and "no new finding in 1 example(s)" in run.stdout


def test_a_runner_profile_database_may_be_named_and_made_read_only(tmp_path: Path) -> None:
    assert FuzzSettings(profile="runner", database_readonly=True).database_path()
    target = Target.reference("simple")
    example_database(FuzzSettings(database=tmp_path / "db"), target).save(b"key", b"failure")
    reader = example_database(FuzzSettings(database=tmp_path / "db", database_readonly=True), target)
    reader.save(b"key", b"another")
    assert list(reader.fetch(b"key")) == [b"failure"], "the run's database is read-only as its settings say"
    assert example_database(FuzzSettings(), target) is None, "the ci profile has none"
    assert FuzzSettings(database="db").database_path() == "db"
    assert FuzzSettings.from_dict(FuzzSettings(database="redis://h:1/0", database_readonly=True).to_dict()) == \
        FuzzSettings(database="redis://h:1/0", database_readonly=True), "the settings travel to --jobs children"


def test_entries_are_kept_per_target_and_a_read_only_database_writes_nothing(tmp_path: Path) -> None:
    simple, batched = scope_of(Target.reference("simple")), scope_of(Target.reference("batched"))
    assert simple != batched and simple == scope_of(Target.reference("simple"))
    writer = open_database(str(tmp_path / "db"), scope=simple)
    writer.save(b"key", b"failure")
    assert list(writer.fetch(b"key")) == [b"failure"]
    assert list(open_database(str(tmp_path / "db"), scope=batched).fetch(b"key")) == []
    reader = open_database(str(tmp_path / "db"), scope=simple, readonly=True)
    reader.save(b"key", b"another")
    reader.delete(b"key", b"failure")
    assert list(reader.fetch(b"key")) == [b"failure"]


def test_a_redis_server_gone_during_a_run_is_said_once_and_the_run_goes_on(capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("redis", reason="the redis client is the 'redis' extra's")
    gone = open_database(f"redis://127.0.0.1:{_free_port()}/0", scope=b"t:", check=False)
    gone.save(b"key", b"failure")
    assert list(gone.fetch(b"key")) == []
    gone.delete(b"key", b"failure")
    assert capsys.readouterr().err.count("the example database redis://127.0.0.1:") == 1


def test_a_redis_password_is_never_shown() -> None:
    assert shown("redis://:pw@host:6379/0") == "redis://:***@host:6379/0"
    assert shown("rediss://me:pw@host/1") == "rediss://me:***@host/1"
    assert shown("redis://host:6379/0") == "redis://host:6379/0" and shown("dir/db") == "dir/db"


def test_a_url_redis_cannot_read_is_a_database_error() -> None:
    pytest.importorskip("redis", reason="the redis client is the 'redis' extra's")
    with pytest.raises(DatabaseError, match="not a Redis URL"):
        open_database("redis://host:notaport/0")
