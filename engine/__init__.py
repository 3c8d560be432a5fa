"""The reference engine: one MLX owner thread per engine, a serialized and a batched route.

Importing this package loads no MLX; the owner thread imports it when it starts.
"""

from mlx_invariants.engine.base import Engine, EngineConfig
from mlx_invariants.engine.batched import BatchedEngine
from mlx_invariants.engine.errors import Busy, EngineError, InvalidRequest, ShuttingDown, StartupError
from mlx_invariants.engine.messages import Failed, Finished, Pending, SamplingParams, Token
from mlx_invariants.engine.model import tiny_model_path
from mlx_invariants.engine.points import Point, Side
from mlx_invariants.engine.points import set_hook as set_point_hook
from mlx_invariants.engine.serial import SimpleEngine
from mlx_invariants.engine.stream import RequestStream

ENGINES = {"simple": SimpleEngine, "batched": BatchedEngine}

__all__ = [
    "BatchedEngine", "Busy", "ENGINES", "Engine", "EngineConfig", "EngineError", "Failed", "Finished",
    "InvalidRequest", "Pending", "Point", "RequestStream", "SamplingParams", "ShuttingDown", "Side", "SimpleEngine",
    "StartupError", "Token", "set_point_hook", "tiny_model_path",
]
