"""The package model: what crosses modules, for the rules that need more than one file.

`collect.summarize` reads one file into a `summary.FileSummary` (plain values, cached by
content hash); `graph.Package` joins the summaries of one package and works out which
functions reach MLX and through which calls; `queries` asks it for findings (INV108, INV107);
`phase` is the step of `invariants check` that runs all of it after the per-file rules.
"""
