"""`[tool.invariants]` in pyproject.toml: which rules run where, and the names
and thresholds they use.

    [tool.invariants]
    select = ["INV"]                  # id prefixes to run
    ignore = ["INV109"]
    exclude = ["vendor/", "*_pb2.py"]  # .gitignore syntax, on top of the defaults
    per-path-ignores = { "tests/**" = ["INV109"] }
    owner-executors = ["self._mlx_executor"]
    owner-functions = ["Engine._generation_loop"]  # declared roles (docs/checker.md "Declared roles")
    mlx-locks = ["self._generation_lock"]
    mlx-version = "0.31.2"            # instead of the lowest the project's metadata admits (pins.py)
    report-unreferenced = true        # a library: report in defs its own package never names too

    [tool.invariants.INV101]          # one table per rule: its options and scope
    max-seconds = 10
    paths = ["engine/**"]
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlx_invariants.checker import pins
from mlx_invariants.checker.errors import ConfigError
from mlx_invariants.checker.versions import release
from mlx_invariants.errors import UsageError

if TYPE_CHECKING:
    from mlx_invariants.checker.rule import Rule

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

DEFAULT_EXCLUDE = [
    ".git/", ".hg/", ".svn/", ".venv/", "venv/", ".tox/", ".nox/", ".eggs/", "*.egg-info/",
    "__pycache__/", "build/", "dist/", "node_modules/", ".mypy_cache/", ".pytest_cache/",
    ".ruff_cache/", ".invariants_cache/",
]

# Shared keys: names several rules agree on. Globs match a whole dotted name
# (`self._mlx_executor`) or its last part (`_mlx_executor`), case-insensitively.
SHARED_DEFAULTS: dict[str, Any] = {
    "lock-names": ["*lock", "*_lock_*", "*mutex*", "*semaphore*", "*_sem", "sem"],
    "owner-executors": [],
    # Declared roles, what the package model cannot infer: functions that run on the MLX owner
    # thread (`Engine._generation_loop`, `*._worker_main`; also `# invariants: owner-thread` on a
    # def line), and the locks that guard MLX (INV125 asks for them only where some are declared).
    "owner-functions": [],
    "mlx-locks": [],
    "shield-helpers": ["*suspend_cancellation", "*uncancellable", "*shielded", "*cancel_shield"],
    "model-names": [
        "model", "_model", "draft_model", "_draft_model", "text_model", "_text_model", "language_model",
    ],
    # Receivers whose insert/remove/next run MLX, like mlx-lm's BatchGenerator, when not built in the file.
    "batch-generator-names": ["*batch_generator", "*batch_gen"],
    # Dotted calls of the project's own that run MLX (a scheduler step).
    "mlx-calls": ["*scheduler.step"],
    # The project's helpers that give the calling thread its own MLX generation stream (INV118, and
    # an engine loop that owns MLX on the event loop's thread: loop_owner.py).
    "stream-binders": ["*bind*stream*"],
    "event-names": ["*event*", "*ready*", "*started*", "*stopped*", "*done*", "*finished*", "*_evt"],
    "readiness-waits": ["wait_ready", "wait_until_ready", "wait_for_ready", "wait_started", "wait_idle", "wait_stopped"],
}

TOP_LEVEL_DEFAULTS: dict[str, Any] = {
    "select": ["INV"],
    "ignore": [],
    "exclude": [],
    "respect-gitignore": True,
    "per-path-ignores": {},
    "cache-dir": ".invariants_cache",
    "max-file-bytes": 2_000_000,
    # CPU seconds one file's analysis may take (0: no limit); a legitimate 1.9 MB module took 29 s on
    # a loaded 2-core box, and the files that stalled libcst's parser ran for more than 300 s.
    "max-file-seconds": 60,
    # The MLX the project runs on, for the findings true only on some versions (mlx_facts.py); empty:
    # the lowest version its metadata admits (pins.py).
    "mlx-version": "",
    "mlx-lm-version": "",
    "mlx-vlm-version": "",
    # Findings in a def nothing of its package names (model/unreferenced.py) are left out, as code the
    # server never runs; a library whose users call what the package does not sets this.
    "report-unreferenced": False,
    **SHARED_DEFAULTS,
}


def matches_path(relpath: str, patterns: list[str]) -> bool:
    """Glob match of a '/'-separated path relative to the project root; `**` spans folders."""
    return any(_glob(relpath, p) for p in patterns)


def _glob(relpath: str, pattern: str) -> bool:
    pattern = pattern.rstrip("/")
    if fnmatch.fnmatchcase(relpath, pattern) or fnmatch.fnmatchcase(relpath, pattern + "/*"):
        return True
    if pattern.startswith("**/"):
        return _glob(relpath, pattern[3:]) or any(
            _glob(relpath[i + 1 :], pattern[3:]) for i, ch in enumerate(relpath) if ch == "/"
        )
    return False


@dataclass
class Settings:
    """The resolved configuration of one run."""

    root: Path
    source: str  # where it came from, for error messages
    select: list[str]
    ignore: list[str]
    exclude: list[str]
    respect_gitignore: bool
    per_path_ignores: dict[str, list[str]]
    cache_dir: Path
    max_file_bytes: int
    shared: dict[str, Any]
    max_file_seconds: float = TOP_LEVEL_DEFAULTS["max-file-seconds"]
    report_unreferenced: bool = False
    rule_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    rule_paths: dict[str, list[str]] = field(default_factory=dict)
    enabled_ids: list[str] = field(default_factory=list)
    mlx_versions: dict[str, str] = field(default_factory=dict)  # package -> version set in the table
    key: str = ""  # names this configuration's result cache

    def to_json(self) -> dict[str, Any]:
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return {**data, "root": str(self.root), "cache_dir": str(self.cache_dir)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Settings:
        return cls(**{**data, "root": Path(data["root"]), "cache_dir": Path(data["cache_dir"])})

    def enabled(self, rules: list[type[Rule]]) -> list[type[Rule]]:
        return [r for r in rules if selected(r.id, self.select, self.ignore, opt_in=not r.default_enabled)]

    def options_for(self, rule: type[Rule]) -> dict[str, Any]:
        return {**self.shared, **rule.options, **self.rule_options.get(rule.id, {})}

    def applies(self, rule_id: str, relpath: str) -> bool:
        """Whether a finding of `rule_id` in `relpath` is in scope and not ignored there."""
        paths = self.rule_paths.get(rule_id)
        if paths and not matches_path(relpath, paths):
            return False
        for pattern, ids in self.per_path_ignores.items():
            if any(rule_id.startswith(i) for i in ids) and matches_path(relpath, [pattern]):
                return False
        return True


def selected(rule_id: str, select: list[str], ignore: list[str], opt_in: bool = False) -> bool:
    """Whether `rule_id` runs: its longest matching `select` prefix is longer than its longest `ignore`
    one. An opt-in rule (`Rule.default_enabled = False`) runs only when `select` names its full id."""
    if opt_in and rule_id not in select:
        return False
    if not any(rule_id.startswith(s) for s in select):
        return False
    longest_select = max(len(s) for s in select if rule_id.startswith(s))
    longest_ignore = max((len(i) for i in ignore if rule_id.startswith(i)), default=-1)
    return longest_select > longest_ignore


def find_pyproject(start: Path) -> Path | None:
    """The nearest pyproject.toml at or above `start`, preferring one with [tool.invariants]."""
    first = None
    for folder in [start, *start.parents]:
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            first = first or candidate
            try:
                if "[tool.invariants" in candidate.read_text(encoding="utf-8", errors="replace"):
                    return candidate
            except OSError:
                continue
    return first


def read(config_path: Path | None, cwd: Path) -> tuple[dict[str, Any], Path, str]:
    """The raw `[tool.invariants]` table, the project root, and where the table came from."""
    path = config_path if config_path is not None else find_pyproject(cwd)
    if path is None:
        return {}, cwd, "defaults"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file; pass an existing pyproject.toml to --config") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it ({exc}); fix the file or pass another with --config") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}); fix the syntax") from None
    tool = data.get("tool", {})
    table = tool.get("invariants", {}) if isinstance(tool, dict) else {}
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.invariants] must be a table")
    return table, path.resolve().parent, str(path)


def load(config_path: Path | None, cwd: Path, rules: list[type[Rule]], overrides: dict[str, list[str]] | None = None) -> Settings:
    """Settings from `config_path`, or from the nearest pyproject.toml, or the defaults."""
    table, root, source = read(config_path, cwd)
    return from_table(table, root, source, rules, overrides)


def load_fast(
    config_path: Path | None, cwd: Path, overrides: dict[str, list[str]] | None = None, remember: bool = True
) -> Settings:
    """Like `load`, but reuses the settings a previous run validated for this exact table.

    Validating needs the rules, and the rules need libcst: a re-run of an unchanged
    tree must not pay for that import.
    """
    from mlx_invariants.checker.cache import load_settings, save_settings

    table, root, source = read(config_path, cwd)
    key = _key(table, root, source, overrides)
    cache_dir = table.get("cache-dir", TOP_LEVEL_DEFAULTS["cache-dir"])
    folder = Path(cache_dir) if isinstance(cache_dir, str) else None
    if folder is not None and not folder.is_absolute():
        folder = root / folder
    saved = load_settings(folder, key) if folder is not None and remember else None
    if saved is not None:
        return Settings.from_json(saved)
    from mlx_invariants.checker.rules import RULES

    settings = from_table(table, root, source, RULES, overrides)
    if remember:
        save_settings(settings.cache_dir, key, settings.to_json())
    return settings


def from_table(
    table: dict[str, Any], root: Path, source: str, rules: list[type[Rule]], overrides: dict[str, list[str]] | None = None
) -> Settings:
    """Validate a `[tool.invariants]` table; every mistake names the key and the fix.

    `overrides` come from the command line: `select` replaces the table's, `ignore` adds to it.
    """
    by_id = {r.id: r for r in rules}
    values = dict(TOP_LEVEL_DEFAULTS)
    rule_options: dict[str, dict[str, Any]] = {}
    rule_paths: dict[str, list[str]] = {}
    for key, value in table.items():
        if key in by_id:
            options, paths = _rule_table(source, by_id[key], value)
            rule_options[key] = options
            if paths is not None:
                rule_paths[key] = paths
        elif key in TOP_LEVEL_DEFAULTS:
            values[key] = _typed(source, key, value, TOP_LEVEL_DEFAULTS[key])
        else:
            known = ", ".join(sorted(TOP_LEVEL_DEFAULTS))
            raise ConfigError(f"{source}: unknown key '{key}' in [tool.invariants]; known keys: {known}, or a rule id table")
    ids = [r.id for r in rules] + ["INV000", "INV001"]
    for key in ("select", "ignore"):
        check_ids(source, key, values[key], ids)
    for pattern, listed in values["per-path-ignores"].items():
        if not isinstance(listed, list) or not all(isinstance(i, str) for i in listed):
            raise ConfigError(f"{source}: per-path-ignores['{pattern}'] must be a list of rule ids")
        check_ids(source, f"per-path-ignores['{pattern}']", listed, ids)
    for key, listed in (overrides or {}).items():
        try:
            check_ids(source, key, listed, ids)
        except ConfigError as exc:
            raise UsageError(str(exc).replace(f"{source}: '{key}'", f"--{key}", 1)) from None
        values[key] = listed if key == "select" else values[key] + listed
    for key in DECLARED_ROLES:
        _check_names(source, key, values[key])
    mlx_versions = {}
    for package, key in pins.OVERRIDE_KEYS.items():
        if values[key] and release(values[key]) is None:
            raise ConfigError(f"{source}: '{key}' must be a version such as \"0.31.2\", got {values[key]!r}")
        if values[key]:
            mlx_versions[package] = values[key]
    cache_dir = Path(values["cache-dir"])
    settings = Settings(
        root=root,
        source=source,
        select=values["select"],
        ignore=values["ignore"],
        exclude=[*DEFAULT_EXCLUDE, *values["exclude"]],
        respect_gitignore=values["respect-gitignore"],
        per_path_ignores=values["per-path-ignores"],
        cache_dir=cache_dir if cache_dir.is_absolute() else root / cache_dir,
        max_file_bytes=values["max-file-bytes"],
        max_file_seconds=values["max-file-seconds"],
        report_unreferenced=values["report-unreferenced"],
        shared={k: values[k] for k in SHARED_DEFAULTS},
        rule_options=rule_options,
        rule_paths=rule_paths,
        mlx_versions=mlx_versions,
    )
    settings.enabled_ids = [r.id for r in settings.enabled(rules)]
    settings.key = _key(table, root, source, overrides)
    return settings


def _key(table: dict[str, Any], root: Path, source: str, overrides: dict[str, list[str]] | None) -> str:
    """The checker's own version and code, and this exact configuration."""
    from mlx_invariants.checker.cache import tool_fingerprint

    blob = json.dumps([table, overrides or {}, str(root), source], sort_keys=True, default=str)
    return f"{tool_fingerprint()}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def _rule_table(source: str, rule: type[Rule], value: Any) -> tuple[dict[str, Any], list[str] | None]:
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: [tool.invariants.{rule.id}] must be a table of options")
    options: dict[str, Any] = {}
    paths = None
    for key, item in value.items():
        where = f"{rule.id}.{key}"
        if key == "paths":
            paths = _typed(source, where, item, [])
        elif key in DECLARED_ROLES:
            raise ConfigError(f"{source}: '{key}' is a declared role, which the package model reads for every rule: "
                              f"set it in [tool.invariants], not in [tool.invariants.{rule.id}]")
        elif key in rule.options:
            options[key] = _typed(source, where, item, rule.options[key])
        elif key in SHARED_DEFAULTS:
            options[key] = _typed(source, where, item, SHARED_DEFAULTS[key])
        else:
            known = ", ".join(sorted([*rule.options, "paths", *SHARED_DEFAULTS]))
            raise ConfigError(f"{source}: unknown option '{key}' for {rule.id}; known options: {known}")
    return options, paths


def _typed(source: str, key: str, value: Any, default: Any) -> Any:
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, (int, float)):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
    elif isinstance(default, list):
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    elif isinstance(default, dict):
        ok = isinstance(value, dict)
    else:
        ok = isinstance(value, type(default))
    if not ok:
        kind = {bool: "true or false", int: "a non-negative number", float: "a non-negative number",
                list: "a list of strings", dict: "a table", str: "a string"}[type(default)]
        raise ConfigError(f"{source}: '{key}' must be {kind}, got {value!r}")
    return value


DECLARED_ROLES = ("owner-functions", "mlx-locks")
_NAME_GLOB = re.compile(r"[A-Za-z_*?\[][\w.*?\[\]!<>-]*")


def _check_names(source: str, key: str, names: list[str]) -> None:
    """A declared role names functions or locks by a dotted name or a glob of one."""
    for name in names:
        if not _NAME_GLOB.fullmatch(name):
            raise ConfigError(
                f"{source}: '{key}' names {name!r}, which is not a dotted name or a glob of one "
                f"(such as \"Engine._generation_loop\", \"*._worker_main\", \"self._generation_lock\")"
            )


def check_ids(source: str, key: str, ids: list[str], known: list[str]) -> None:
    for prefix in ids:
        if not any(k.startswith(prefix) for k in known):
            raise ConfigError(
                f"{source}: '{key}' names '{prefix}', which matches no rule; run `invariants rules` for the ids"
            )
