"""loop_blocked_by_request.py tells a server whose event loop a generation holds from one whose loop stays free.

Its verdict alone runs in the default suite; the servers (tests/zoo/loop_server.py generating on its loop and
in a thread, and mlx-lm's own server) run nightly with the other reproducers (`pytest -m slow`): their
verdicts are timings of a real generation, which a loaded CI box is no place for.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from zoo.run import REPRODUCERS

SCRIPT = REPRODUCERS / "loop_blocked_by_request.py"
SERVER = Path(__file__).with_name("loop_server.py")


def _reproducer():
    spec = importlib.util.spec_from_file_location("loop_blocked", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("request_s, sent_s, answered_s, expected", [
    (2.0, 0.5, 2.0, 1),     # the GET came back with the generation's answer
    (2.0, 0.5, 1.85, 1),    # ...a little before it
    (2.0, 0.5, 0.52, 0),    # answered at once
    (2.0, 0.5, 1.0, 2),     # waited a quarter of the request: neither
    (2.0, 0.5, 1.5, 2),     # waited half, but came back well before the answer: neither
], ids=["with-answer", "just-before", "at-once", "quarter", "half-early"])
def test_verdict(request_s, sent_s, answered_s, expected):
    assert _reproducer().verdict(request_s, sent_s, answered_s) == expected


def _run(model_field: str, *server: str) -> subprocess.CompletedProcess:
    from mlx_invariants.engine import tiny_model_path

    command = [part.replace("{model}", str(tiny_model_path())) for part in server]
    return subprocess.run([sys.executable, str(SCRIPT), "--model", model_field, "--tokens", "400", "--", *command],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("flags, expected", [((), 1), (("--offload",), 0)], ids=["on-loop", "offloaded"])
def test_a_route_generating_on_its_loop_is_shown(flags, expected):
    result = _run("tiny", sys.executable, str(SERVER), "{model}", "{port}", *flags)
    assert result.returncode == expected, result.stdout + result.stderr


@pytest.mark.slow
def test_mlx_lm_server_answers_while_it_generates():
    """Another style: a ThreadingHTTPServer in front of one generation thread (mlx-lm 0.32)."""
    server = Path(sys.executable).with_name("mlx_lm.server")
    result = _run("default_model", str(server), "--model", "{model}", "--host", "127.0.0.1", "--port", "{port}")
    assert result.returncode == 0, result.stdout + result.stderr
