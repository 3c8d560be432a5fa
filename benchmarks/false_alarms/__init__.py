"""Correct MLX serving engines in the styles real projects use, each with a buggy twin one mistake away.

`pairs.PAIRS` lists them; benchmarks/bench_false_alarms.py fuzzes every one. Nothing here is shipped.
"""
