"""The OpenAI-compatible HTTP server around a reference engine (docs/http.md). Imports Starlette and uvicorn."""

from engine.http.app import build_app
from engine.http.errors import ApiError
from engine.http.server import Server, run_until_stopped

__all__ = ["ApiError", "Server", "build_app", "run_until_stopped"]
