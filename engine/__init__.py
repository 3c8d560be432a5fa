"""The reference engine: one MLX owner thread per engine, a serialized and a batched route.

Importing this package loads no MLX; the owner thread imports it when it starts.
"""

from engine.base import Engine, EngineConfig
from engine.batched import BatchedEngine
from engine.errors import Busy, EngineError, InvalidRequest, ShuttingDown, StartupError
from engine.messages import Failed, Finished, Pending, SamplingParams, Token
from engine.model import tiny_model_path
from engine.points import Point
from engine.serial import SimpleEngine
from engine.stream import RequestStream

ENGINES = {"simple": SimpleEngine, "batched": BatchedEngine}

__all__ = [
    "BatchedEngine", "Busy", "ENGINES", "Engine", "EngineConfig", "EngineError", "Failed", "Finished",
    "InvalidRequest", "Pending", "Point", "RequestStream", "SamplingParams", "ShuttingDown", "SimpleEngine",
    "StartupError", "Token", "tiny_model_path",
]
