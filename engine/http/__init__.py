"""The OpenAI-compatible HTTP server around a reference engine (docs/http.md). Imports Starlette and uvicorn."""

from mlx_invariants.engine.http.app import build_app
from mlx_invariants.engine.http.errors import ApiError
from mlx_invariants.engine.http.server import Server, run_until_stopped

__all__ = ["ApiError", "Server", "build_app", "run_until_stopped"]
