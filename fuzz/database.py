"""Where Hypothesis keeps a run's failures: `invariants fuzz --database`, a directory or a Redis server.

A directory (`DirectoryBasedExampleDatabase`) serves one machine; a Redis URL
(`redis://host:port/db`, `rediss://` for TLS, `unix://` for a socket; through
Hypothesis's own `hypothesis.extra.redis.RedisExampleDatabase`) serves a fleet
of runners, each of which writes what it finds and replays the fleet's
failures before anything else (`fuzz.runner`). Read-only (Hypothesis's
`ReadOnlyDatabase`, `--database-readonly`) reads the same failures and writes
nothing, as a pull-request run should: its branch's failures stay its own.

Entries are kept per target (`scope_of`: its label, fault kinds, points and
routes), so runners fuzzing different engines can share one database without
replaying, and so deleting, each other's failures. The Python `redis` client
is the `redis` extra's, not the base install's: a Redis URL without it, or a
server that does not answer, is a `DatabaseError` (exit 2) before anything
starts.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import TYPE_CHECKING, Any, Iterable
from urllib.parse import urlsplit, urlunsplit

from mlx_invariants.errors import UsageError

if TYPE_CHECKING:
    from mlx_invariants.fuzz.target import Target

REDIS_SCHEMES = ("redis", "rediss", "unix")
KEY_PREFIX = b"mlx-invariants-fuzz:"   # every Redis key this project writes starts with it
CONNECT_TIMEOUT_S = 5.0                # to reach the server, and for each command once connected


class DatabaseError(UsageError):
    """The example database cannot be used: a Redis URL without the redis client, or no server answers."""


def is_redis(spec: str) -> bool:
    """Whether `spec` names a Redis server rather than a directory."""
    return urlsplit(spec).scheme in REDIS_SCHEMES and "://" in spec


def shown(spec: str) -> str:
    """`spec` as printed: a Redis URL's password left out."""
    if not is_redis(spec):
        return spec
    parts = urlsplit(spec)
    if parts.password is None:
        return spec
    host = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + host))


def scope_of(target: "Target") -> bytes:
    """The key prefix that keeps `target`'s entries apart from other targets' in a shared database."""
    aims = [target.label, sorted(target.fault_kinds), sorted(target.points), sorted(target.routes)]
    return hashlib.sha256(json.dumps(aims).encode()).hexdigest()[:16].encode() + b":"


def open_database(spec: str, *, readonly: bool = False, scope: bytes = b"", check: bool = True) -> Any:
    """The Hypothesis example database `spec` names (a directory or a Redis URL), its keys under `scope`,
    read-only if asked. With `check`, a Redis server is pinged now, so one that is not there is a
    `DatabaseError` before the run starts instead of a traceback inside it."""
    from hypothesis.database import DirectoryBasedExampleDatabase, ReadOnlyDatabase

    if is_redis(spec):
        database, transient = _redis(spec, check)
    else:
        database, transient = DirectoryBasedExampleDatabase(spec), ()
    if readonly:
        database = ReadOnlyDatabase(database)
    return _scoped(database, scope, shown(spec), transient) if scope or transient else database


def _redis(spec: str, check: bool) -> tuple[Any, tuple[type[BaseException], ...]]:
    try:
        import redis
    except ImportError:
        raise DatabaseError(f"--database {shown(spec)} needs the Python redis client, which the base install "
                            "leaves out; install it with: pip install 'mlx-invariants[redis]'") from None
    from hypothesis.extra.redis import RedisExampleDatabase

    try:
        client = redis.Redis.from_url(spec, socket_connect_timeout=CONNECT_TIMEOUT_S,
                                      socket_timeout=CONNECT_TIMEOUT_S)
    except ValueError as exc:
        raise DatabaseError(f"--database {shown(spec)} is not a Redis URL redis can read: {exc}") from None
    if check:
        try:
            client.ping()
        except redis.exceptions.RedisError as exc:
            raise DatabaseError(f"--database: cannot reach the Redis server at {shown(spec)}: {exc}") from None
    return RedisExampleDatabase(client, key_prefix=KEY_PREFIX), (redis.exceptions.RedisError,)


def _scoped(database: Any, scope: bytes, label: str, transient: tuple[type[BaseException], ...]) -> Any:
    """`database` with every key under `scope`; an error in `transient` (a Redis server gone for a while)
    is said once on stderr and the run goes on without the entries it could not read or write."""
    from hypothesis.database import ExampleDatabase

    class Scoped(ExampleDatabase):
        def __init__(self) -> None:
            super().__init__()
            self.warned = False

        def __repr__(self) -> str:
            return f"Scoped({database!r}, {scope!r})"

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Scoped) and repr(other) == repr(self)

        def __hash__(self) -> int:
            return hash(repr(self))

        def fetch(self, key: bytes) -> Iterable[bytes]:
            try:
                return list(database.fetch(scope + key))
            except transient as exc:
                self._warn(exc)
                return []

        def save(self, key: bytes, value: bytes) -> None:
            self._quietly(database.save, scope + key, value)

        def delete(self, key: bytes, value: bytes) -> None:
            self._quietly(database.delete, scope + key, value)

        def move(self, src: bytes, dest: bytes, value: bytes) -> None:
            self._quietly(database.move, scope + src, scope + dest, value)

        def _quietly(self, operation: Any, *args: Any) -> None:
            try:
                operation(*args)
            except transient as exc:
                self._warn(exc)

        def _warn(self, exc: BaseException) -> None:
            if not self.warned:
                self.warned = True
                print(f"invariants fuzz: the example database {label} failed ({exc}); going on without it "
                      "where it fails", file=sys.stderr)

    return Scoped()

