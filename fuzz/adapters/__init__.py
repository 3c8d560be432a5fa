"""Adapters: how the fuzzer drives an engine (see base.py for the protocol)."""

from mlx_invariants.fuzz.adapters.base import Adapter, Handle, Outcome
from mlx_invariants.fuzz.adapters.http import HttpAdapter, ServerProcess
from mlx_invariants.fuzz.adapters.reference import ReferenceAdapter, reference_engine

__all__ = ["Adapter", "Handle", "HttpAdapter", "Outcome", "ReferenceAdapter", "ServerProcess", "reference_engine"]
