"""The locks a package holds around its MLX, inferred where the project declares none (INV125).

Servers serialize MLX with one process-wide lock (`MLX_LOCK = threading.Lock()` in a shared
module) and rarely tell a checker so. The package says it by how it uses the lock: held around
MLX that runs in Metal (a forward pass, an eval, a generation; directly, through the calls the
model resolves, or through a thread handoff awaited under it) in functions of at least two
modules (so of two families: classes, or module top levels). One module taking its own lock
around its own MLX may be guarding its own pieces against each other: omlx's scheduler holds
`_mx_buffer_access_lock` (scheduler.py@0b0b68c:170, a cache-store worker reading tensor bytes
against the scheduler's own cache clears) in a class and two module-level functions of that
one module, and judging the whole package by it gave 34 findings on start-up, shutdown and
tests, mostly false. A lock other modules import to take around their MLX is the package's
MLX lock. The owner thread's own loop is left out of the count: it runs MLX where it
belongs, whatever it holds.

A lock is known by what it is, not by its text: a module-level name of the package, followed
through imports to the module that binds it (`app.utils:MLX_LOCK`), a class's attribute
reached through the class, or a getter function of the package (`with _get_lock():`), so
`with MLX_LOCK:` in one module and `with utils.MLX_LOCK:` in another are one lock. A lock of
an instance (`self._lock = threading.Lock()`), a local or a parameter is none: the package
has one of those per object, not one for the process, and it says nothing across families.
A load lock is not an MLX lock: MLX reached only through loading weights does not count.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlx_invariants.checker.model.summary import METAL

if TYPE_CHECKING:
    from mlx_invariants.checker.model.graph import Key, Package

# The constructors of a lock that one holder at a time can take (not a semaphore of several slots).
_MUTEXES = frozenset({
    "threading.Lock()", "threading.RLock()", "asyncio.Lock()", "anyio.Lock()", "multiprocessing.Lock()",
    "multiprocessing.RLock()", "asyncio.locks.Lock()", "threading._RLock()",
})
_DEPTH = 8  # re-exports followed; deeper is a cycle
_MODULES = 2  # the modules whose functions must hold a lock around MLX for it to count as the package's MLX lock


def infer(package: Package) -> dict[str, tuple[str, list[Key]]]:
    """The package's inferred MLX locks: identity -> (the lock as first written, the functions
    that hold it around MLX), for those held so in at least two modules."""
    holders: dict[str, list[Key]] = {}
    texts: dict[str, str] = {}
    for key in sorted(package.functions):
        fn = package.functions[key]
        if not fn.guards or key in package.loaders or package.declared_owner(key) or package.owns_on_loop(key):
            continue
        for first, last, text in fn.guards:
            found = identity(package, key, text)
            if found is not None and package.runs(METAL, key, first, last):
                holders.setdefault(found, []).append(key)
                texts.setdefault(found, text)
    return {found: (texts[found], sorted(set(keys))) for found, keys in holders.items()
            if len({key[0] for key in keys}) >= _MODULES}


def identity(package: Package, key: Key, text: str) -> str | None:
    """The process-wide lock `text`, held in a `with` of function `key`, names (`app.utils:MLX_LOCK`),
    or None when it names no such lock (an instance's, a local, a parameter, one the model cannot name)."""
    memo = package.lock_identities
    if (key, text) not in memo:
        memo[(key, text)] = _identity(package, key, text)
    return memo[(key, text)]


def _identity(package: Package, key: Key, text: str) -> str | None:
    parts = text.split(".")
    if parts[0] in ("self", "cls"):
        family = package.family(key)
        if not family[1] or len(parts) != 2:
            return None  # `self.engine.lock`: another object's, which the model does not follow
        for module, cls in package.mro(family[0], family[1]):
            summary = package.summary(module)
            ref = summary.classes[cls].attrs.get(parts[1]) if summary is not None else None
            if ref is not None:
                return _imported(package, module, ref, [], 0)  # an instance's own lock: None
        return None
    fn = package.function(key)
    if fn is not None and parts[0] in fn.params:
        return None
    return _named(package, key[0], parts, 0)


def _named(package: Package, module: str, parts: list[str], depth: int) -> str | None:
    """`parts` (`MLX_LOCK`, `utils.MLX_LOCK`, `Engine._lock`) as a module-level name of `module`."""
    summary = package.summary(module)
    if summary is None or depth > _DEPTH or not parts:
        return None
    head = parts[0]
    if head in summary.functions and len(parts) == 1:
        return f"{module}:{head}"  # a getter: `with _get_lock():`
    if head in summary.classes:
        return f"{module}:{'.'.join(parts)}"  # a class's own: one for the process
    ref = summary.names.get(head)
    if ref is None:
        return None  # a local, or a name whose value the summary cannot name
    if ref in _MUTEXES:
        return f"{module}:{head}" if len(parts) == 1 else None
    return _imported(package, module, ref, parts[1:], depth + 1)


def _imported(package: Package, module: str, ref: str, rest: list[str], depth: int) -> str | None:
    """What `ref` (an import or a value, as the summary writes it) followed by `rest` names."""
    if ref.endswith("()") or depth > _DEPTH:
        return None  # a value: an instance's own lock, or the result of a call the model does not follow
    if ref.startswith(":"):
        return _named(package, module, [*ref[1:].split("."), *rest], depth + 1)
    level = len(ref) - len(ref.lstrip("."))
    names = [p for p in ref[level:].split(".") if p] + rest
    if level:
        base = module if package.modules.get(module) else module.rpartition(".")[0]
        for _ in range(level - 1):
            base = base.rpartition(".")[0]
        if not base:
            return None
    elif names and names[0] in package.modules:
        base, names = names[0], names[1:]
    else:
        return None  # outside the package
    while names and f"{base}.{names[0]}" in package.modules:
        base, names = f"{base}.{names[0]}", names[1:]
    return _named(package, base, names, depth + 1)
