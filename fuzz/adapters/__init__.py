"""Adapters: how the fuzzer drives an engine (see base.py for the protocol)."""
