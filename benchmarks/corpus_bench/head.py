"""`--head` / `--head-servers`: the checker on ten public MLX servers at recorded commits, every finding listed.

The corpus says how the checker does on known bugs; this says what it reports on
the servers' code of today, for a reviewer to judge finding by finding. Each
server's Python package is exported with `git archive` at the commit recorded in
SERVERS into a temporary folder, with the project metadata of every folder from the
repository's top down to it (pyproject.toml, setup.cfg, setup.py, requirements*.txt, lock files:
the MLX versions the server admits, which version-dependent findings are judged by)
and a `.git` folder marking that top, with a `[tool.invariants]` of its own (its own
file, `--config`) that excludes what its maintainers would (vendored third-party code,
examples, the tests kept inside the package), and checked in one `invariants check`
run per server. Each finding comes
back with the span of the def (or class, or top-level statement) around it, so that
a reviewer can be handed the finding and the code it sits in (`write_jsonl`).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from corpus_bench import mirrors
from corpus_bench.checker_at import CheckerTree
from corpus_bench.run import CRASH_MARK, open_mirrors
from corpus_bench.tools import Finding, ToolError
from mlx_invariants.checker.versions import release_text


@dataclass(frozen=True)
class Server:
    repo: str
    commit: str  # the full hash of the HEAD scored, recorded when it was fetched
    packages: tuple[str, ...]  # the folders of its Python package(s), repository paths
    exclude: tuple[str, ...] = ()  # `[tool.invariants] exclude`, relative to the repository root
    note: str = ""  # what the excludes leave out, for the doc


# Fetched 2026-11-27 (`fetch`, the newest snapshot of each default branch). Tests are not
# checked anywhere: the ones under tests/ are outside the packages, and the ones kept inside
# a package are excluded.
SERVERS: tuple[Server, ...] = (
    Server("waybarrios/vllm-mlx", "4b654c09e61029afa1c061a3684bff0d4c385b3c", ("vllm_mlx",)),
    Server("lightseekorg/smg", "73da68ca9472bbc0ff5f63d31a8a21fbb8696359",
           ("grpc_servicer/smg_grpc_servicer", "bindings/python/src/smg", "clients/python/smg_client")),
    Server("ml-explore/mlx-lm", "d78bf58e217c904ec282ed8da9b947491f78c022", ("mlx_lm",),
           ("mlx_lm/examples/",), "the example scripts shipped inside the package"),
    Server("cubist38/mlx-openai-server", "4b7d4b61586dd08b5ca1149b73003e85272ff652", ("app",)),
    Server("madroidmaq/mlx-omni-server", "4f8e9ef623808b876d2fd08df8fe11745d5a2751", ("src/mlx_omni_server",)),
    Server("arcee-ai/fastmlx", "fd37bc8f8400ce98baf601dcc9b66e14f2618382", ("fastmlx",)),
    Server("lmstudio-ai/mlx-engine", "08f0c0758a804168e258c4cfb80891a8fc9eccb1", ("mlx_engine",),
           ("mlx_engine/external/",), "Hugging Face configuration and tokenizer modules, and a copy of dill"),
    Server("exo-explore/exo", "b5375f8cee4368d09e1ce96a56b9f81fb0bc81aa", ("src/exo",),
           ("src/exo/worker/engines/mlx/vendor/", "**/tests/"),
           "the vendored encoders, which its ruff config excludes too, and the tests kept inside the package"),
    Server("Blaizzy/mlx-vlm", "9b13f522a7f1d214f426c67bb292c9e1065e9108", ("mlx_vlm",),
           ("mlx_vlm/tests/",), "its setuptools config leaves these tests out of the wheel"),
    Server("techychamp/omlx", "0b0b68c31bab6ceacb47ef762d20454fff2a71a9", ("omlx",),
           ("omlx/patches/*/vendor/", "omlx/plugins/tests/", "omlx/plugins/examples/"),
           "a vendored mlx-vlm model under `patches/`, the plugin tests and the example plugin"),
)

_SUMMARY = re.compile(r"in (\d+) files?\b")


@dataclass(frozen=True)
class Scope:
    """The code around a finding: the innermost def holding its line, else the innermost class, else the
    top-level statement; "file" (no lines) where the file does not parse."""

    kind: str  # "function", "class", "statement", "file"
    name: str | None  # the qualified name of a def or class (`Engine.step.<locals>.inner`)
    start: int | None  # first line, decorators included
    end: int | None  # last line


@dataclass(frozen=True)
class HeadRun:
    repo: str
    commit: str
    packages: tuple[str, ...]
    files: int
    findings: tuple[tuple[str, Finding], ...]  # (repository path, finding), by path then line
    exclude: tuple[str, ...] = ()
    note: str = ""
    seconds: float = 0.0  # the wall time of the checker's run on this server
    scopes: tuple[Scope, ...] = ()  # one per finding, in the same order
    pins: str = ""  # the MLX versions its metadata admits, as the checker reads them (`mlx 0.31.2, mlx-lm -`)

    def crashes(self) -> list[str]:
        return [f"{self.repo}@{self.commit} {path}: {f.message}" for path, f in self.findings
                if f.rule == "INV000" and CRASH_MARK in f.message]


def finding_ids(run: HeadRun) -> list[str]:
    """`repo:path:line:rule` of each finding, `#2`, `#3`... on a repeat of the same place and rule."""
    seen: dict[str, int] = {}
    ids = []
    for path, f in run.findings:
        base = f"{run.repo}:{path}:{f.line}:{f.rule}"
        seen[base] = seen.get(base, 0) + 1
        ids.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
    return ids


def scope_of(source: str, line: int) -> Scope:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return Scope("file", None, None, None)

    def start(node: ast.stmt) -> int:
        decorators = getattr(node, "decorator_list", [])
        return min([node.lineno, *(d.lineno for d in decorators)])

    def around(nodes: list[ast.stmt]) -> ast.stmt | None:
        for node in nodes:
            if start(node) <= line <= (node.end_lineno or node.lineno):
                return node
        return None

    best: tuple[ast.stmt, str] | None = None
    best_class: tuple[ast.stmt, str] | None = None
    top = around(tree.body)
    names: list[str] = []
    body = _flatten(tree.body)
    while True:
        node = around(body)
        if node is None:
            break
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
            name = ".".join(names)
            if isinstance(node, ast.ClassDef):
                best_class = (node, name)
            else:
                best = (node, name)
                names.append("<locals>")
        # Statements nested in if/try/with/for bodies: walked into without naming them.
        body = _flatten([child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)])
    chosen, kind = (best, "function") if best else (best_class, "class") if best_class else (None, "statement")
    if chosen is not None:
        node, name = chosen
        return Scope(kind, name, start(node), node.end_lineno or node.lineno)
    if top is not None:
        return Scope("statement", None, start(top), top.end_lineno or top.lineno)
    return Scope("statement", None, line, line)


def _flatten(nodes: list[ast.stmt]) -> list[ast.stmt]:
    """`nodes`, with the statements inside compound statements other than def and class in place of them,
    so that a def nested in an `if`, `try` or `with` is found."""
    out: list[ast.stmt] = []
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(node)
            continue
        inner = _flatten([c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)])
        for handler in getattr(node, "handlers", []):  # try/except: the handlers' bodies
            inner += _flatten(list(handler.body))
        for case in getattr(node, "cases", []):  # match
            inner += _flatten(list(case.body))
        out += inner
    return out


METADATA = re.compile(r"pyproject\.toml|setup\.cfg|setup\.py|requirements[^/]*\.txt|uv\.lock|poetry\.lock|pdm\.lock")


def _export(mirror: mirrors.Mirror, server: Server, dest: Path) -> None:
    """`git archive` of the .py/.pyi files of the server's package folders, with the `__init__.py` of each
    folder above them and the project metadata of each folder from the top down to them (only source and
    metadata files: a snapshot mirror may lack the blobs of its largest data files)."""
    def git(args: list[str], given: bytes | None = None) -> bytes:
        done = subprocess.run(["git", f"--git-dir={mirror.git_dir}", *args], input=given, capture_output=True)
        if done.returncode != 0:
            error = done.stderr.decode(errors="replace").strip().splitlines()
            raise mirrors.MirrorError(
                f"{server.repo}: `git {' '.join(args)}` failed ({error[-1] if error else done.returncode}); "
                f"the mirror may be older than the recorded commit: git --git-dir={mirror.git_dir} fetch")
        return done.stdout

    inits = list(dict.fromkeys(p for folder in server.packages for p in _parent_inits(folder)))
    listed = git(["ls-tree", "-r", "-z", "--name-only", f"{server.commit}^{{tree}}", "--", *server.packages, *inits])
    present = [p.decode(errors="surrogateescape") for p in listed.split(b"\0") if p]
    paths = [p for p in inits if p in present]
    folders = dict.fromkeys(f for folder in server.packages for f in _folders_down_to(folder))
    for folder in folders:
        listed = git(["ls-tree", "-z", "--name-only", f"{server.commit}^{{tree}}", *([f"{folder}/"] if folder else [])])
        paths += [p for p in (n.decode(errors="surrogateescape") for n in listed.split(b"\0") if n)
                  if METADATA.fullmatch(PurePosixPath(p).name)]
    # A snapshot mirror may lack a lock file's blob (they can be large): leave out the metadata it lacks.
    checked = git(["cat-file", "--batch-check"], "".join(f"{server.commit}:{p}\n" for p in paths).encode())
    paths = [p for p, line in zip(paths, checked.decode(errors="replace").splitlines()) if not line.endswith("missing")]
    for folder in server.packages:
        top = "" if folder == "." else f"{folder}/"  # ".": a project whose modules lie at the repository's top
        suffixes = sorted({s for p in present if p.startswith(top) for s in mirrors.SOURCE_SUFFIXES
                           if p.endswith(s)})
        if not suffixes:
            raise mirrors.MirrorError(f"{server.repo}: commit {server.commit} has no Python files under {folder}/")
        paths += [f":(glob){top}**/*{suffix}" for suffix in suffixes]
    dest.mkdir(parents=True)
    with tempfile.TemporaryFile() as archive:
        archive.write(git(["archive", "--format=tar", server.commit, "--", *paths]))
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, filter="data")
            else:  # pragma: no cover - a Python without extraction filters
                tar.extractall(dest)
    (dest / ".git").mkdir()  # the repository's top: the checker looks for the project's metadata up to here


def _folders_down_to(folder: str) -> list[str]:
    """The repository's top ("") and each folder down to `folder`, itself included."""
    parts = PurePosixPath(folder).parts
    return ["", *(str(PurePosixPath(*parts[:n])) for n in range(1, len(parts) + 1))]


def _parent_inits(folder: str) -> list[str]:
    parts = PurePosixPath(folder).parts
    return [f"{PurePosixPath(*parts[:n])}/__init__.py" for n in range(1, len(parts))]


def _config(server: Server) -> str:
    return "[tool.invariants]\n" + (f"exclude = {json.dumps(list(server.exclude))}\n" if server.exclude else "")


def _check(tree: Path, server: Server, checker: CheckerTree | None) -> tuple[list[tuple[str, int, int, str, str]],
                                                                             int | None, float]:
    """(path, line, col, rule, message) of each finding, the number of files checked, the wall seconds."""
    config = tree / "invariants.toml"  # beside the server's own pyproject.toml, which says what it pins
    config.write_text(_config(server), encoding="utf-8")
    args = ["check", "--format", "json", "--no-cache", "--exit-zero", "--config", str(config), *server.packages]
    if checker is None:
        cmd, env, name = [sys.executable, "-m", "mlx_invariants", *args], None, "invariants check"
    else:
        cmd, env, name = checker.command(args), checker.env(dict(os.environ)), f"invariants check at {checker.short}"
    began = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, env=env)
    except OSError as exc:
        raise ToolError(f"{name}: cannot start {cmd[0]} ({exc.strerror or exc})") from None
    seconds = time.monotonic() - began
    if done.returncode != 0:
        raise ToolError(f"{name} failed on {server.repo} (exit {done.returncode}): {done.stderr.strip()[-800:]}")
    try:
        found = [(PurePosixPath(f["path"]).as_posix(), f["line"], f.get("col", 0), f["rule"], f["message"])
                 for f in json.loads(done.stdout)]
    except (ValueError, KeyError, TypeError):
        raise ToolError(f"{name} printed JSON this benchmark cannot read on {server.repo}: "
                        f"{done.stdout[:300]!r}") from None
    counted = _SUMMARY.findall(done.stderr)
    return found, int(counted[-1]) if counted else None, seconds


def run_head(mirror_root: Path, servers: tuple[Server, ...] | list[Server] = SERVERS,
             checker: CheckerTree | None = None) -> list[HeadRun]:
    """Each server's package at its recorded commit, checked; findings by path, then line."""
    opened = open_mirrors(mirror_root, {s.repo for s in servers})  # every missing mirror named at once
    runs = []
    with tempfile.TemporaryDirectory(prefix="invariants-corpus-head-") as tmp:
        root = Path(tmp).resolve()
        for index, server in enumerate(servers):
            tree = root / f"{index:02d}-{server.repo.replace('/', '+')}"
            _export(opened[server.repo], server, tree)
            found, files, seconds = _check(tree, server, checker)
            if files is None:  # a checker that prints no summary: every source file of the packages
                files = sum(1 for p in server.packages for f in (tree / p).rglob("*")
                            if f.suffix in mirrors.SOURCE_SUFFIXES and f.is_file())
            found.sort(key=lambda item: (item[0], item[1], item[3], item[4]))
            sources: dict[str, str] = {}
            scopes = []
            for path, line, _, _, _ in found:
                if path not in sources:
                    try:
                        sources[path] = (tree / path).read_text(encoding="utf-8", errors="replace")
                    except OSError:
                        sources[path] = ""
                scopes.append(scope_of(sources[path], line))
            listed = tuple((path, Finding(line, rule, message)) for path, line, _, rule, message in found)
            runs.append(HeadRun(server.repo, server.commit, server.packages, files, listed, server.exclude,
                                server.note, seconds, tuple(scopes), _pins(tree, server)))
    return runs


def _pins(tree: Path, server: Server) -> str:
    """The MLX versions the metadata above each package folder admits, as this checkout's checker reads them."""
    from mlx_invariants.checker import pins

    found = []
    for folder in server.packages:
        project = pins.Projects().of(str(tree / folder / "__init__.py"))
        named = ", ".join(f"{p} {release_text(f) if f else 'unpinned'}" for p, f in project.floors.items())
        found.append(f"{named} ({project.source})" if named else "none declared")
    return "; ".join(dict.fromkeys(found))


def records(runs: list[HeadRun], checker: CheckerTree | None = None) -> list[dict]:
    """One JSON object per finding: where it is, what it says, and the span of the code around it."""
    out = []
    for run in runs:
        scopes = run.scopes or tuple(Scope("file", None, None, None) for _ in run.findings)
        for fid, (path, f), scope in zip(finding_ids(run), run.findings, scopes):
            out.append({"id": fid, "repo": run.repo, "commit": run.commit, "path": path, "line": f.line,
                        "rule": f.rule, "message": f.message, "scope": scope.kind, "function": scope.name,
                        "start": scope.start, "end": scope.end,
                        "checker": None if checker is None else checker.commit})
    return out


def write_jsonl(path: Path, runs: list[HeadRun], checker: CheckerTree | None = None) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records(runs, checker)),
                    encoding="utf-8")
