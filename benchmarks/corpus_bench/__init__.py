"""The real-bug corpus benchmark behind `benchmarks/corpus.py` (docs/corpus.md).

The checker was built from this project's own fixtures; this asks how it does on
historical concurrency bugs of real MLX servers, scored exactly as the corpus
defines it so that figures from different runs and tools compare.
"""
