"""Planted regressions of the reference engine, written blind to the fuzzer and kept apart from the catalogue.

`regressions.REGRESSIONS` holds them as `Mutant`s; README.md says who wrote them, when, and blind to what.
Nothing here is shipped, and nothing in the package imports it: they must never become catalogue entries.
"""
