"""Installs the MLX sentinel in a process started with this folder on PYTHONPATH.

The fuzz runner sets MLX_INVARIANTS_SENTINEL to a JSON object: {"out": file,
"owner": glob or "sticky" or null, "strict": bool, "targets": [...] or null,
"observe": bool (default true), "control": file or absent,
"packages": [[name, [folder, ...]], ...]} (`fuzz/injection.py` writes it).
The packages are loaded from those folders, parents first, so the child needs
no other entry on its path to import the sentinel.
Every finished MLX span (with the process's threads and MLX active memory
at its entry) and every "no Stream" error is appended to `out` as one JSON
line, and so (with "observe") is every lock, thread-work and cancellation
event of the drop-in observation, so the runner sees violations inside a
server nobody here wrote. With "control", the sentinel's worker switch listens on
127.0.0.1 and writes its port to that file: the fuzzer arms worker faults there
(fuzz/worker_switch.py). A sitecustomize further down sys.path still runs afterwards.
"""

import json
import os
import sys


def _install() -> None:
    raw = os.environ.get("MLX_INVARIANTS_SENTINEL")
    if not raw:
        return
    config = json.loads(raw)
    try:
        _load_packages(config.get("packages") or [])
        from mlx_invariants.fuzz.sentinel import DEFAULT_TARGETS, Sentinel, file_emitter
        from mlx_invariants.fuzz.trace import Trace
        from mlx_invariants.fuzz.worker_switch import WorkerSwitch
    except ImportError as exc:
        with open(config["out"], "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"injection_error": f"cannot import the fuzz package: {exc}"}) + "\n")
        return
    switch = None
    if config.get("control"):
        switch = WorkerSwitch()
        switch.start(config["control"])
    sentinel = Sentinel(config.get("targets") or DEFAULT_TARGETS, owner=config.get("owner"),
                        strict=bool(config.get("strict")), trace=Trace(keep=False),
                        emit=file_emitter(config["out"]), observe=config.get("observe", True),
                        sample_rest=True, switch=switch)
    sentinel.install()
    sys.modules[__name__].sentinel = sentinel


def _load_packages(packages: list) -> None:
    """Import each named package from its folders, so its submodules resolve there."""
    import importlib.util

    for name, folders in packages:
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, os.path.join(folders[0], "__init__.py"),
                                                      submodule_search_locations=folders)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)


def _chain() -> None:
    """Run the sitecustomize this one shadows, if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    me = sys.modules.pop(__name__)
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        import sitecustomize  # noqa: F401  (the next one on the path)
    except ImportError:
        # None further down: the import of this one, still finishing, expects to find itself.
        sys.modules[__name__] = me
    finally:
        sys.path[:] = saved


_install()
_chain()
