"""Which MLX packages a checked project admits, and from which version, as its metadata declares.

Some findings are true only on some versions of MLX (`mlx_facts.py`), so a rule needs the
version the project runs on: the lowest its metadata admits, never whatever happens to be
installed where the checker runs (a pre-commit hook has no MLX at all).

A file's project is the nearest folder at or above it whose metadata names mlx, mlx-lm or
mlx-vlm, up to the top of its repository (a folder holding `.git`). Read there:
`pyproject.toml` ([project] dependencies and optional-dependencies, poetry's dependency and
group tables), `setup.cfg` ([options] install_requires, [options.extras_require]), `setup.py`
(the same keywords of a call, where they are literal lists, f-strings of module constants
included) and `requirements*.txt` (following `-r`); and a lock file (`uv.lock`, `poetry.lock`, `pdm.lock`) for a
package the metadata names without a version. A specifier is read in the grammar of
`requires-python` (`versions.py`): `mlx>=0.31.2` admits 0.31.2, `mlx==0.30.0` 0.30.0.

Which version a project admits, when it names a package several times: each requirement
set (the main dependencies; an extra or a group, with the main dependencies it comes with;
one requirements file) admits the highest floor of its unconditional lines (pip installs
what satisfies all of them), or, when every line is conditional (`; sys_platform ==
'darwin'`: one per platform), the lowest of them; the project admits the lowest floor of
its sets. A line without a version (`mlx`, `mlx-lm @ git+...`) in a set that decides makes
the version unknown, and unknown is never read as new: the findings stay.
"""

from __future__ import annotations

import ast
import configparser
import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field

from mlx_invariants.checker.versions import Release, release, release_floor

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

# The packages whose versions the facts of mlx_facts.py are stated in, with their override keys.
PACKAGES = ("mlx", "mlx-lm", "mlx-vlm")
OVERRIDE_KEYS = {"mlx": "mlx-version", "mlx-lm": "mlx-lm-version", "mlx-vlm": "mlx-vlm-version"}

_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)", re.DOTALL)
# package, floor, conditional (it has an environment marker), exact (`==X`: the one release it admits)
Line = tuple[str, "Release | None", bool, bool]
_EXACT = re.compile(r"\s*===?\s*v?\d+(?:\.\d+)*\s*$")


@dataclass(frozen=True)
class Pins:
    """The lowest version of each MLX package the project admits: a package it does not name is
    absent, one it names without a readable floor maps to None. `source` says where they came from.
    `exact`: the packages whose floor is the only release the project runs (every line naming it is an
    `==` pin, a lock file decided it, or the settings name it): a finding true only from a later release
    is untrue there (mlx_facts.py, "from:")."""

    floors: dict[str, Release | None] = field(default_factory=dict)
    source: str = ""
    exact: frozenset[str] = frozenset()

    def floor(self, package: str) -> Release | None:
        return self.floors.get(package)


def requirement(text: str) -> Line | None:
    """(package, floor, conditional) of one PEP 508 requirement of an MLX package, else None."""
    match = _REQUIREMENT.match(text)
    if match is None:
        return None
    package = re.sub(r"[-_.]+", "-", match.group(1)).lower()
    if package not in PACKAGES:
        return None
    specifier, _, marker = match.group(2).partition(";")
    specifier = specifier.strip()
    if specifier.startswith("@"):  # a URL or a commit: no version to read
        return package, None, bool(marker.strip()), False
    specifier = specifier.strip("() ")
    return package, release_floor(specifier), bool(marker.strip()), _EXACT.match(specifier) is not None


def admitted(sets: Iterable[list[Line]]) -> dict[str, Release | None]:
    """The lowest floor of each package over the requirement sets that name it (see the module doc)."""
    floors: dict[str, Release | None] = {}
    for lines in sets:
        for package in dict.fromkeys(p for p, *_ in lines):
            floor = _set_floor([(f, c) for p, f, c, _ in lines if p == package])
            if package not in floors:
                floors[package] = floor
            elif floors[package] is not None:
                floors[package] = None if floor is None else min(floors[package], floor)  # type: ignore[type-var]
    return floors


def exact(sets: Iterable[list[Line]]) -> frozenset[str]:
    """The packages every line naming them pins to one release (`mlx==0.31.1`)."""
    named: dict[str, bool] = {}
    for lines in sets:
        for package, floor, _, pinned in lines:
            named[package] = named.get(package, True) and pinned and floor is not None
    return frozenset(p for p, pinned in named.items() if pinned)


def _set_floor(lines: list[tuple[Release | None, bool]]) -> Release | None:
    plain = [f for f, conditional in lines if not conditional]
    if plain:
        known = [f for f in plain if f is not None]
        return max(known) if known else None
    floors = [f for f, _ in lines]
    return None if any(f is None for f in floors) else min(floors)  # type: ignore[type-var]


# --- the metadata files --------------------------------------------------------------------------


def _lines(items: object) -> list[Line]:
    if not isinstance(items, list):
        return []
    return [found for item in items if isinstance(item, str) and (found := requirement(item)) is not None]


def _pyproject(path: str) -> list[list[Line]]:
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except (OSError, ValueError):
        return []
    sets: list[list[Line]] = []
    project = data.get("project") if isinstance(data.get("project"), dict) else {}
    main = _lines(project.get("dependencies"))
    sets.append(main)
    extras = project.get("optional-dependencies")
    if isinstance(extras, dict):
        sets += [main + _lines(items) for items in extras.values()]
    tool = data.get("tool") if isinstance(data.get("tool"), dict) else {}
    poetry = tool.get("poetry") if isinstance(tool.get("poetry"), dict) else {}
    if poetry:
        base = _poetry(poetry.get("dependencies"))
        sets.append(base)
        groups = poetry.get("group") if isinstance(poetry.get("group"), dict) else {}
        sets += [base + _poetry(g.get("dependencies")) for g in groups.values() if isinstance(g, dict)]
    return sets


def _poetry(table: object) -> list[Line]:
    """Poetry's `name = "^0.31.2"`, `{version = "...", markers = "..."}`, or a list of those (one per
    platform); `^X` and `~X` admit X and up, a bare `X` is `==X`, `*` sets no floor."""
    if not isinstance(table, dict):
        return []
    lines: list[Line] = []
    for name, value in table.items():
        alternatives = value if isinstance(value, list) else [value]
        for item in alternatives:
            version = item.get("version", "*") if isinstance(item, dict) else item
            if not isinstance(version, str):
                continue
            conditional = len(alternatives) > 1 or (isinstance(item, dict) and bool(
                {"markers", "platform", "python"} & set(item)))
            floors = [_poetry_floor(part) for part in version.split("||")]
            floor = None if any(f is None for f in floors) else min(floors)  # type: ignore[type-var]
            found = requirement(name)
            if found is not None:
                lines.append((found[0], floor, conditional, version.strip()[:1].isdigit() or version.startswith("==")))
    return lines


def _poetry_floor(constraint: str) -> Release | None:
    constraint = constraint.strip()
    if constraint.startswith("^") or (constraint.startswith("~") and not constraint.startswith("~=")):
        constraint = ">=" + constraint[1:]
    elif constraint[:1].isdigit():
        constraint = "==" + constraint
    return release_floor(constraint.replace(" ", ","))


def _setup_cfg(path: str) -> list[list[Line]]:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError):
        return []
    main = _lines(parser.get("options", "install_requires", fallback="").splitlines())
    sets = [main]
    if parser.has_section("options.extras_require"):
        sets += [main + _lines(value.splitlines()) for _, value in parser.items("options.extras_require")]
    return sets


def _setup_py(path: str) -> list[list[Line]]:
    """install_requires and extras_require of any call in setup.py, where they are literals
    (strings, and f-strings of the module's string constants: f"mlx>={MIN_MLX_VERSION}")."""
    try:
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError, RecursionError):
        return []
    constants = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                 and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                 for t in n.targets if isinstance(t, ast.Name)}
    sets: list[list[Line]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        if "install_requires" not in keywords and "extras_require" not in keywords:
            continue
        main = _lines(_strings(keywords.get("install_requires"), constants))
        sets.append(main)
        extras = keywords.get("extras_require")
        if isinstance(extras, ast.Dict):
            sets += [main + _lines(_strings(value, constants)) for value in extras.values]
    return sets


def _strings(node: ast.expr | None, constants: dict[str, str]) -> list[str]:
    if not isinstance(node, ast.List | ast.Tuple):
        return []
    out = []
    for item in node.elts:
        if isinstance(item, ast.Constant) and isinstance(item.value, str):
            out.append(item.value)
        elif isinstance(item, ast.JoinedStr):
            parts = [p.value if isinstance(p, ast.Constant) else constants.get(p.value.id, "\0")
                     if isinstance(p, ast.FormattedValue) and isinstance(p.value, ast.Name) else "\0"
                     for p in item.values]
            if "\0" not in parts:
                out.append("".join(str(p) for p in parts))
    return out


def _requirements(path: str, seen: set[str] | None = None) -> list[Line]:
    """One requirements file, with the files it includes (`-r other.txt`)."""
    seen = seen if seen is not None else set()
    real = os.path.realpath(path)
    if real in seen:
        return []
    seen.add(real)
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return []
    lines: list[Line] = []
    for raw in text.splitlines():
        line = re.split(r"(?:^|\s)#", raw, maxsplit=1)[0].strip()
        include = re.match(r"(?:-r|--requirement)[\s=]+(\S+)", line)
        if include:
            lines += _requirements(os.path.join(os.path.dirname(path), include.group(1)), seen)
        elif line and not line.startswith("-"):
            found = requirement(line)
            if found is not None:
                lines.append(found)
    return lines


def read_folder(folder: str) -> Pins | None:
    """The pins declared by the metadata files of `folder`, or None if none of them names an MLX package."""
    sets: list[list[Line]] = []
    sources: list[str] = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return None
    for name in names:
        path = os.path.join(folder, name)
        if name == "pyproject.toml":
            found = _pyproject(path)
        elif name == "setup.cfg":
            found = _setup_cfg(path)
        elif name == "setup.py":
            found = _setup_py(path)
        elif re.fullmatch(r"requirements.*\.txt", name):
            found = [_requirements(path)]
        else:
            continue
        if any(found):
            sets += found
            sources.append(name)
    floors = admitted(sets)
    pinned = exact(sets)
    for name in _LOCKS:
        locked = _locked(os.path.join(folder, name)) if name in names else {}
        filled = {p: v for p, v in locked.items() if floors.get(p) is None}
        if filled:
            floors.update(filled)
            pinned |= set(filled)
            sources.append(name)
    return Pins(floors, ", ".join(sources), frozenset(pinned)) if floors else None


# Lock files that record the exact version a project runs with: `[[package]]` tables of name and version.
_LOCKS = ("uv.lock", "poetry.lock", "pdm.lock")


def _locked(path: str) -> dict[str, Release]:
    """The MLX packages `path` locks, at their versions. A lock decides only what the metadata leaves
    open (a package named without a version): it is what the project's own environment runs, where the
    metadata's floor is what any install of it admits."""
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except (OSError, ValueError):
        return {}
    found: dict[str, Release] = {}
    for entry in data.get("package", ()) if isinstance(data, dict) else ():
        if not isinstance(entry, dict) or not isinstance(entry.get("version"), str):
            continue
        package = re.sub(r"[-_.]+", "-", str(entry.get("name", ""))).lower()
        version = release(entry["version"]) if package in PACKAGES else None
        if version is not None:
            found[package] = min(found.get(package, version), version)
    return found


# What a generation library's own metadata requires of mlx, from the release named on: a project that admits
# only those releases and leaves mlx's version to them (names no mlx, or names it without a version) runs on
# that mlx or later, as pip resolves it. Their requirement is conditioned on macOS (`platform_system ==
# 'Darwin'`), the platform MLX serves on; a project that pins mlx itself is read by its own pin, however low
# (it may install mlx apart, on Linux). Issue 23, set j: Poppy requires mlx-lm>=0.31.3 and names no mlx, and
# its findings true only before mlx 0.31.2 were graded false.
IMPLIED: tuple[tuple[str, Release, Release, str], ...] = (
    ("mlx-lm", (0, 31, 3, 1), (0, 31, 2, 1), "mlx-lm 0.31.3's setup.py: MIN_MLX_VERSION = \"0.31.2\""),
    ("mlx-vlm", (0, 5, 0, 1), (0, 31, 2, 1), "mlx-vlm 0.5.0's requirements.txt: mlx>=0.31.2"),
)


def implied(pins: Pins) -> Pins:
    """`pins` with mlx's floor, where the project leaves it open, set to what the generation libraries it
    admits require (IMPLIED)."""
    floors = dict(pins.floors)
    reasons = []
    for package, since, mlx_floor, reason in IMPLIED:
        floor = floors.get(package)
        current = floors.get("mlx")
        if floor is not None and floor >= since and current is None:
            floors["mlx"] = mlx_floor
            reasons.append(reason)
    if not reasons:
        return pins
    return Pins(floors, "; ".join(filter(None, [pins.source, *reasons])), pins.exact)


def settled(pins: Pins, overrides: dict[str, str]) -> Pins:
    """What a project runs on: its declared pins, the settings over them, and mlx as its libraries require."""
    return implied(overridden(pins, overrides))


def overridden(pins: Pins, overrides: dict[str, str]) -> Pins:
    """`[tool.invariants] mlx-version = "0.31.2"` (and mlx-lm-version, mlx-vlm-version) over what is declared."""
    if not overrides:
        return pins
    floors = {**pins.floors, **{p: release(v) for p, v in overrides.items()}}
    keys = ", ".join(OVERRIDE_KEYS[p] for p in overrides)
    return Pins(floors, f"{keys} in [tool.invariants]" + (f"; {pins.source}" if pins.source else ""),
                pins.exact | set(overrides))


class Projects:
    """The pins of each file's project, looked up once per folder, with the configured overrides (the runner
    asks twice per file: for the facts the analysis reads, and for the findings' versions)."""

    def __init__(self, overrides: dict[str, str] | None = None) -> None:
        self.overrides = overrides or {}
        self._folders: dict[str, Pins] = {}
        self._settled: dict[str, Pins] = {}

    def of(self, path: str) -> Pins:
        folder = os.path.dirname(os.path.abspath(path))
        if folder not in self._settled:
            self._settled[folder] = settled(self._folder(folder), self.overrides)
        return self._settled[folder]

    def _folder(self, folder: str) -> Pins:
        if folder in self._folders:
            return self._folders[folder]
        found = read_folder(folder)
        if found is None:
            parent = os.path.dirname(folder)
            top = parent == folder or os.path.exists(os.path.join(folder, ".git"))
            found = Pins() if top else self._folder(parent)
        self._folders[folder] = found
        return found
