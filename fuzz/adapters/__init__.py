"""Adapters: how the fuzzer drives an engine (see base.py for the protocol)."""

from mlx_invariants.fuzz.adapters.base import Adapter, Handle, Outcome, Refused
from mlx_invariants.fuzz.adapters.http import HttpAdapter, ServerProcess, http_engine
from mlx_invariants.fuzz.adapters.reference import ReferenceAdapter, reference_engine

__all__ = ["Adapter", "Handle", "HttpAdapter", "Outcome", "ReferenceAdapter", "Refused", "ServerProcess",
           "http_engine", "reference_engine"]
